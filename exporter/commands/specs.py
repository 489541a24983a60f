"""The logs a command reads: the config's and the command line's, each under a run name no other log takes, and
each one that can never be read refused at start."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from collections import defaultdict

from exporter.commands.base import UsageError, log
from exporter.config import Config, LogSpec, default_run_name, file_run_name
from exporter.parsers.chain import known_formats
from exporter.sources.detect import is_log_folder, refusal

_LABEL_VALUE = re.compile(r"^[^\s{}]+$")  # as the config's run labels


def log_specs(cfg: Config, paths: list[str], run: str | None, fmt: str, *, child: LogSpec | None = None,
           gpu_only: bool = False) -> list[LogSpec]:
    """The logs to read: the config's, then those of --log. With `child` (the `run` command: the trainer's
    output, first, under its own name) no log is needed and standard input is not one. `gpu_only` (serve):
    no log is needed when a run is named, for the pods of a multi-node run that do not log."""
    known = known_formats(cfg.formats)
    if fmt not in known:
        raise UsageError(f"--format: unknown format {fmt!r} (known: {', '.join(known)})")
    check_run_label(run)
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


def check_run_label(run: str | None) -> None:
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
    bases = [file_run_name(p) for p in paths]  # the stems: `x/stdout`, `x/stderr`, where both were run `x`
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


def check_readable(specs: list[LogSpec]) -> None:
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
