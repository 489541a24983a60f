"""`report`: read logs to their end and judge each run with the alerts' detectors."""

from __future__ import annotations

import argparse

from exporter.commands.base import log
from exporter.commands.specs import check_readable, log_specs
from exporter.config import load_config


def main(args: argparse.Namespace) -> int:
    from exporter.report.command import run_report
    cfg = load_config(args.config)
    specs = log_specs(cfg, args.paths, args.run, "auto")
    check_readable(specs)
    out_format = args.out_format
    if args.legacy_out_format is not None:
        log.warning("report --format %s: say --output.format %s (--format of the other commands pins the input's "
                    "line format)", args.legacy_out_format, args.legacy_out_format)
        out_format = args.legacy_out_format
    return run_report(cfg, specs, out_format, args.out, args.fail_on, args.runbook_base)
