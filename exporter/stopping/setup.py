"""The stop by signals as `run` and `serve` set it up (config `early_stop.action: signal`): which trainer, which run,
and the hook on the stop signal. Small on purpose: the commands call one function each."""

from __future__ import annotations

import logging
from collections.abc import Callable

from exporter.config import ConfigError, EarlyStopSettings
from exporter.stopping.stopper import TrainerStopper, record_path
from exporter.stopping.targets import ChildGroup, MatchedProcesses
from exporter.stopsignal import StopSignal

log = logging.getLogger(__name__)


def stopper_for_child(signal: StopSignal | None, run: str, pid: int,
                      running: Callable[[], bool]) -> TrainerStopper | None:
    """`run`: the trainer it started (its process group), stopped on a stop raised for its run only."""
    if signal is None or not signal.settings.signals:
        return None
    s = signal.settings
    if s.process is not None or s.pid is not None:
        log.info("early stop: run signals the trainer it started; early_stop.process and pid are for serve")
    return _hooked(signal, TrainerStopper(s, run, ChildGroup(pid, running)))


def stopper_for_sidecar(signal: StopSignal | None, runs: list[str]) -> TrainerStopper | None:
    """`serve`: the trainer beside it, by early_stop.process or pid, for the one run it reads (`runs`: the runs of
    its logs, `--run` first when given); a stop file per run holds its record (so a restart stops no run twice)."""
    if signal is None or not signal.settings.signals:
        return None
    s = signal.settings
    if s.process is None and s.pid is None:
        raise ConfigError("early_stop.process: serve is not the trainer's parent: name the trainer by a piece of its "
                          "command line (process: verl.trainer.main_ppo) or its pid, in a pod with "
                          "shareProcessNamespace: true")
    names = list(dict.fromkeys(runs))
    if len(names) != 1:
        raise ConfigError(f"early_stop.action: signal stops one trainer, but serve reads {len(names)} runs "
                          f"({', '.join(names) or 'none'}): name the trainer's run with --run")
    target = MatchedProcesses(s.process, s.pid)
    return _hooked(signal, TrainerStopper(s, names[0], target, record_path(signal.path_for(names[0]))))


def _hooked(signal: StopSignal, stopper: TrainerStopper) -> TrainerStopper:
    signal.listeners.append(stopper.request)
    s: EarlyStopSettings = signal.settings
    log.info("early stop: a %s finding of run %s sends %s to %s (SIGTERM after %gs, SIGKILL %gs later)", s.severity,
             stopper.run, s.signal, stopper.target.describe(), s.grace_seconds, s.kill_after_seconds)
    return stopper
