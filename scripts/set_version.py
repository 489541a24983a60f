"""Writes a release's version and revision everywhere they appear, from the one place that names them.

    python scripts/set_version.py v0.2.0 0123abc...   # the tag (with or without its v) and the commit

exporter/buildinfo.py gets VERSION and REVISION (pyproject.toml reads the version from there; the runbook links
follow it); the chart gets version, appVersion and its image tag; the examples and the chart's README depend on
that chart version. Then the generated artefacts (the rules' runbook links) are regenerated, which needs the
exporter's dependencies installed (pip install -e .). The release workflow
(.github/workflows/release.yml) runs it before building anything; tests/test_release.py runs it on a copy."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEMVER = re.compile(r"v?(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)")
CHART = Path("helm/posttrain-exporter")

# (file, pattern whose group 1 is replaced by the version)
VERSION_SITES: list[tuple[str, str]] = [
    ("exporter/buildinfo.py", r'^VERSION = "([^"]*)"'),
    (f"{CHART}/Chart.yaml", r"^version: (\S+)"),
    (f"{CHART}/Chart.yaml", r'^appVersion: "([^"]*)"'),
    (f"{CHART}/values.yaml", r'^  tag: "([^"]*)"'),
    (f"{CHART}/README.md", r"- name: posttrain-exporter\n    version: (\S+)"),
    *[(f"helm/examples/{ex}/Chart.yaml", r"- name: posttrain-exporter\n    version: (\S+)")
      for ex in ("job", "jobset", "pytorchjob", "rayjob")],
]


def _replace(path: Path, pattern: str, value: str) -> None:
    text = path.read_text(encoding="utf-8")
    m = re.search(pattern, text, flags=re.M)
    if m is None:
        raise SystemExit(f"set_version: {path}: no match for {pattern!r}: the file changed shape, update VERSION_SITES")
    path.write_text(text[:m.start(1)] + value + text[m.end(1):], encoding="utf-8")


def set_version(root: Path, tag: str, revision: str) -> str:
    m = SEMVER.fullmatch(tag)
    if m is None:
        raise SystemExit(f"set_version: {tag!r} is not a version tag (vMAJOR.MINOR.PATCH[-PRERELEASE])")
    if revision and not re.fullmatch(r"[0-9a-f]{7,40}", revision):
        raise SystemExit(f"set_version: {revision!r} is not a commit hash")
    version = m.group(1)
    for rel, pattern in VERSION_SITES:
        _replace(root / rel, pattern, version)
    _replace(root / "exporter/buildinfo.py", r'^REVISION = "([^"]*)"', revision)
    return version


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tag", help="the release tag, e.g. v0.2.0")
    ap.add_argument("revision", nargs="?", default="", help="the commit the release is built from")
    ap.add_argument("--root", type=Path, default=REPO, help="the checkout to rewrite (default: this one)")
    args = ap.parse_args()
    version = set_version(args.root, args.tag, args.revision)
    # the generators import the package of the checkout being rewritten, not one installed elsewhere
    env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
    subprocess.run([sys.executable, str(args.root / "scripts" / "generate.py")], check=True, cwd=args.root, env=env)
    print(version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
