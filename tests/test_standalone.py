"""A plain clone stands alone: no tracked file reads the workspace beside the repository or names a path of the
machine it was made on (the corpus provenance writes its scratch folder as $WORK, scripts/corpus/collect.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import REPO


def test_no_tracked_file_names_a_path_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    beside = str(REPO.parent).encode() + b"/"  # the folder holding this checkout, e.g. a workspace's shared/
    workspace = b".." + b"/shared"
    # a checkout made in /tmp (or /): every /tmp/ an example names would read as the folder beside it
    needles = [workspace] if str(REPO.parent) in ("/", "/tmp") else [beside, workspace]
    found = []
    for name in files.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # a binary file (a picture, an event file)
            continue
        found += [f"{name}: {needle.decode()}" for needle in needles if needle in data]
    assert not found, found


def test_the_slow_list_names_tests_that_exist() -> None:
    """conftest's SLOW_MODULES and SLOW_TESTS (the fast subset leaves them out) name real modules and tests: a
    renamed test would otherwise move into the fast subset, or a removed one linger, without a word."""
    import ast

    from conftest import SLOW_MODULES, SLOW_TESTS

    here = Path(__file__).resolve().parent
    for module in SLOW_MODULES:
        assert (here / f"{module}.py").exists(), module
    for test in SLOW_TESTS:
        file, name = test.split("::")
        tree = ast.parse((here / file).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, test
