"""`demo`: replay a bundled real TRL GRPO log at an accelerated pace and serve /metrics."""

from __future__ import annotations

import argparse
import threading

from exporter.app import Exporter
from exporter.commands.base import UsageError, log
from exporter.commands.serving import gpu_service, serve, web_config
from exporter.config import Config, LogSpec


def main(args: argparse.Namespace) -> int:
    from exporter.sources.replay import ReplayReader, demo_log_text
    if args.steps_per_second <= 0:
        raise UsageError("--steps-per-second must be greater than 0")
    cfg = Config(poll_interval_seconds=0.1)
    web = web_config(args)
    exporter = Exporter(cfg, [])
    reader = ReplayReader(demo_log_text(), args.steps_per_second, loop=not args.once)
    exporter.add_input(LogSpec("bundled:grpo_demo.log", "demo-grpo"), reader)
    log.info("demo: replaying a real TRL GRPO log (300 steps) at %.3g steps/s on http://%s/metrics",
             args.steps_per_second, args.listen_address)

    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            exporter.poll_once()
            stop.wait(cfg.poll_interval_seconds)

    return serve(exporter, args.listen_address, loop, gpu_service(cfg, False), web)

