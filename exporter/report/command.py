"""`posttrain-exporter report LOG...`: read logs once, judge each run, print or write the verdicts.

The exit code can carry the verdict (--fail-on), so a training pipeline's CI can stop on a bad run: 1 when a run has
a finding at or above the level, else 4 when a run's trainer died (verdict crashed, whatever the level), else 3 when
a run has no training record at all (whatever the level: a gate pointed at the wrong file, or at a trainer that logs
elsewhere, must not pass), else 5 when a run is not learning its task (verdict not_learning) at --fail-on
not_learning or warning, else 0."""

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
from exporter.report.samples import sample_views
from exporter.report.text import to_json, to_text
from exporter.report.verdict import CRASHED, NO_DATA, NOT_LEARNING, RunVerdict, judge
from exporter.runbooks import RUNBOOK_BASE

EXIT_FAILED = 1  # a finding at or above --fail-on
EXIT_NO_DATA = 3  # with --fail-on: a run without a training record (2 is the command line's own usage error)
EXIT_CRASHED = 4  # with --fail-on: a run whose trainer died
EXIT_NOT_LEARNING = 5  # with --fail-on not_learning or warning: a run that is not learning its task


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
    found = []
    for name, run in exporter.runs.items():
        v = judge(run, runbook_base, exporter.stats.get(name), digests.get(name))
        v.samples = sample_views(run, v)
        found.append(v)
    return found


def render(found: list[RunVerdict], fmt: str) -> str:
    return {"text": to_text, "json": to_json, "html": to_html}[fmt](found)


def failed(found: list[RunVerdict], fail_on: str | None) -> bool:
    """Whether a finding at or above `fail_on` exists (critical, not_learning: pages only; warning: pages or
    warnings)."""
    if fail_on is None:
        return False
    levels = {"critical", "warning"} if fail_on == "warning" else {"critical"}
    return any(f.severity in levels for v in found for f in v.findings)


def exit_code(found: list[RunVerdict], fail_on: str | None) -> int:
    """0, EXIT_FAILED, EXIT_CRASHED or EXIT_NO_DATA (see the module's docstring); without --fail-on always 0."""
    if fail_on is None:
        return 0
    if failed(found, fail_on):
        return EXIT_FAILED
    if any(v.verdict == CRASHED for v in found):
        return EXIT_CRASHED
    if any(v.verdict == NO_DATA for v in found):
        return EXIT_NO_DATA
    return EXIT_NOT_LEARNING if fail_on != "critical" and any(v.verdict == NOT_LEARNING for v in found) else 0


def run_report(cfg: Config, specs: list[LogSpec], fmt: str, out: Path | None, fail_on: str | None,
               runbook_base: str = RUNBOOK_BASE) -> int:
    found = verdicts(cfg, specs, runbook_base)
    for v in found:  # said where a CI log shows it, whatever the output format and file
        if v.verdict == NO_DATA:
            sys.stderr.write(f"posttrain-exporter report: run {v.run}: no training record read, the run is not "
                             "judged (verdict no_data; the report says what was read)\n")
        elif v.verdict == CRASHED and v.crash is not None:
            sys.stderr.write(f"posttrain-exporter report: run {v.run}: the trainer died after step {v.last_step} "
                             f"(verdict crashed): {v.crash.text}\n")
    text = render(found, fmt)
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        out.write_text(text, encoding="utf-8")
    return exit_code(found, fail_on)
