"""Copy the one source of the chart's rules and dashboards into the chart.

rules/*.yml -> helm/posttrain-exporter/rules/ and grafana/*.json -> helm/posttrain-exporter/dashboards/,
byte for byte (Helm reads files only inside the chart's folder). Stale copies are removed. The chart's
templates read them with .Files.Get, never through tpl, so the Prometheus templates in the alerts'
annotations need no escaping.

    python scripts/sync_chart.py           # update the copies
    python scripts/sync_chart.py --check   # exit 1 and list the differences (tests/test_helm.py checks too)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "posttrain-exporter"
# (source folder, glob, folder in the chart)
COPIES = [(REPO / "rules", "*.yml", CHART / "rules"), (REPO / "grafana", "*.json", CHART / "dashboards")]


def differences() -> list[tuple[str, Path, Path | None]]:
    """(what, chart copy, source) for every copy that is missing, different or stale."""
    out: list[tuple[str, Path, Path | None]] = []
    for src_dir, pattern, dst_dir in COPIES:
        sources = {p.name: p for p in sorted(src_dir.glob(pattern))}
        copies = {p.name: p for p in sorted(dst_dir.glob(pattern))} if dst_dir.is_dir() else {}
        for name, src in sources.items():
            dst = dst_dir / name
            if name not in copies:
                out.append(("missing", dst, src))
            elif dst.read_bytes() != src.read_bytes():
                out.append(("differs", dst, src))
        out.extend(("stale", copies[name], None) for name in copies.keys() - sources.keys())
    return out


def sync() -> list[tuple[str, Path, Path | None]]:
    diffs = differences()
    for what, dst, src in diffs:
        if what == "stale":
            dst.unlink()
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    for _, _, dst_dir in COPIES:
        dst_dir.mkdir(parents=True, exist_ok=True)
        # Keep the (possibly empty) folder in git; Helm ignores it (templates glob *.yml / *.json only).
        (dst_dir / ".gitkeep").touch()
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a copy is out of date")
    args = ap.parse_args(argv)
    diffs = differences() if args.check else sync()
    for what, dst, src in diffs:
        rel = dst.relative_to(REPO)
        print(f"{what}: {rel}" + (f" (from {src.relative_to(REPO)})" if src else ""))
    if args.check and diffs:
        print("the chart's copies are out of date: run python scripts/sync_chart.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
