"""Command line: `serve` (the sidecar), `run` (the trainer as a child, its output passed through and read),
`dump` (read logs once, print the exposition), `report` (judge finished runs), `demo`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import secrets
import signal
import stat
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest

from exporter import __version__
from exporter.app import Exporter
from exporter.config import DEFAULT_LISTEN, Config, ConfigError, LogSpec, default_run_name, load_config
from exporter.config import parse_listen_address as _parse_listen
from exporter.exposition.collector import ExporterCollector
from exporter.gpu.service import GpuService
from exporter.launch import Launch
from exporter.parsers.chain import known_formats
from exporter.parsers.training import LAUNCH_ENV
from exporter.report import FAIL_ON
from exporter.report import FORMATS as REPORT_FORMATS
from exporter.runbooks import RUNBOOK_BASE
from exporter.sources.detect import is_log_folder, refusal
from exporter.sources.priority import lower_this_thread

if TYPE_CHECKING:  # the other commands' modules are imported by the commands that use them: `dump` starts faster
    from exporter.exposition.webconfig import WebConfig
    from exporter.stopsignal import StopSignal

PROG = "posttrain-exporter"
log = logging.getLogger(PROG)


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line that says what to fix, not the whole usage
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        from_env = list(getattr(ns, "from_env", []))  # said beside a later error: the user may not know it is set
        for dest, value in list(vars(ns).items()):  # a flag not given on the command line takes its variable
            if isinstance(value, _EnvDefault):
                if not value:
                    from_env.append(value.var)
                setattr(ns, dest, value.resolve())
        ns.from_env = from_env
        return ns, extras


# --- environment variables -------------------------------------------------------------------------------------
# Every flag has one: POSTTRAIN_ and its long name upper-cased, '.' and '-' as '_' (--web.listen-address:
# POSTTRAIN_WEB_LISTEN_ADDRESS). A flag given on the command line wins; an empty variable counts as unset.
ENV_PREFIX = "POSTTRAIN_"
# report's output format keeps the variable it had when its flag was --format
_ENV_OVERRIDES = {("report", "--output.format"): "POSTTRAIN_REPORT_FORMAT"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
ENV_LIST_SEPARATOR = ","  # POSTTRAIN_LOG=/logs/train.log,/logs/trainer_state.json (a path with a comma: --log)


def env_name(command: str | None, option: str) -> str:
    return _ENV_OVERRIDES.get((command or "", option)) or ENV_PREFIX + re.sub(r"[.-]", "_", option[2:]).upper()


class _EnvDefault(list):
    """The default of a flag whose variable is set, resolved after parsing (so the command line beats it). A list,
    so that argparse's `append` can copy it: a non-empty one means the flag was given."""

    def __init__(self, var: str, raw: str, action: argparse.Action) -> None:
        super().__init__()
        self.var, self.raw, self.action = var, raw, action

    def resolve(self) -> Any:
        if self:  # --log given: argparse appended to a copy of this default
            return list(self)
        action, raw = self.action, self.raw.strip()
        if action.nargs == 0:  # --no-gpu, --once: a boolean
            if raw.lower() in _TRUE:
                return action.const
            if raw.lower() in _FALSE:
                return not action.const
            self._fail("not a boolean: give true or false")
        if isinstance(action, argparse._AppendAction):
            return [self._convert(item.strip()) for item in raw.split(ENV_LIST_SEPARATOR) if item.strip()]
        return self._convert(raw)

    def _convert(self, raw: str) -> Any:
        try:
            value = (self.action.type or str)(raw)
        except argparse.ArgumentTypeError as e:
            self._fail(str(e))
        except (TypeError, ValueError):
            self._fail(f"not a valid value for {self.action.option_strings[0]}")
        if self.action.choices is not None and value not in self.action.choices:
            self._fail(f"choose from {', '.join(map(str, self.action.choices))}")
        return value

    def _fail(self, why: str):
        raise UsageError(f"environment variable {self.var}={self.raw!r}: {why} (fix or unset it; a flag on the "
                         "command line takes precedence)")


def _bind_env(parser: argparse.ArgumentParser, command: str | None, environ: Mapping[str, str]) -> None:
    """Names each flag's variable in its help, and makes a set variable the flag's default."""
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version") or action.help == argparse.SUPPRESS:
            continue  # a hidden flag (an old name kept working) has no variable of its own
        var = env_name(command, longs[0])
        action.help = f"{action.help + ' ' if action.help else ''}[env {var}]"
        if action.default is not argparse.SUPPRESS and environ.get(var, "").strip():
            action.default = _EnvDefault(var, environ[var], action)


