"""The release path: one place names the version and the project's home (exporter/buildinfo.py), a tag writes the
version everywhere (scripts/set_version.py), and the release workflow passes actionlint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_binary

from exporter import buildinfo

CHART = REPO / "helm" / "posttrain-exporter"
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def _chart_versions(root: Path) -> dict[str, str]:
    chart = yaml.safe_load((root / "helm/posttrain-exporter/Chart.yaml").read_text())
    values = yaml.safe_load((root / "helm/posttrain-exporter/values.yaml").read_text())
    found = {"chart": chart["version"], "appVersion": chart["appVersion"], "image": values["image"]["tag"]}
    for ex in ("job", "jobset", "pytorchjob", "rayjob"):
        deps = yaml.safe_load((root / f"helm/examples/{ex}/Chart.yaml").read_text())["dependencies"]
        found[ex] = next(d["version"] for d in deps if d["name"] == "posttrain-exporter")
    readme = (root / "helm/posttrain-exporter/README.md").read_text()
    found["chart README"] = re.search(r"- name: posttrain-exporter\n\s+version: (\S+)", readme)[1]
    return found


def test_one_version_everywhere() -> None:
    assert set(_chart_versions(REPO).values()) == {buildinfo.VERSION}


def test_one_home_everywhere() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"] == buildinfo.HOME
    assert buildinfo.HOME in chart["sources"]
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Homepage"] == buildinfo.HOME
    image = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    for wf in WORKFLOWS:
        env = yaml.safe_load(wf.read_text()).get("env", {})
        if "IMAGE" in env:
            assert env["IMAGE"] == image, f"{wf.name} pushes an image the chart does not pull"
    # the runbooks a version's alerts link to are that version's
    from exporter.runbooks import RUNBOOK_BASE

    assert f"{buildinfo.HOME}/blob/v{buildinfo.VERSION}/docs/runbooks.md" == RUNBOOK_BASE
    rules = (REPO / "rules" / "posttrain.alerts.yml").read_text()
    links = set(re.findall(r"runbook_url: (\S+)#", rules))
    assert links == {RUNBOOK_BASE}


def test_a_tag_writes_the_version_everywhere(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "build", "image", "*.egg-info",
                                                               "__pycache__", "tests"))
    r = subprocess.run([sys.executable, "scripts/set_version.py", "v2.3.4-rc.1", "0123456789abcdef"],
                       cwd=copy, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "2.3.4-rc.1"
    assert set(_chart_versions(copy).values()) == {"2.3.4-rc.1"}
    info = (copy / "exporter" / "buildinfo.py").read_text()
    assert 'VERSION = "2.3.4-rc.1"' in info and 'REVISION = "0123456789abcdef"' in info
    rules = (copy / "rules" / "posttrain.alerts.yml").read_text()
    assert f"{buildinfo.HOME}/blob/v2.3.4-rc.1/docs/runbooks.md#" in rules
    assert f"/blob/v{buildinfo.VERSION}/" not in rules


@pytest.mark.parametrize("tag", ["2.3", "latest", "v1.2.3; rm -rf /"])
def test_a_tag_that_is_no_version_is_refused(tmp_path: Path, tag: str) -> None:
    r = subprocess.run([sys.executable, str(REPO / "scripts/set_version.py"), tag, "--root", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "is not a version tag" in r.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow: Path) -> None:
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or require_binary("actionlint")
    require_binary("shellcheck")  # without it actionlint skips the `run:` scripts silently
    r = subprocess.run([exe, str(workflow)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint_finds_a_broken_workflow(tmp_path: Path) -> None:
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or require_binary("actionlint")
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - run: echo ${{ github.nope }}\n")
    r = subprocess.run([exe, str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
