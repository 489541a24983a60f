"""The YAML config: run labels, log files and their formats, key aliases, limits.

Validated at start; every error names the field to fix (`logs[0].format: ...`)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any

from exporter.detectors.catalog import BY_NAME as DETECTORS
from exporter.gpu.sampler import SamplerConfig
from exporter.gpu.sources import DEFAULT_SOURCE, GPU_SOURCES
from exporter.instruments.keymap import INSTRUMENTS
from exporter.instruments.settings import THRESHOLD_NAMES, DerivedSettings, DetectorSettings, Thresholds, WindowSpec
from exporter.parsers.chain import known_formats
from exporter.parsers.userregex import RegexFormat
from exporter.runstate import RunLimits

DEFAULT_PORT = 9847
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
_LABEL_VALUE = re.compile(r"^[^\s{}]+$")
_ALIAS_TARGET = re.compile(r"^(?P<i>[a-z_]+)(?:\{(?P<l>[a-z_]+)=(?P<v>[^}]+)\})?$")


MAX_ERROR_CHARS = 500  # a config error is one line a person reads, whatever the config holds


class ConfigError(ValueError):
    """What to fix, on one line of at most MAX_ERROR_CHARS."""

    def __init__(self, message: str) -> None:
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        if len(message) > MAX_ERROR_CHARS:
            message = message[: MAX_ERROR_CHARS - 3] + "..."
        super().__init__(message)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 40, 40, 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4


def shown(value: Any) -> str:
    """A value as an error shows it: its repr, cut short (a list built from YAML aliases may be huge)."""
    text = _REPR.repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


@dataclass(frozen=True)
class GpuSettings:
    """The config's `gpu`: whether to sample, and the sampler's own settings (gpu/sampler.py owns their defaults)."""

    enabled: bool = True  # NVML absent is not an error: posttrain_gpu_nvml_up says 0
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    # where the GPU data come from (exporter/gpu/sources.py): nvml (this process), feed (the trainer's samples in
    # feed_file), dcgm (dcgm-exporter, joined in Prometheus); expected: the run trains on GPUs (alert without data)
    source: str = DEFAULT_SOURCE
    expected: bool = False
    feed_file: str | None = None


@dataclass(frozen=True)
class LogSpec:
    path: str
    run: str
    format: str = "auto"
    # Micro-batches per optimizer step, for steps read off a progress bar that counts micro-batches (OpenRLHF's
    # `Train step of epoch N`; console/postfix.py)
    gradient_accumulation: int = 1


STOP_SEVERITIES = ("critical", "warning")  # critical: pages only; warning: pages and warnings
STOP_ACTIONS = ("file", "signal")  # file: the stop file only; signal: the file, and the trainer is signalled
# The signals a graceful stop may send: those a trainer can catch to save (SIGKILL and SIGSTOP cannot be caught).
GRACEFUL_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")
DEFAULT_GRACE_SECONDS = 900.0  # a sharded checkpoint of a 70B model to network storage takes minutes
DEFAULT_KILL_AFTER_SECONDS = 30.0  # SIGTERM to SIGKILL: what torchrun and the kubelet give by default


@dataclass(frozen=True)
class EarlyStopSettings:
    """The stop signal for the trainer (exporter/stopsignal.py): off unless `file` is given. With action `signal`
    the trainer is also stopped by signals (exporter/stopping/): `signal`, then SIGTERM after `grace_seconds`,
    then SIGKILL after `kill_after_seconds` more. `process` (a piece of its command line) or `pid` names the
    trainer for `serve`, which is not its parent."""

    file: str | None = None  # `{run}` in it: one file per run
    severity: str = "critical"
    detectors: frozenset[str] | None = None  # only these detectors raise it; None: every one of the severity
    action: str = "file"
    signal: str = "SIGINT"
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    kill_after_seconds: float = DEFAULT_KILL_AFTER_SECONDS
    process: str | None = None
    pid: int | None = None

    @property
    def signals(self) -> bool:
        return self.enabled and self.action == "signal"

    @property
    def enabled(self) -> bool:
        return self.file is not None


@dataclass
class Config:
    logs: list[LogSpec] = field(default_factory=list)
    listen_address: str = DEFAULT_LISTEN
    poll_interval_seconds: float = 1.0
    formats: list[RegexFormat] = field(default_factory=list)
    aliases: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    limits: RunLimits = field(default_factory=RunLimits)
    run: str | None = None  # default run label
    derived: DerivedSettings = field(default_factory=DerivedSettings)
    gpu: GpuSettings = field(default_factory=lambda: GpuSettings())
    early_stop: EarlyStopSettings = field(default_factory=EarlyStopSettings)


# File stems that say nothing of the run (every trainer's log may be `train.log`, `stdout`, `combined.log`): such a
# log's run is named after its folder, the first one up whose name is not one of these either (`/runs/grpo-7b/
# logs/train.log` is `grpo-7b`); on Kubernetes, a container named so gives the pod's name.
GENERIC_NAMES = frozenset({
    "combined", "console", "debug", "log", "logs", "main", "nohup", "out", "output", "outputs", "run", "stderr",
    "stdout", "train", "trainer", "training", "worker",
})
_FOLDERS_UP = 3  # folders looked at above a generic file name before settling for the stem
_LABEL_SAFE = re.compile(r"^[^\s{}]+$")


def file_run_name(path: str) -> str:
    """The file name less its last extension: `qwen2.5-7b-grpo.log` is `qwen2.5-7b-grpo` (a version's dots are part
    of the name); a folder (an output folder: `out/`, `ckpt/qwen2.5-7b`) keeps its whole name."""
    name = os.path.basename(os.path.normpath(path))
    if not path.endswith(("/", os.sep)) and not os.path.isdir(path):
        name = os.path.splitext(name)[0]
    return name or "run"


def default_run_name(path: str) -> str:
    """The run a log gives when none is set: its file's stem, or for a generic stem its folder's name (the pod's,
    for a `k8s://` container with a generic name)."""
    if path == "-":
        return "stdin"
    if path.startswith("k8s://"):
        parts = path[len("k8s://"):].split("/")
        pod = parts[1] if len(parts) == 3 else os.environ.get("POD_NAME", "")
        container = parts[-1]
        return pod if container.lower() in GENERIC_NAMES and pod and _LABEL_SAFE.match(pod) else container or "run"
    stem = file_run_name(path)
    if stem.lower() not in GENERIC_NAMES:
        return stem
    folder = os.path.dirname(os.path.abspath(path))
    for _ in range(_FOLDERS_UP):
        name = os.path.basename(folder)
        if not name:
            break  # the root
        if name.lower() not in GENERIC_NAMES and _LABEL_SAFE.match(name):
            return name
        folder = os.path.dirname(folder)
    return stem


def load_config(path: str | None) -> Config:
    if path is None:
        return Config()
    from exporter.yamlfile import YamlFileError, read_yaml

    try:
        raw = read_yaml(path, "config")
    except YamlFileError as e:
        raise ConfigError(str(e)) from None
    return parse_config(raw if raw is not None else {})


def _expect(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def _number(raw: dict, key: str, default: float, *, integer: bool = False, minimum: float = 0,
            maximum: float | None = None, section: str = "") -> Any:
    """raw[key] (or `default`): a finite number above `minimum` (exclusive) and at most `maximum` (default: its
    MAXIMA entry, else MAX_COUNT for an integer and MAX_SECONDS for a float)."""
    if key not in raw:
        return default
    v = raw[key]
    where = f"{section}.{key}" if section else key
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    _expect(ok and not isinstance(v, bool), where, f"must be {'an integer' if integer else 'a number'}, got {shown(v)}")
    _expect(_finite(v), where, f"must be a finite number, got {shown(v)}")
    _expect(v > minimum, where, f"must be greater than {minimum}, got {shown(v)}")
    top = maximum if maximum is not None else MAXIMA.get(where, MAX_COUNT if integer else MAX_SECONDS)
    _expect(v <= top, where, f"must be at most {top:,}, got {shown(v)}")
    return v


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


# Upper bounds, so that a typo cannot ask for memory or waits the sidecar cannot afford. A number not named in
# MAXIMA is a count (at most MAX_COUNT) or, as a float, seconds (at most MAX_SECONDS).
MAX_COUNT = 1_000_000
MAX_SECONDS = 3600.0
MAXIMA = {
    "limits.max_keys": 100_000,
    # Every series holds 2 x history_limit points of 16 bytes from its first point (instruments/series.py).
    "limits.history_limit": 100_000,
    "limits.max_key_length": 65_536,
    "limits.max_line_length": 64 << 20,
    "baselines.points": 100_000,
}
MAX_WINDOW = 100_000  # points in a rolling window, the default one or an instrument's
MAX_BASELINE = 1e12


KNOWN_KEYS = {"run", "listen_address", "poll_interval_seconds", "logs", "formats", "aliases", "limits", "windows",
              "thresholds", "baselines", "detectors", "gpu", "early_stop"}
# Inputs whose baseline can be given instead of measured: instruments, and `<instrument>_<sub>` for a family.
BASELINE_INPUTS = {"completion_length", "completion_length_std", "entropy", "reward_std", "grad_norm", "clip_total",
                   "kl", "reward", "loss"}


def parse_config(raw: Any) -> Config:
    _expect(isinstance(raw, dict), "config", "must be a mapping of settings")
    _only_known(raw, KNOWN_KEYS, "")
    cfg = Config()
    if "run" in raw:
        _expect(isinstance(raw["run"], str) and bool(raw["run"]), "run", "must be a non-empty string")
        cfg.run = raw["run"]
    if "listen_address" in raw:
        cfg.listen_address = parse_listen_address(str(raw["listen_address"]), "listen_address")[2]
    cfg.poll_interval_seconds = _number(raw, "poll_interval_seconds", 1.0)
    cfg.formats = _formats(raw.get("formats", []))
    cfg.logs = _logs(raw.get("logs", []), set(known_formats(cfg.formats)), cfg.run)
    cfg.aliases = _aliases(raw.get("aliases", {}))
    cfg.limits = _into(RunLimits(), _section(raw, "limits", _names(RunLimits)), "limits")
    cfg.derived = _derived(raw)
    cfg.gpu = _gpu(raw)
    cfg.early_stop = _early_stop(raw)
    return cfg


def _gpu(raw: dict) -> GpuSettings:
    """gpu: {enabled, interval_seconds, visible_devices}; the rest of the sampler's settings keep their defaults."""
    sec = _section(raw, "gpu", {"enabled", "interval_seconds", "visible_devices", "source", "expected", "feed_file"})
    enabled = sec.get("enabled", True)
    _expect(isinstance(enabled, bool), "gpu.enabled", f"must be true or false, got {shown(enabled)}")
    source, expected, feed_file = sec.get("source", DEFAULT_SOURCE), sec.get("expected", False), sec.get("feed_file")
    _expect(source in GPU_SOURCES, "gpu.source", f"must be one of {', '.join(GPU_SOURCES)}, got {shown(source)}")
    _expect(isinstance(expected, bool), "gpu.expected", f"must be true or false, got {shown(expected)}")
    _expect(source != "feed" or (isinstance(feed_file, str) and bool(feed_file)), "gpu.feed_file",
            "must name the trainer's GPU sample file (exporter/integrations/gpu_feed.py) when gpu.source is feed")
    devices = sec.get("visible_devices")
    _expect(devices is None or isinstance(devices, str | int), "gpu.visible_devices",
            "must be a string like '0,1' or 'GPU-<uuid>'")
    sampler = _into(SamplerConfig(), {k: sec[k] for k in sec if k == "interval_seconds"}, "gpu")
    if devices is not None:
        sampler = dataclasses.replace(sampler, visible_devices=str(devices))
    return GpuSettings(enabled, sampler, source, expected, feed_file)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _into(defaults: Any, sec: dict, where: str) -> Any:
    """`defaults` (a settings dataclass of the subsystem that owns it) with the numbers `sec` gives: each checked
    against the type of its default, and above the field's `minimum` metadata (exclusive; 0 when absent)."""
    given = {}
    for f in dataclasses.fields(defaults):
        if f.name in sec:
            default = getattr(defaults, f.name)
            given[f.name] = _number(sec, f.name, default, integer=isinstance(default, int),
                                    minimum=f.metadata.get("minimum", 0), section=where)
    return dataclasses.replace(defaults, **given)


