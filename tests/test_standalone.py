"""A plain clone stands alone: no tracked file reads the workspace beside the repository or names a path of the
machine it was made on (the corpus provenance writes its scratch folder as $WORK, scripts/corpus/collect.py)."""

from __future__ import annotations

import subprocess

from conftest import REPO


def test_no_tracked_file_names_a_path_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    beside = str(REPO.parent).encode() + b"/"  # the folder holding this checkout, e.g. a workspace's shared/
    workspace = b".." + b"/shared"
    found = []
    for name in files.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # a binary file (a picture, an event file)
            continue
        found += [f"{name}: {needle.decode()}" for needle in (beside, workspace) if needle in data]
    assert not found, found
