"""`posttrain-exporter report LOG...`: read logs once, judge each run, print or write the verdicts.

The exit code can carry the verdict (--fail-on), so a training pipeline's CI can stop on a bad run."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.report import FAIL_ON as FAIL_ON
from exporter.report import FORMATS as FORMATS
from exporter.report.digest import HISTORY_POINTS, RunDigest
from exporter.report.html import to_html
from exporter.report.progress import ReadProgress
from exporter.report.text import to_json, to_text
from exporter.report.verdict import RunVerdict, judge
from exporter.runbooks import RUNBOOK_BASE

EXIT_FAILED = 1


def verdicts(cfg: Config, specs: list[LogSpec], runbook_base: str = RUNBOOK_BASE) -> list[RunVerdict]:
    # The whole run is seen through a digest that keeps what the report needs as the log is read (its memory does
    # not grow with the run); the series keep enough points between two batches for it.
    cfg = dataclasses.replace(cfg, limits=dataclasses.replace(
        cfg.limits, history_limit=max(cfg.limits.history_limit, HISTORY_POINTS)))
    exporter = Exporter(cfg, specs)
    digests = {}
    for name, run in exporter.runs.items():
        digests[name] = RunDigest()
        run.watchers.append(digests[name])
    progress = ReadProgress.for_terminal(sys.stderr, [s.path for s in specs],
                                         lambda: sum(inp.follow.bytes_read for inp in exporter.inputs))
    exporter.read_to_end(progress.tick if progress else None)
    if progress:
        progress.done()
    return [judge(run, runbook_base, digests.get(name)) for name, run in exporter.runs.items()]


def render(found: list[RunVerdict], fmt: str) -> str:
    return {"text": to_text, "json": to_json, "html": to_html}[fmt](found)


def failed(found: list[RunVerdict], fail_on: str | None) -> bool:
    """Whether a finding at or above `fail_on` exists (critical: pages only; warning: pages or warnings)."""
    if fail_on is None:
        return False
    levels = {"critical"} if fail_on == "critical" else {"critical", "warning"}
    return any(f.severity in levels for v in found for f in v.findings)


def run_report(cfg: Config, specs: list[LogSpec], fmt: str, out: Path | None, fail_on: str | None,
               runbook_base: str = RUNBOOK_BASE) -> int:
    found = verdicts(cfg, specs, runbook_base)
    text = render(found, fmt)
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        out.write_text(text, encoding="utf-8")
    return EXIT_FAILED if failed(found, fail_on) else 0
