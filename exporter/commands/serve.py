"""`serve`: the sidecar. Follows the trainer's logs (or its piped output, copied through) and serves /metrics."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from exporter.app import Exporter
from exporter.commands.base import log
from exporter.commands.serving import gpu_service, resilient, serve, stop_signal, until_up, web_config
from exporter.commands.specs import log_specs
from exporter.config import load_config, parse_listen_address
from exporter.gpu.service import GpuService

if TYPE_CHECKING:
    from exporter.exposition.webconfig import WebConfig


def main(args: argparse.Namespace) -> int:
    from exporter.sources.stdin import StdinReader
    stdin = None
    if "-" in args.logs:  # the trainer's pipe: copied before anything here can fail, and whatever fails after
        stdin = StdinReader(tee_fd=sys.stdout.fileno(), log_format=args.log_format).start()
        setup = until_up("serve", lambda: _serve_setup(args, stdin), lambda: stdin.wait(0))
    else:
        setup = _serve_setup(args, None)
    exporter, listen, gpu, web = setup
    try:
        return serve(exporter, listen, resilient(exporter.follow_forever), gpu, web, retry_listen=stdin is not None)
    finally:
        if stdin is not None and stdin.feed is not None:
            stdin.feed.stop()


def _serve_setup(args: argparse.Namespace, stdin) -> tuple[Exporter, str, GpuService | None, WebConfig | None]:
    cfg = load_config(args.config)
    web = web_config(args)
    specs = log_specs(cfg, args.logs, args.run, args.format, gpu_only=True)
    exporter = Exporter(cfg, [])
    for spec in specs:  # standard input is copied to standard output: the pod log stays whole
        exporter.add_input(spec, stdin if spec.path == "-" and stdin is not None else None)
    if not specs:  # a GPU-only sidecar (the other ranks of a multi-node run): the run's series, its GPUs, no records
        exporter.run_state(args.run or cfg.run)
        log.info("no log: serving run %s's GPUs only", args.run or cfg.run)
    exporter.stop_signal = stop_signal(cfg)
    from exporter.stopping.setup import stop_sidecar_trainer  # early_stop.action signal: the trainer beside us
    named = args.run or cfg.run
    stop_sidecar_trainer(exporter, [named] if named else [s.run for s in specs])
    listen = args.listen_address or cfg.listen_address
    parse_listen_address(listen)
    return exporter, listen, gpu_service(cfg, args.no_gpu), web