def _early_stop(raw: dict) -> EarlyStopSettings:
    """early_stop: {file, severity, detectors, action, signal, grace_seconds, kill_after_seconds, process, pid};
    off without `file`."""
    sec = _section(raw, "early_stop", {"file", "severity", "detectors", "action", "signal", "grace_seconds",
                                       "kill_after_seconds", "process", "pid"})
    if not sec:
        return EarlyStopSettings()
    path = sec.get("file")
    _expect(isinstance(path, str) and bool(path.strip()), "early_stop.file",
            f"must be the path of the stop file (e.g. /logs/posttrain-stop.json), got {shown(path)}")
    severity = sec.get("severity", "critical")
    _expect(severity in STOP_SEVERITIES, "early_stop.severity",
            f"must be critical (pages) or warning (pages and warnings), got {shown(severity)}")
    names = sec.get("detectors")
    if names is not None:
        _expect(isinstance(names, list) and bool(names), "early_stop.detectors",
                "must be a non-empty list of detector names")
        for i, name in enumerate(names):
            _expect(isinstance(name, str) and name in DETECTORS, f"early_stop.detectors[{i}]",
                    f"unknown detector {shown(name)} (known: {', '.join(sorted(DETECTORS))})")
            allowed = STOP_SEVERITIES[: STOP_SEVERITIES.index(severity) + 1]
            _expect(DETECTORS[name].severity in allowed, f"early_stop.detectors[{i}]",
                    f"{name} is a {DETECTORS[name].severity} detector: set early_stop.severity: warning to stop on it")
    return EarlyStopSettings(path, severity, None if names is None else frozenset(names), **_stop_action(sec))


