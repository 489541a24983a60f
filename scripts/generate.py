"""Regenerate every artefact made from the code, in dependency order, or check that none is stale.

    python scripts/generate.py           # rules/, grafana/, docs/metrics.md, gpu.md's table, chart copies
    python scripts/generate.py --check   # change nothing; exit 1 naming each stale artefact (tests run this)

Each step is its own generator (scripts/gen_rules.py, scripts/gen_dashboards.py, exporter/metricdoc.py,
exporter/gpu/fields.py, scripts/sync_chart.py); this only orders them, since the chart copies what the first two
write.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METRICS_DOC = REPO / "docs" / "metrics.md"
GPU_DOC = REPO / "docs" / "gpu.md"


def _current(path: Path, text: str, check: bool) -> bool:
    """True when `path` holds `text` (check), or once it is written (not check)."""
    if check:
        return path.read_text(encoding="utf-8") == text
    path.write_text(text, encoding="utf-8")
    return True


def _metrics_doc(check: bool) -> bool:
    """True when docs/metrics.md is (now) current."""
    sys.path.insert(0, str(REPO))
    from exporter.metricdoc import render

    return _current(METRICS_DOC, render(), check)


def _gpu_doc(check: bool) -> bool:
    """True when docs/gpu.md's field table (between its markers) is (now) the one exporter/gpu/fields.py renders."""
    sys.path.insert(0, str(REPO))
    from exporter.gpu.fields import render_doc

    return _current(GPU_DOC, render_doc(GPU_DOC.read_text(encoding="utf-8")), check)


# (what it makes, its generator: a script, or a function of `check`); the chart's copies come last because they
# copy rules/ and grafana/.
STEPS = (("rules/", "scripts/gen_rules.py"), ("grafana/", "scripts/gen_dashboards.py"),
         ("docs/metrics.md", _metrics_doc), ("docs/gpu.md's field table", _gpu_doc),
         ("the chart's copies", "scripts/sync_chart.py"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when something is stale")
    args = ap.parse_args(argv)
    stale = []
    for what, script in STEPS:
        if callable(script):
            ok = script(args.check)
        else:
            cmd = [sys.executable, script] + (["--check"] if args.check else [])
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            ok = done.returncode == 0
            if not ok:
                sys.stderr.write(done.stdout + done.stderr)
        if not ok:
            stale.append(what)
    if stale:
        verb = "stale" if args.check else "failed"
        print(f"{verb}: {', '.join(stale)}" + ("; run python scripts/generate.py" if args.check else ""),
              file=sys.stderr)
        return 1
    print("all generated artefacts current" if args.check else "regenerated everything")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
