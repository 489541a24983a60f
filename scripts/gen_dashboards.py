"""Write the Grafana boards in grafana/ from exporter/dashboards/ (one per method, plus GPU).

    python scripts/gen_dashboards.py           # write grafana/*.json
    python scripts/gen_dashboards.py --check   # exit 1 when a committed file is out of date

tests/test_dashboards.py runs every query of every panel against a real Prometheus scraping the exporter on the
real TRL fixtures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.dashboards import render

OUT = Path(__file__).resolve().parent.parent / "grafana"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when grafana/*.json is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name, content in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != content:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(content)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/gen_dashboards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