def _stop_action(sec: dict) -> dict[str, Any]:
    """early_stop's action and, with `signal`, how the trainer is signalled and found."""
    action = sec.get("action", "file")
    _expect(action in STOP_ACTIONS, "early_stop.action",
            f"must be file (the stop file only) or signal (the file, and signals to the trainer), got {shown(action)}")
    sig = sec.get("signal", "SIGINT")
    sig = f"SIG{sig}" if isinstance(sig, str) and not sig.startswith("SIG") else sig
    _expect(sig in GRACEFUL_SIGNALS, "early_stop.signal",
            f"must be a signal a trainer can catch to save ({', '.join(GRACEFUL_SIGNALS)}), got {shown(sig)}")
    grace = _number(sec, "grace_seconds", DEFAULT_GRACE_SECONDS, minimum=0, maximum=7 * 86400.0,
                    section="early_stop")
    kill_after = _number(sec, "kill_after_seconds", DEFAULT_KILL_AFTER_SECONDS, minimum=0, maximum=MAX_SECONDS,
                         section="early_stop")
    process, pid = sec.get("process"), sec.get("pid")
    _expect(process is None or (isinstance(process, str) and bool(process.strip())), "early_stop.process",
            f"must be a piece of the trainer's command line (e.g. verl.trainer.main_ppo), got {shown(process)}")
    _expect(pid is None or (isinstance(pid, int) and not isinstance(pid, bool) and pid > 1), "early_stop.pid",
            f"must be the trainer's process id (more than 1), got {shown(pid)}")
    _expect(process is None or pid is None, "early_stop.pid", "give the trainer's process or its pid, not both")
    _expect(action == "signal" or (process is None and pid is None and "signal" not in sec), "early_stop.action",
            "must be signal for early_stop.signal, process or pid to take effect")
    return {"action": action, "signal": sig, "grace_seconds": float(grace), "kill_after_seconds": float(kill_after),
            "process": process, "pid": pid}


