"""`dump`: read logs to their end and print the Prometheus exposition."""

from __future__ import annotations

import argparse
import sys

from prometheus_client import generate_latest

from exporter.app import Exporter
from exporter.commands.serving import gpu_service, scrape_registry
from exporter.commands.specs import check_readable, log_specs
from exporter.config import load_config


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    specs = log_specs(cfg, args.paths, args.run, args.format)
    check_readable(specs)
    exporter = Exporter(cfg, specs)
    exporter.read_to_end()
    gpu = gpu_service(cfg, args.no_gpu)
    if gpu is not None:
        gpu.poll_once()  # one reading of the GPUs as they are now
    try:
        sys.stdout.buffer.write(generate_latest(scrape_registry(exporter, False, gpu)))
    finally:
        if gpu is not None:
            gpu.stop()
    return 0