# --- the exporter's own log --------------------------------------------------------------------------------------
LOG_LEVELS = ("debug", "info", "warn", "warning", "error")  # warn as Prometheus' exporters spell it
LOG_FORMATS = ("logfmt", "json")
_LEVEL_NAMES = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}
_LOGFMT_PLAIN = re.compile(r"^[^\s=\"\\]+$")


def _log_fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    fields = {"ts": ts, "level": _LEVEL_NAMES.get(record.levelname, record.levelname.lower()),
              "logger": record.name, "caller": f"{record.filename}:{record.lineno}", "msg": record.getMessage()}
    if record.exc_info:
        fields["err"] = formatter.formatException(record.exc_info)
    return fields


class LogfmtFormatter(logging.Formatter):
    """`ts=2026-01-02T03:04:05.678Z level=info logger=posttrain-exporter caller=cli.py:12 msg="..."`, as the
    exporters built on Prometheus' go-kit/slog log."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={v if _LOGFMT_PLAIN.match(v) else json.dumps(v, ensure_ascii=False)}"
                        for k, v in _log_fields(record, self).items())


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, the same fields as logfmt (for log pipelines that parse JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_log_fields(record, self), ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()  # standard error: standard output may carry the trainer's output (run)
    handler.setFormatter(JsonLogFormatter() if fmt == "json" else LogfmtFormatter())
    logging.basicConfig(level="WARNING" if level == "warn" else level.upper(), handlers=[handler], force=True)
    # the file watcher's own debug lines (every inotify event) say nothing about the exporter: its warnings only
    logging.getLogger("watchdog").setLevel(logging.WARNING)


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
    r.add_argument("--fail-on", choices=FAIL_ON, help="exit 1 when a run has a finding of this severity or worse, "
                   "else 4 when a run's trainer died (verdict crashed), else 3 when a run has no training record "
                   "(verdict no_data)")
    r.add_argument("--runbook-base", default=RUNBOOK_BASE, help="the runbooks' URL the findings link to")

    m = sub.add_parser("demo", help="replay a bundled real TRL GRPO log at an accelerated pace and serve /metrics")
    _web_options(m, DEFAULT_LISTEN)
    m.add_argument("--steps-per-second", type=float, default=5.0, help="replay pace (default 5)")
    m.add_argument("--once", action="store_true", help="stop serving new records after one pass")

    environ = os.environ if environ is None else environ
    _bind_env(p, None, environ)
    for name, command in sub.choices.items():
        _log_options(command, top=False)
        _bind_env(command, name, environ)
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


_LABEL_VALUE = re.compile(r"^[^\s{}]+$")  # as the config's run labels


def _specs(cfg: Config, paths: list[str], run: str | None, fmt: str, *, child: LogSpec | None = None,
           gpu_only: bool = False) -> list[LogSpec]:
    """The logs to read: the config's, then those of --log. With `child` (the `run` command: the trainer's
    output, first, under its own name) no log is needed and standard input is not one. `gpu_only` (serve):
    no log is needed when a run is named, for the pods of a multi-node run that do not log."""
    known = known_formats(cfg.formats)
    if fmt not in known:
        raise UsageError(f"--format: unknown format {fmt!r} (known: {', '.join(known)})")
    _check_run_label(run)
    specs = [child] if child else []
    explicit = [True] if child else []
    specs += cfg.logs
    explicit += [bool(cfg.run) or s.run != default_run_name(s.path) for s in cfg.logs]
    for path in paths:
        specs.append(LogSpec(path, run or cfg.run or default_run_name(path), fmt))
        explicit.append(bool(run or cfg.run))
    if not specs:
        if gpu_only and (run or cfg.run):
            return []
        raise UsageError("no log to read: pass --log PATH (or '-' for standard input), or list `logs` in --config"
                         + (" (or only --run NAME: a GPU-only sidecar)" if gpu_only else ""))
    if sum(s.path == "-" for s in specs) > 1:
        raise UsageError("run reads the trainer's output: standard input ('-') cannot be a log here" if child
                         else "standard input ('-') can be read only once")
    for spec in specs:  # a device, a socket, a folder as a console log: never readable, said now
        why = refusal(spec.path, spec.format)
        if why is not None:
            raise UsageError(why)
    return _distinct_runs(specs, explicit)


def _check_run_label(run: str | None) -> None:
    if run is not None and not _LABEL_VALUE.match(run):
        raise UsageError(f"--run: {run!r} is not a run label: give a non-empty name without spaces or braces")


def _distinct_runs(specs: list[LogSpec], explicit: list[bool]) -> list[LogSpec]:
    """Two different sources never merge into one run silently: two logs named the same way by their file
    name get names from their folders (and it is logged); two logs given the same run name are an error,
    since their records would interleave into one history (a reset at every step of the other)."""
    seen: dict[str, LogSpec] = {}
    out: list[LogSpec] = []
    named_by_user: list[bool] = []
    for spec, given in zip(specs, explicit, strict=True):  # the same file listed twice (config and --log, or a
        key = spec.path if spec.path == "-" or "://" in spec.path else os.path.realpath(spec.path)  # symlink): once
        if key in seen:
            log.info("%s is %s, listed before for run %s: reading it once", spec.path, key, seen[key].run)
            continue
        seen[key] = spec
        out.append(spec)
        named_by_user.append(given)
    explicit = named_by_user
    by_run: dict[str, list[int]] = defaultdict(list)
    for i, spec in enumerate(out):
        by_run[spec.run].append(i)
    for name, idx in by_run.items():
        if len(idx) < 2:
            continue
        named = [i for i in idx if explicit[i]]
        if len(named) > 1:
            paths = " and ".join(out[i].path for i in named)
            raise UsageError(f"run {name!r}: logs {paths} would merge into one run; give each its own run "
                             "(`logs: [{path, run}]` in --config, or one serve per run)")
        derived = [i for i in idx if not explicit[i]]
        others = (set(by_run) - {name}) | ({name} if named else set())
        for i, unique in zip(derived, _names_from_folders([out[i].path for i in derived], others), strict=True):
            log.info("%s: run %r is taken by another log; naming this one %r (set a run to choose)",
                     out[i].path, name, unique)
            out[i] = dataclasses.replace(out[i], run=unique)
    return out


def _names_from_folders(paths: list[str], taken: set[str]) -> list[str]:
    """`a/trainer_state.json`, `b/trainer_state.json` -> `a/trainer_state`, `b/trainer_state`: the fewest parent
    folders that tell them apart (and from the runs in `taken`)."""
    parts = [os.path.abspath(p).split(os.sep)[:-1] for p in paths]
    bases = [default_run_name(p) for p in paths]
    for n in range(1, max(map(len, parts)) + 1):
        names = ["/".join([*(f for f in folders[-n:] if f), base]) for folders, base in zip(parts, bases, strict=True)]
        if len(set(names)) == len(names) and not set(names) & taken and all(map(_LABEL_VALUE.match, names)):
            return names
    names, used = [], set(taken)
    for base in bases:  # folders do not tell them apart (or hold spaces): number them
        i = 2
        while f"{base}-{i}" in used:
            i += 1
        used.add(f"{base}-{i}")
        names.append(f"{base}-{i}")
    return names


def _registry(exporter: Exporter, with_process: bool, gpu: GpuService | None = None) -> CollectorRegistry:
    from prometheus_client.process_collector import ProcessCollector
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(exporter))
    for collector in gpu.collectors() if gpu is not None else ():
        reg.register(collector)
    if with_process:
        ProcessCollector(registry=reg)  # CPU and memory of the sidecar itself, for sizing
    return reg


def _gpu_sampler(cfg: Config, disabled: bool) -> GpuService | None:
    if disabled or not cfg.gpu.enabled:
        return None
    g = cfg.gpu
    return GpuService(g.source, g.sampler, g.expected, g.feed_file)


def _readable(specs: list[LogSpec]) -> None:
    """A log read once must exist: a file that opens, or a folder of TensorBoard event files."""
    for s in specs:
        if s.path == "-" or is_log_folder(s.path):
            continue
        try:
            if stat.S_ISFIFO(os.stat(s.path).st_mode):
                # Never opened here: a reader's open, blocking or not, lets a writer waiting in its own open go on,
                # and closing it at once leaves that writer with no reader (EPIPE, SIGPIPE) before the follower opens
                if not os.access(s.path, os.R_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
                continue
            fd = os.open(s.path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if stat.S_ISDIR(os.fstat(fd).st_mode):  # opens, but is no log (a folder of logs was taken above)
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            finally:
                os.close(fd)
        except OSError as e:
            raise UsageError(f"cannot read log {s.path}: {e.strerror}") from None


def cmd_dump(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    specs = _specs(cfg, args.paths, args.run, args.format)
    _readable(specs)
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
    from exporter.report.command import run_report
    cfg = load_config(args.config)
    specs = _specs(cfg, args.paths, args.run, "auto")
    _readable(specs)
    out_format = args.out_format
    if args.legacy_out_format is not None:
        log.warning("report --format %s: say --output.format %s (--format of the other commands pins the input's "
                    "line format)", args.legacy_out_format, args.legacy_out_format)
        out_format = args.legacy_out_format
    return run_report(cfg, specs, out_format, args.out, args.fail_on, args.runbook_base)


SETUP_GRACE_SECONDS = 10.0  # `run`, the trainer gone: how long its exporter may take to set up, and read the rest
STOP_GRACE_SECONDS = 2.5  # after SIGTERM, the reading loop gets this long to end (a hung read is left behind)
LISTEN_RETRY_SECONDS = 5.0


class _Listener:
    """The HTTP side. Bound at once; or, with `retry` (`run`, `serve --log -`: the trainer's output must pass
    whatever the port does), a failure is logged loudly and the bind retried in the background."""

    def __init__(self, exporter: Exporter, listen: str, gpu: GpuService | None, web: WebConfig | None,
                 retry: bool) -> None:
        self._listen, self._closed = listen, threading.Event()
        self._lock = threading.Lock()
        self.httpd = None
        from exporter.exposition.server import RefusalCollector, build_app
        registry = _registry(exporter, True, gpu)
        self._refusals = RefusalCollector()
        registry.register(self._refusals)  # type: ignore[arg-type]
        self._app = build_app(registry, lambda: exporter.heartbeat, lambda: exporter.catching_up, exporter.verdict)
        self._web = web
        try:
            self._bind()
        except OSError as e:
            if not retry:
                raise UsageError(f"cannot listen on {listen}: {e.strerror or e}; pick another with "
                                 "--web.listen-address") from None
            log.error("cannot listen on %s: %s; the trainer's output passes through and is read meanwhile; "
                      "retrying every %.0fs", listen, e.strerror or e, LISTEN_RETRY_SECONDS)
            threading.Thread(target=self._retry, name="listen-retry", daemon=True).start()

    def _bind(self) -> None:
        from exporter.exposition.server import serve_http
        host, port, _ = _parse_listen(self._listen)
        httpd = serve_http(host, port, self._app, self._web)
        with self._lock:
            if self._closed.is_set():
                httpd.shutdown()
            else:
                self.httpd = self._refusals.server = httpd

    def _retry(self) -> None:
        while not self._closed.wait(LISTEN_RETRY_SECONDS):
            try:
                self._bind()
                log.warning("listening on %s at last", self._listen)
                return
            except OSError as e:
                log.debug("still cannot listen on %s: %s", self._listen, e)

    def shutdown(self) -> None:
        with self._lock:
            self._closed.set()
            if self.httpd is not None:
                self.httpd.shutdown()


def _serve(exporter: Exporter, listen: str, loop, gpu: GpuService | None = None, web: WebConfig | None = None,
           *, retry_listen: bool = False) -> int:
    """Serves while `loop(stop)` reads, in a thread of its own: a read that blocks (a FIFO, a hung mount) never
    holds the process past SIGTERM (STOP_GRACE_SECONDS), nor a scrape (the loop reads without the state lock)."""
    listener = _Listener(exporter, listen, gpu, web, retry_listen)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if gpu is not None:
        gpu.start()
    outcome: dict[str, Any] = {}

    def reading() -> None:
        lower_this_thread()  # the trainer beside us (serve --log -) comes first
        try:
            outcome["code"] = loop(stop)
        except BaseException as e:  # handed to the main thread, which raises it
            outcome["error"] = e

    worker = threading.Thread(target=reading, name="ingest", daemon=True)
    worker.start()
    try:
        while worker.is_alive() and not stop.is_set():
            stop.wait(0.5)
        worker.join(STOP_GRACE_SECONDS)
        if worker.is_alive():
            log.warning("reading the logs did not end within %.0fs of the stop (a read that hangs?); exiting "
                        "without it", STOP_GRACE_SECONDS)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("code") or 0
    finally:
        listener.shutdown()
        if gpu is not None:
            gpu.stop()


def _stop_signal(cfg: Config) -> StopSignal | None:
    """config early_stop: its folder must be there at start (the volume shared with the trainer)."""
    from exporter.stopsignal import StopSignal, check_stop_folder
    if not cfg.early_stop.enabled:
        return None
    check_stop_folder(cfg.early_stop)
    log.info("early stop: a %s finding writes %s", cfg.early_stop.severity, cfg.early_stop.file)
    return StopSignal(cfg.early_stop)


def _web(args: argparse.Namespace) -> WebConfig | None:
    from exporter.exposition.webconfig import load_web_config
    return load_web_config(args.web_config_file)


def cmd_serve(args: argparse.Namespace) -> int:
    from exporter.sources.stdin import StdinReader
    stdin = None
    if "-" in args.logs:  # the trainer's pipe: copied before anything here can fail, and whatever fails after
        stdin = StdinReader(tee_fd=sys.stdout.fileno(), log_format=args.log_format).start()
        setup = _until_up("serve", lambda: _serve_setup(args, stdin), lambda: stdin.wait(0))
    else:
        setup = _serve_setup(args, None)
    exporter, listen, gpu, web = setup
    try:
        return _serve(exporter, listen, _resilient(exporter.follow_forever), gpu, web, retry_listen=stdin is not None)
    finally:
        if stdin is not None and stdin.feed is not None:
            stdin.feed.stop()


def _serve_setup(args: argparse.Namespace, stdin) -> tuple[Exporter, str, GpuService | None, WebConfig | None]:
    cfg = load_config(args.config)
    web = _web(args)
    specs = _specs(cfg, args.logs, args.run, args.format, gpu_only=True)
    exporter = Exporter(cfg, [])
    for spec in specs:  # standard input is copied to standard output: the pod log stays whole
        exporter.add_input(spec, stdin if spec.path == "-" and stdin is not None else None)
    if not specs:  # a GPU-only sidecar (the other ranks of a multi-node run): the run's series, its GPUs, no records
        exporter.run_state(args.run or cfg.run)
        log.info("no log: serving run %s's GPUs only", args.run or cfg.run)
    exporter.stop_signal = _stop_signal(cfg)
    listen = args.listen_address or cfg.listen_address
    _parse_listen(listen)
    return exporter, listen, _gpu_sampler(cfg, args.no_gpu), web


def _until_up(command: str, attempt, gone, first_wait: float = 5.0, max_wait: float = 60.0):
    """`attempt()` until it returns, while a trainer's output passes through: each failure is logged loudly and
    retried (a config fixed meanwhile is taken). Once `gone()` (nothing left to pass through), the last failure
    ends the command as it would have at start."""
    wait = first_wait
    while True:
        try:
            return attempt()
        except (UsageError, ConfigError) as e:
            error: Exception = e
        except Exception as e:  # an exporter bug: still never the trainer's output
            log.exception("%s: the exporter failed to start", command)
            error = e
        if gone():
            raise error
        log.error("%s: the exporter cannot start: %s; the trainer's output passes through unchanged meanwhile; "
                  "retrying in %.0fs", command, error, wait)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not gone():
            time.sleep(0.2)
        wait = min(wait * 2, max_wait)


def _resilient(follow):
    """An ingest bug must not end the sidecar (and with `--log -`, break the trainer's pipe): it is logged once
    and the loop starts again; standard input keeps being read and copied meanwhile (its own thread)."""

    def loop(stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                follow(stop)
            except Exception:
                failures += 1
                if failures == 1:
                    log.exception("ingest failed; going on (further failures are only counted)")
                stop.wait(1.0)

    return loop


def _child_run_name(argv: list[str]) -> str:
    """`python train.py` -> `train`: the first argument that names a script, else the program's name."""
    for a in argv:
        if not a.startswith("-") and os.path.splitext(a)[1] in (".py", ".sh"):
            return default_run_name(a)
    return default_run_name(argv[0]) or "run"


def cmd_run(args: argparse.Namespace) -> int:
    """The trainer first: it starts before anything of the exporter, which comes up beside it (a bad config, a
    taken port, an exporter bug are logged and retried while the trainer's output passes through unchanged); the
    exit status is the trainer's."""
    from exporter.parsers.failures import exit_text
    from exporter.sources.child import FORWARDED_SIGNALS, SIGNAL_CHECK_SECONDS, ChildOutput
    if args.linger < 0:
        raise UsageError("--linger must be 0 or more seconds")
    stop, ended = threading.Event(), threading.Event()  # ended: the trainer's output was all read
    started: list = []
    early: list[int] = []  # signals that came before the trainer was there to take them
    taken: list[int] = []  # every signal we took

    def forward(signum: int, _frame) -> None:
        taken.append(signum)
        if started:
            started[0].forward(signum)
        else:
            early.append(signum)
        stop.set()
    # the token the trainer's feed will carry (launch.py): in its environment before it starts, so a feed the
    # trainer writes beside its console joins its run
    token = secrets.token_hex(8)
    os.environ[LAUNCH_ENV] = token

    for sig in FORWARDED_SIGNALS:  # before the trainer starts: it may print and be signalled at once
        signal.signal(sig, forward)
    try:
        child = ChildOutput(args.child, relay_log=True, log_format=args.log_format)
    except OSError as e:
        raise UsageError(f"cannot start {args.child[0]}: {e.strerror or e}") from None
    started.append(child)
    for signum in early:
        child.forward(signum)
    relay = _relay_log(child.feed.log_fd)
    log.info("run: trainer started (pid %d)", child.pid)
    side: dict[str, Any] = {"setup_done": threading.Event()}
    exporter_side = threading.Thread(target=_run_exporter, args=(args, child, ended, side, token), name="exporter",
                                     daemon=True)
    exporter_side.start()
    try:
        status = child.exit_status()  # the handlers forward our signals meanwhile
        before_exit = len(taken)
        # the trainer's lines are over: ours go straight to stderr from now on, and the copier, which writes the ones
        # it holds, sees the end of them (it waits for that before it exits: none is lost in its pipe)
        _end_relay(relay)
        if not child.wait_output(5.0):
            log.warning("the trainer exited but a process it started still holds its output open; not waiting for it")
        ended.set()
        # its setup (imports, config) first: ended now, it reads what the trainer left and stops; a thread left
        # inside an import at the interpreter's exit can hang it
        grace = STOP_GRACE_SECONDS if stop.is_set() else SETUP_GRACE_SECONDS  # a signal: be quick
        side["setup_done"].wait(grace)
        exporter_side.join(grace)
        if status:
            log.warning("run: %s", exit_text(status))
        # after its output was read: its verdict (crashed or not) for the linger's scrapes; a trainer ended by a
        # signal we forwarded (the pod stopping) was stopped, not crashed
        if "exporter" in side and not before_exit:
            side["exporter"].trainer_exited(side["run"], status)
        # keep serving for a last scrape; a signal that came since the trainer exited is ours (the pod stops): none
        if "listener" in side and args.linger and len(taken) == before_exit:
            stop.clear()
            # in short steps: a SIGTERM that the kernel hands to another thread still ends the linger (its handler
            # runs in this thread, between the steps)
            until = time.monotonic() + args.linger
            while not stop.is_set() and (left := until - time.monotonic()) > 0:
                stop.wait(min(left, SIGNAL_CHECK_SECONDS))
        return status
    finally:
        ended.set()
        if "listener" in side:
            side["listener"].shutdown()
        if "gpu" in side:
            side["gpu"].stop()
        child.feed.stop()


def _run_exporter(args: argparse.Namespace, child, ended: threading.Event, side: dict[str, Any], token: str) -> None:
    """`run`'s exporter, in its own thread: set up (retried), listen (retried), then read the trainer's output
    until it `ended`. Nothing here can stop or slow the trainer: its output is the copier's."""

    def setup():
        cfg = load_config(args.config)
        web = _web(args)
        _check_run_label(args.run)
        # --run names the trainer's run here; a --log beside it is named by its file (or by the config)
        child_spec = LogSpec("-", args.run or cfg.run or _child_run_name(args.child), args.format)
        specs = _specs(cfg, args.logs, None, args.format, child=child_spec)
        listen = args.listen_address or cfg.listen_address
        _parse_listen(listen)
        exporter = Exporter(cfg, specs[1:], Launch(child_spec.run, token))  # the feed of this launch: one run
        exporter.stop_signal = _stop_signal(cfg)
        exporter.add_input(child_spec, child, first=True)
        gpu = _gpu_sampler(cfg, args.no_gpu)
        return exporter, _Listener(exporter, listen, gpu, web, retry=True), gpu, child_spec, cfg

    try:
        exporter, side["listener"], gpu, child_spec, cfg = _until_up("run", setup, ended.is_set)
    except Exception as e:
        log.error("run: the exporter cannot start (%s); the trainer ran without it", e)
        return
    finally:
        side["setup_done"].set()
    side["exporter"], side["run"] = exporter, child_spec.run
    if gpu is not None:
        side["gpu"] = gpu
        gpu.start()
    log.info("run: the trainer's output read as run %s", child_spec.run)
    lower_this_thread()  # parsing takes the CPU the trainer leaves
    interval = min(cfg.poll_interval_seconds, 0.25)
    failures = 0
    while True:
        last = ended.is_set()  # after the trainer's output ended: what is left, then stop
        try:
            exporter.poll_once()
        except Exception:  # a parsing bug costs metrics, never the trainer's output or its exit status
            failures += 1
            if failures == 1:
                log.exception("ingest failed; the trainer's output still passes through (further failures are "
                              "only counted)")
        if exporter.catching_up:
            ended.wait(0.002)  # let a waiting scrape take the lock
            continue
        if last:
            return
        ended.wait(interval)


class _RelayStream:
    """`run`: the exporter's log lines go to the copier, which writes them between the trainer's lines, never
    inside one. Once it is gone (the trainer's output ended), straight to standard error."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        os.set_blocking(fd, False)
        self.dropped = 0

    def write(self, text: str) -> None:
        if self.fd is not None:
            try:
                data = text.encode("utf-8", "replace")
                n = os.write(self.fd, data)
                if n < len(data):  # a line longer than the pipe's free room: its rest, however long it takes
                    os.set_blocking(self.fd, True)
                    os.write(self.fd, data[n:])
                    os.set_blocking(self.fd, False)
                return
            except BlockingIOError:  # the copier holds enough of ours: this line is dropped, not waited for
                self.dropped += 1
                return
            except OSError:
                os.close(self.fd)
                self.fd = None
        sys.stderr.write(text)

    def flush(self) -> None:
        if self.fd is None:
            sys.stderr.flush()


def _relay_log(fd: int | None) -> _RelayStream | None:
    if fd is None:
        return None
    stream = _RelayStream(fd)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(stream)  # type: ignore[arg-type]
    return stream


def _end_relay(stream: _RelayStream | None) -> None:
    """Back to stderr, then the relay's pipe closed: setStream takes each handler's lock, so no line is being
    written to the pipe once it returns."""
    if stream is None:
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            handler.setStream(sys.stderr)
    if stream.fd is not None:
        with contextlib.suppress(OSError):
            os.close(stream.fd)
        stream.fd = None
    if stream.dropped:  # lines the copier's full pipe refused: said once the log is ours again
        log.warning("%d of the exporter's log lines were dropped while the trainer's output was passing through "
                    "(the copier's pipe for them was full)", stream.dropped)


def cmd_demo(args: argparse.Namespace) -> int:
    from exporter.sources.replay import ReplayReader, demo_log_text
    if args.steps_per_second <= 0:
        raise UsageError("--steps-per-second must be greater than 0")
    cfg = Config(poll_interval_seconds=0.1)
    web = _web(args)
    exporter = Exporter(cfg, [])
    reader = ReplayReader(demo_log_text(), args.steps_per_second, loop=not args.once)
    exporter.add_input(LogSpec("bundled:grpo_demo.log", "demo-grpo"), reader)
    log.info("demo: replaying a real TRL GRPO log (300 steps) at %.3g steps/s on http://%s/metrics",
             args.steps_per_second, args.listen_address)

    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            exporter.poll_once()
            stop.wait(cfg.poll_interval_seconds)

    return _serve(exporter, args.listen_address, loop, _gpu_sampler(cfg, False), web)


def _env_note(args: argparse.Namespace | None) -> str:
    used = getattr(args, "from_env", None)
    return f" (set from the environment: {', '.join(used)})" if used else ""


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        setup_logging(args.log_level, args.log_format)
        commands = {"serve": cmd_serve, "run": cmd_run, "dump": cmd_dump, "report": cmd_report, "demo": cmd_demo}
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