def _section(raw: dict, name: str, known: set[str], where: str | None = None) -> dict:
    """raw[name], a mapping of known keys; `where` names it in errors (default: `name`)."""
    where = where or name
    sec = raw.get(name, {})
    _expect(isinstance(sec, dict), where, "must be a mapping")
    _only_known(sec, known, where)
    return sec


def _only_known(mapping: dict, known: set[str], where: str) -> None:
    """The one way an unknown key is refused: named with its place, and the keys that would be known there."""
    unknown = sorted(set(mapping) - known, key=str)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else str(unknown[0])
        raise ConfigError(f"{key}: unknown setting (known: {', '.join(sorted(known))})")


def _window(raw: dict, where: str, base: WindowSpec) -> WindowSpec:
    _expect(isinstance(raw, dict), where, "must be a mapping of size and min_points")
    _only_known(raw, {"size", "min_points"} | ({"per_instrument"} if where == "windows" else set()), where)
    size = _number(raw, "size", base.size, integer=True, minimum=1, maximum=MAX_WINDOW, section=where)
    min_points = _number(raw, "min_points", base.min_points, integer=True, minimum=1, maximum=MAX_WINDOW,
                         section=where)
    _expect(min_points <= size, f"{where}.min_points", f"must not exceed size ({size}), got {min_points}")
    return WindowSpec(size, min_points)


