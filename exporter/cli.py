"""Command line: `serve` (the sidecar), `dump` (read logs once, print the exposition), `report` (judge finished
runs), `demo`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from exporter import __version__
from exporter.alerting.rules import RUNBOOK_BASE
from exporter.app import Exporter, ReaderInput
from exporter.config import DEFAULT_LISTEN, Config, ConfigError, LogSpec, default_run_name, load_config
from exporter.config import parse_listen_address as _parse_listen
from exporter.exposition.collector import ExporterCollector
from exporter.exposition.server import build_app, serve_http
from exporter.gpu import GpuCollector, GpuSampler, SamplerConfig
from exporter.parsers.chain import BUILTIN_FORMATS, FILE_FORMATS
from exporter.report.command import FAIL_ON, run_report
from exporter.report.command import FORMATS as REPORT_FORMATS
from exporter.sources.replay import ReplayReader, demo_log_text

PROG = "posttrain-exporter"
log = logging.getLogger(PROG)


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line that says what to fix, not the whole usage
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Prometheus exporter for LLM post-training runs (TRL, verl, OpenRLHF).")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    formats = sorted(["auto", *BUILTIN_FORMATS, *FILE_FORMATS])

    s = sub.add_parser("serve", help="follow trainer logs and serve /metrics (the sidecar)")
    s.add_argument("--log", dest="logs", action="append", default=[], metavar="PATH",
                   help="log file to follow (repeatable); '-' reads standard input")
    s.add_argument("--config", help="YAML config file")
    s.add_argument("--listen-address", help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})")
    s.add_argument("--run", help="run label for the logs given with --log (default: the file's stem)")
    s.add_argument("--format", default="auto", help=f"pin the line format ({', '.join(formats)}, or a config one)")
    s.add_argument("--no-gpu", action="store_true", help="do not sample GPUs through NVML")

    d = sub.add_parser("dump", help="read logs to their end and print the Prometheus exposition")
    d.add_argument("paths", nargs="+", metavar="PATH", help="log file(s); '-' reads standard input")
    d.add_argument("--config", help="YAML config file")
    d.add_argument("--run", help="run label (default: the file's stem)")
    d.add_argument("--format", default="auto", help=f"pin the line format ({', '.join(formats)})")
    d.add_argument("--no-gpu", action="store_true", help="leave out the GPU families (one NVML poll otherwise)")

    r = sub.add_parser("report", help="read logs to their end and judge each run with the alerts' detectors")
    r.add_argument("paths", nargs="+", metavar="LOG", help="log file(s) or trainer_state.json; '-': standard input")
    r.add_argument("--config", help="YAML config file (the run's thresholds and detector settings)")
    r.add_argument("--run", help="run label (default: the file's stem)")
    r.add_argument("--format", dest="out_format", choices=REPORT_FORMATS, default="text", help="text (default), "
                   "json (one object: {\"runs\": [...]}) or html (one self-contained page with charts)")
    r.add_argument("--out", type=Path, help="write to this file instead of standard output")
    r.add_argument("--fail-on", choices=FAIL_ON, help="exit 1 when a run has a finding of this severity or worse")
    r.add_argument("--runbook-base", default=RUNBOOK_BASE, help="the runbooks' URL the findings link to")

    m = sub.add_parser("demo", help="replay a bundled real TRL GRPO log at an accelerated pace and serve /metrics")
    m.add_argument("--listen-address", default=DEFAULT_LISTEN, help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    m.add_argument("--steps-per-second", type=float, default=5.0, help="replay pace (default 5)")
    m.add_argument("--once", action="store_true", help="stop serving new records after one pass")
    return p


def _specs(cfg: Config, paths: list[str], run: str | None, fmt: str) -> list[LogSpec]:
    known = {"auto", *BUILTIN_FORMATS, *FILE_FORMATS, *(f.name for f in cfg.formats)}
    if fmt not in known:
        raise UsageError(f"--format: unknown format {fmt!r} (known: {', '.join(sorted(known))})")
    specs = list(cfg.logs)
    for path in paths:
        specs.append(LogSpec(path, run or cfg.run or default_run_name(path), fmt))
    if not specs:
        raise UsageError("no log to read: pass --log PATH (or '-' for standard input), or list `logs` in --config")
    if sum(s.path == "-" for s in specs) > 1:
        raise UsageError("standard input ('-') can be read only once")
    return specs


def _registry(exporter: Exporter, with_process: bool, gpu: GpuSampler | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(exporter))
    if gpu is not None:
        reg.register(GpuCollector(gpu))
    if with_process:
        ProcessCollector(registry=reg)  # CPU and memory of the sidecar itself, for sizing
    return reg


def _gpu_sampler(cfg: Config, disabled: bool) -> GpuSampler | None:
    if disabled or not cfg.gpu.enabled:
        return None
    return GpuSampler(config=SamplerConfig(interval_seconds=cfg.gpu.interval_seconds,
                                           visible_devices=cfg.gpu.visible_devices))


def cmd_dump(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    specs = _specs(cfg, args.paths, args.run, args.format)
    for s in specs:
        if s.path != "-":
            try:
                with open(s.path, "rb"):
                    pass
            except OSError as e:
                raise UsageError(f"cannot read log {s.path}: {e.strerror}") from None
    exporter = Exporter(cfg, specs)
    exporter.read_to_end()
    gpu = _gpu_sampler(cfg, args.no_gpu)
    if gpu is not None:
        gpu.poll_once()  # one reading of the GPUs as they are now
    try:
        sys.stdout.buffer.write(generate_latest(_registry(exporter, False, gpu)))
    finally:
        if gpu is not None:
            gpu.stop()
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    specs = _specs(cfg, args.paths, args.run, "auto")
    for s in specs:
        if s.path != "-" and not Path(s.path).is_file():
            raise UsageError(f"cannot read log {s.path}: no such file")
    return run_report(cfg, specs, args.out_format, args.out, args.fail_on, args.runbook_base)


def _serve(exporter: Exporter, listen: str, loop, gpu: GpuSampler | None = None) -> int:
    host, port, _ = _parse_listen(listen)
    try:
        httpd = serve_http(host, port, build_app(_registry(exporter, True, gpu), lambda: exporter.heartbeat))
    except OSError as e:
        raise UsageError(f"cannot listen on {listen}: {e.strerror}; pick another with --listen-address") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if gpu is not None:
        gpu.start()
    try:
        loop(stop)
    finally:
        httpd.shutdown()
        if gpu is not None:
            gpu.stop()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    specs = _specs(cfg, args.logs, args.run, args.format)
    exporter = Exporter(cfg, specs)
    listen = args.listen_address or cfg.listen_address
    _parse_listen(listen)
    return _serve(exporter, listen, exporter.follow_forever, _gpu_sampler(cfg, args.no_gpu))


def cmd_demo(args: argparse.Namespace) -> int:
    if args.steps_per_second <= 0:
        raise UsageError("--steps-per-second must be greater than 0")
    cfg = Config(poll_interval_seconds=0.1)
    exporter = Exporter(cfg, [])
    spec = LogSpec("bundled:grpo_demo.log", "demo-grpo")
    run = exporter.run_state(spec.run)
    from exporter.parsers.chain import LineParserChain
    from exporter.pipeline import ConsoleStream

    stream = ConsoleStream(run, exporter.stats[spec.run], LineParserChain())
    reader = ReplayReader(demo_log_text(), args.steps_per_second, loop=not args.once)
    exporter.inputs.append(ReaderInput(spec, stream, reader=reader))
    log.info("demo: replaying a real TRL GRPO log (300 steps) at %.3g steps/s on http://%s/metrics",
             args.steps_per_second, args.listen_address)

    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            exporter.poll_once()
            stop.wait(cfg.poll_interval_seconds)

    return _serve(exporter, args.listen_address, loop, _gpu_sampler(cfg, False))


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        commands = {"serve": cmd_serve, "dump": cmd_dump, "report": cmd_report, "demo": cmd_demo}
        return commands[args.command](args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"{PROG}: config error: {e}", file=sys.stderr)
        return 2
