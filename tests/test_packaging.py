"""The package stands alone: `python -m build` makes a wheel and an sdist, each installs into a clean venv (with its
dependencies, from whatever index pip is configured with: PyPI in CI, a mirror offline) and runs from there, away
from this checkout: `demo` serves the log bundled in the package, `dump` reads it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_port
from prometheus_client.parser import text_string_to_metric_families
from support.loopback import scrape_until

from exporter import __version__

# what a build must not take from a working tree: the VCS, venvs, caches, earlier builds, benchmark output
_SKIP = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}


def _ignore(folder: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n in _SKIP or n.endswith(".egg-info")}
    if Path(folder) == REPO / "bench":
        skip.add("out")
    return skip


def _env() -> dict[str, str]:
    """This process's environment without what would make a child import this checkout or read our settings."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("POSTTRAIN_")}


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The wheel and sdist `python -m build` makes of a copy of this tree (the build writes egg-info into its
    source folder, which must not be the checkout others work in)."""
    root = tmp_path_factory.mktemp("build")
    src = root / "src"
    shutil.copytree(REPO, src, ignore=_ignore)
    _run([sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(src)], root, 600)
    wheels, sdists = list((root / "dist").glob("*.whl")), list((root / "dist").glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list((root / "dist").iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def _installed(artifact: Path, venv: Path) -> Path:
    """A fresh venv (no system site-packages, nothing of ours) with the artifact and its dependencies; its bin/."""
    _run([sys.executable, "-m", "venv", str(venv)], venv.parent, 120)
    bin_ = venv / "bin"
    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(artifact)],
         venv.parent, 600)
    return bin_


def _samples(text: str, name: str) -> dict[str, float]:
    return {s.labels.get("run", ""): s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_built_package_installs_and_runs_in_a_clean_venv(dist: dict[str, Path], tmp_path: Path, kind: str) -> None:
    bin_ = _installed(dist[kind], tmp_path / "venv")
    away = tmp_path / "elsewhere"  # not the checkout: `import exporter` must find the installed package
    away.mkdir()
    where = _run([str(bin_ / "python"), "-c", "import exporter, sys; print(exporter.__file__)"], away, 60).stdout
    assert Path(where.strip()).is_relative_to(tmp_path / "venv"), where
    assert _run([str(bin_ / "posttrain-exporter"), "--version"], away, 60).stdout.strip() == \
        f"posttrain-exporter {__version__}"

    # dump: the log the package carries (exporter/data), read to its end
    bundled = next((tmp_path / "venv" / "lib").glob("python3*/site-packages/exporter/data/grpo_demo.log"))
    out = _run([str(bin_ / "posttrain-exporter"), "dump", "--no-gpu", str(bundled)], away, 120).stdout
    assert _samples(out, "posttrain_step") == {"grpo_demo": 300.0}
    assert "posttrain_reward_std" in out and "posttrain_kl" in out

    # demo: the README's main command, one pass at a quick pace, scraped over HTTP, stopped as a pod is (SIGTERM)
    port = free_port()
    proc = subprocess.Popen([str(bin_ / "posttrain-exporter"), "demo", "--once", "--steps-per-second", "1000",
                             "--web.listen-address", f"127.0.0.1:{port}"], cwd=away, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        body = scrape_until(port, lambda b: _samples(b, "posttrain_step").get("demo-grpo") == 300.0, proc, 60)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert _samples(body, "posttrain_step") == {"demo-grpo": 300.0}, err.decode()
    assert proc.returncode == 0, err.decode()
    assert "msg=\"demo: replaying a real TRL GRPO log" in err.decode()  # logfmt, the default