def _derived(raw: dict) -> DerivedSettings:
    windows = _section(raw, "windows", {"size", "min_points", "per_instrument"})
    default = _window(windows, "windows", WindowSpec())
    per = windows.get("per_instrument", {})
    _expect(isinstance(per, dict), "windows.per_instrument", "must map an instrument to {size, min_points}")
    per_instrument = {}
    for inst, spec in per.items():
        _expect(inst in INSTRUMENTS, f"windows.per_instrument.{inst}",
                f"unknown instrument (known: {', '.join(INSTRUMENTS)})")
        per_instrument[inst] = _window(spec, f"windows.per_instrument.{inst}", default)
    th = _section(raw, "thresholds", set(THRESHOLD_NAMES))
    values = {}
    for name in th:
        v = th[name]
        ok = isinstance(v, int | float) and not isinstance(v, bool) and _finite(v)
        _expect(ok, f"thresholds.{name}", f"must be a finite number, got {shown(v)}")
        values[name] = float(v)
    thresholds = Thresholds(**values)
    _expect(thresholds.kl_warning <= thresholds.kl_critical, "thresholds.kl_warning", "must not exceed kl_critical")
    base = _section(raw, "baselines", BASELINE_INPUTS | {"points"})
    given = {k: float(_number(base, k, 0.0, maximum=MAX_BASELINE, section="baselines")) for k in base if k != "points"}
    points = _number(base, "points", 10, integer=True, section="baselines")
    return DerivedSettings(default, per_instrument, thresholds, given, points, _detectors(raw))


def _detectors(raw: dict) -> DetectorSettings:
    """detectors: {clear_steps, clear_margin, <detector>: {steps, clear_steps, enabled}}"""
    sec = _section(raw, "detectors", set(DETECTORS) | {"clear_steps", "clear_margin"})
    clear_steps = _number(sec, "clear_steps", 5, integer=True, section="detectors")
    margin = sec.get("clear_margin", 0.2)
    _expect(isinstance(margin, int | float) and not isinstance(margin, bool) and 0 <= margin < 1,
            "detectors.clear_margin", f"must be a number in [0, 1), got {shown(margin)}")
    steps, clear, disabled = {}, {}, set()
    for name in set(sec) & set(DETECTORS):
        where = f"detectors.{name}"
        _expect(isinstance(sec[name], dict), where, "must be a mapping of steps, clear_steps, enabled")
        d = _section(sec, name, {"steps", "clear_steps", "enabled"}, where)
        if "steps" in d:
            steps[name] = _number(d, "steps", 1, integer=True, section=where)
        if "clear_steps" in d:
            clear[name] = _number(d, "clear_steps", 1, integer=True, section=where)
        enabled = d.get("enabled", True)
        _expect(isinstance(enabled, bool), f"{where}.enabled", f"must be true or false, got {shown(enabled)}")
        if not enabled:
            disabled.add(name)
    return DetectorSettings(steps, clear, clear_steps, float(margin), frozenset(disabled))


