"""Write rules/posttrain.alerts.yml and rules/posttrain.recording.yml from the detector table.

    python scripts/gen_rules.py            # rewrite them
    python scripts/gen_rules.py --check    # exit 1 when they are stale (tests/test_rules.py checks too)
    python scripts/gen_rules.py --runbook-base https://wiki.example.com/posttrain --out /tmp/rules
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.alerting.rules import RUNBOOK_BASE, RulesSettings, alert_groups, recording_groups, render

RULES = Path(__file__).resolve().parent.parent / "rules"


def generated(settings: RulesSettings) -> dict[str, str]:
    return {"posttrain.alerts.yml": render(alert_groups(settings)),
            "posttrain.recording.yml": render(recording_groups(settings))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--runbook-base", default=RUNBOOK_BASE, help="the runbooks' URL, without the #anchor")
    ap.add_argument("--out", type=Path, default=RULES)
    args = ap.parse_args()
    files = generated(RulesSettings(runbook_base=args.runbook_base))
    if args.check:
        stale = [n for n, text in files.items() if not (args.out / n).exists() or (args.out / n).read_text() != text]
        for n in stale:
            print(f"stale: {args.out / n} (run python scripts/gen_rules.py)", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for n, text in files.items():
        (args.out / n).write_text(text)
        print(f"wrote {args.out / n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
