"""Command line: parses the flags (and their environment variables) and calls the command's module in
exporter/commands/: `serve` (the sidecar), `run` (the trainer as a child, its output passed through and read),
`dump` (read logs once, print the exposition), `report` (judge finished runs), `demo`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from exporter import __version__
from exporter.commands import demo, dump, report, run, serve
from exporter.commands.base import PROG, UsageError
from exporter.config import DEFAULT_LISTEN, ConfigError
from exporter.config import parse_listen_address as _parse_listen
from exporter.envflags import EnvDefault, bind_env, env_name
from exporter.logformat import LOG_FORMATS, LOG_LEVELS, JsonLogFormatter, setup_logging
from exporter.parsers.chain import known_formats
from exporter.report import FAIL_ON
from exporter.report import FORMATS as REPORT_FORMATS
from exporter.runbooks import RUNBOOK_BASE

__all__ = ["PROG", "UsageError", "build_parser", "main"]  # UsageError: what the flags' checks raise


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line that says what to fix, not the whole usage
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        from_env = list(getattr(ns, "from_env", []))  # said beside a later error: the user may not know it is set
        for dest, value in list(vars(ns).items()):  # a flag not given on the command line takes its variable
            if isinstance(value, EnvDefault):
                if not value:
                    from_env.append(value.var)
                setattr(ns, dest, value.resolve())
        ns.from_env = from_env
        return ns, extras


def _log_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """On the top parser with defaults; on each command again without (argparse.SUPPRESS), so that given after
    the command they still apply and, not given there, leave what was given before it."""
    p.add_argument("--log.level", "--log-level", dest="log_level", choices=LOG_LEVELS,
                   default="info" if top else argparse.SUPPRESS, help="the exporter's own log: debug, info (default), "
                   "warn or error")
    p.add_argument("--log.format", dest="log_format", choices=LOG_FORMATS,
                   default="logfmt" if top else argparse.SUPPRESS, help="logfmt (default) or json")


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """`environ` (default os.environ) gives the POSTTRAIN_* variables."""
    p = _Parser(prog=PROG, description="Prometheus exporter for LLM post-training runs (TRL, verl, OpenRLHF). "
                "Every flag can also be set by its POSTTRAIN_* environment variable (shown in each command's --help); "
                "a flag given on the command line wins.", allow_abbrev=False)  # else `serve --log` is taken for --log.*
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _log_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    formats = known_formats()

    s = sub.add_parser("serve", help="follow trainer logs and serve /metrics (the sidecar)")
    s.add_argument("--log", dest="logs", action="append", default=[], metavar="PATH",
                   help="log file to follow (repeatable); '-' reads standard input and copies it to standard output")
    _serve_options(s, formats)

    r = sub.add_parser("run", help="run the trainer as a child: its output passes through and is read, its exit "
                       "status is ours", usage=f"{PROG} run [serve options] -- COMMAND [ARG ...]")
    r.add_argument("--log", dest="logs", action="append", default=[], metavar="PATH",
                   help="a log file to follow besides the trainer's output (repeatable), e.g. trainer_state.json")
    _serve_options(r, formats)
    r.add_argument("--linger", type=float, default=0.0, metavar="SECONDS",
                   help="keep serving this long after the trainer exited, for a last scrape (default 0)")
    r.add_argument("child", nargs="+", metavar="COMMAND", help="the trainer's command line, after --")

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
    r.add_argument("--output.format", dest="out_format", choices=REPORT_FORMATS, default="text", help="text "
                   "(default), json (one object: {\"runs\": [...]}) or html (one self-contained page with charts)")
    # report's --format was its output format, while every other command's --format pins the input's line format:
    # still taken for the output, with a warning, so that a pipeline that says it keeps working
    r.add_argument("--format", dest="legacy_out_format", choices=REPORT_FORMATS, default=None,
                   help=argparse.SUPPRESS)
    r.add_argument("--out", type=Path, help="write to this file instead of standard output")
    r.add_argument("--fail-on", choices=FAIL_ON, help="exit 1 when a run has a finding of this severity or worse "
                   "(not_learning: a page), else 4 when a run's trainer died (verdict crashed), else 3 when a run has "
                   "no training record (verdict no_data), else 5 at not_learning or warning when a run is not "
                   "learning its task (verdict not_learning)")
    r.add_argument("--runbook-base", default=RUNBOOK_BASE, help="the runbooks' URL the findings link to")

    m = sub.add_parser("demo", help="replay a bundled real TRL GRPO log at an accelerated pace and serve /metrics")
    _web_options(m, DEFAULT_LISTEN)
    m.add_argument("--steps-per-second", type=float, default=5.0, help="replay pace (default 5)")
    m.add_argument("--once", action="store_true", help="stop serving new records after one pass")

    environ = os.environ if environ is None else environ
    bind_env(p, None, environ)
    for name, command in sub.choices.items():
        _log_options(command, top=False)
        bind_env(command, name, environ)
    return p


def _web_options(p: argparse.ArgumentParser, default: str | None) -> None:
    shown = default or DEFAULT_LISTEN
    p.add_argument("--web.listen-address", "--listen-address", dest="listen_address", default=default,
                   type=_listen_arg, metavar="HOST:PORT", help=f"address to serve on (default {shown}; IPv6 as "
                   "[::1]:9847, [::]:9847 for both families)")
    p.add_argument("--web.config.file", dest="web_config_file", metavar="PATH",
                   help="TLS and basic auth, in the Prometheus exporter-toolkit format (as node_exporter)")


def _listen_arg(text: str) -> str:
    """Checked while parsing, so that a bad POSTTRAIN_WEB_LISTEN_ADDRESS is named as such."""
    try:
        _parse_listen(text, "")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(": ")) from None
    return text


def _serve_options(p: argparse.ArgumentParser, formats: list[str]) -> None:
    p.add_argument("--config", help="YAML config file")
    _web_options(p, None)
    p.add_argument("--run", help="run label for the logs given with --log (default: the file's stem)")
    p.add_argument("--format", default="auto", help=f"pin the line format ({', '.join(formats)}, or a config one)")
    p.add_argument("--no-gpu", action="store_true", help="do not sample GPUs through NVML")




def _env_note(args: argparse.Namespace | None) -> str:
    used = getattr(args, "from_env", None)
    return f" (set from the environment: {', '.join(used)})" if used else ""



def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        setup_logging(args.log_level, args.log_format)
        commands = {"serve": serve.main, "run": run.main, "dump": dump.main, "report": report.main, "demo": demo.main}
        return commands[args.command](args)
    except UsageError as e:
        return _fatal(f"error: {e}{_env_note(args)}", args, argv)
    except ConfigError as e:
        return _fatal(f"config error: {e}{_env_note(args)}", args, argv)


def _fatal(message: str, args: argparse.Namespace | None, argv: list[str] | None) -> int:
    """The one line that stops the program at start (exit 2): a JSON log line where --log.format json was asked
    for (a log pipeline parses every line of the container's stderr), else `posttrain-exporter: error: ...`."""
    fmt = getattr(args, "log_format", None) or _log_format_asked(sys.argv[1:] if argv is None else argv)
    if fmt == "json":
        record = logging.LogRecord(PROG, logging.ERROR, __file__, 0, message, None, None)
        print(JsonLogFormatter().format(record), file=sys.stderr)
    else:
        print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def _log_format_asked(argv: list[str]) -> str | None:
    """--log.format as given, read without the parser (which may be what failed), else its variable."""
    for i, arg in enumerate(argv):
        if arg.startswith("--log.format="):
            return arg.partition("=")[2]
        if arg == "--log.format" and i + 1 < len(argv):
            return argv[i + 1]
    return os.environ.get(env_name(None, "--log.format"))