def _formats(raw: Any) -> list[RegexFormat]:
    _expect(isinstance(raw, list), "formats", "must be a list of {name, pattern}")
    out = []
    for i, f in enumerate(raw):
        where = f"formats[{i}]"
        _expect(isinstance(f, dict) and {"name", "pattern"} <= set(f), where, "needs `name` and `pattern`")
        name, pattern = f["name"], f["pattern"]
        _expect(isinstance(pattern, str) and bool(pattern), f"{where}.pattern",
                "must be a regular expression (a string)")
        _expect(isinstance(name, str) and name not in known_formats(),
                f"{where}.name", f"{shown(name)} is not a free format name")
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"{where}.pattern: not a valid regular expression: {e}") from None
        groups = set(rx.groupindex) - {"step"}
        _expect(bool(groups), f"{where}.pattern",
                "needs named groups: one per metric ((?P<loss>...)), or `key` and `value`")
        out.append(RegexFormat(name, rx))
    return out


def _logs(raw: Any, formats: set[str], default_run: str | None) -> list[LogSpec]:
    _expect(isinstance(raw, list), "logs", "must be a list of {path, run, format}")
    out = []
    for i, entry in enumerate(raw):
        where = f"logs[{i}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        _expect(isinstance(entry, dict) and isinstance(entry.get("path"), str), where, "needs a `path` string")
        _only_known(entry, {"path", "run", "format", "gradient_accumulation"}, where)
        fmt = entry.get("format", "auto")
        _expect(isinstance(fmt, str) and fmt in formats, f"{where}.format",
                f"unknown format {shown(fmt)} (known: {', '.join(sorted(formats))})")
        run = entry.get("run", default_run or default_run_name(entry["path"]))
        _expect(isinstance(run, str) and bool(_LABEL_VALUE.match(run)), f"{where}.run",
                "must be a non-empty string without spaces or braces")
        accumulation = entry.get("gradient_accumulation", 1)
        _expect(type(accumulation) is int and 1 <= accumulation <= 1 << 20, f"{where}.gradient_accumulation",
                "must be a whole number of micro-batches per optimizer step, 1 or more")
        out.append(LogSpec(entry["path"], run, fmt, accumulation))
    return out


def _aliases(raw: Any) -> dict[str, tuple[str, str | None]]:
    _expect(isinstance(raw, dict), "aliases", "must map a trainer key to an instrument, e.g. {my/kl: kl}")
    out: dict[str, tuple[str, str | None]] = {}
    for key, target in raw.items():
        m = _ALIAS_TARGET.match(str(target))
        where = f"aliases[{shown(key)}]"
        _expect(bool(m), where, f"{shown(target)} is not `instrument` or `instrument{{label=value}}`")
        inst = INSTRUMENTS.get(m["i"])
        _expect(inst is not None, where, f"unknown instrument {shown(m['i'])} (known: {', '.join(INSTRUMENTS)})")
        if inst.label:
            _expect(m["l"] == inst.label, where, f"{m['i']} needs its label: {m['i']}{{{inst.label}=...}}")
        else:
            _expect(m["l"] is None, where, f"{m['i']} takes no label")
        out[str(key)] = (m["i"], m["v"])
    return out


def parse_listen_address(text: str, where: str = "--listen-address") -> tuple[str, int, str]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    ok = port.isdigit() and 0 <= int(port) <= 65535
    _expect(ok, where, f"{shown(text)} is not HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT})")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port), f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
