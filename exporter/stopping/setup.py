"""The stop by signals as `run` and `serve` set it up (config `early_stop.action: signal`): which trainer, which run,
and the hook on the stop signal. Small on purpose: the commands call one function each."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.config import ConfigError
from exporter.stopping.stopper import TrainerStopper, record_path
from exporter.stopping.targets import ChildGroup, MatchedProcesses

if TYPE_CHECKING:
    from exporter.app import Exporter

log = logging.getLogger(__name__)


def stop_child(exporter: Exporter, run: str, pid: int, running: Callable[[], bool]) -> None:
    """`run`: the trainer it started (its process group), stopped on a stop raised for its run only."""
    signal = exporter.stop_signal
    if signal is None or not signal.settings.signals:
        return
    s = signal.settings
    if s.process is not None or s.pid is not None:
        log.info("early stop: run signals the trainer it started; early_stop.process and pid are for serve")
    _hook(exporter, TrainerStopper(s, run, ChildGroup(pid, running)))


def stop_sidecar_trainer(exporter: Exporter, runs: list[str]) -> None:
    """`serve`: the trainer beside it, by early_stop.process or pid, for the one run it reads (`runs`: the runs of
    its logs, `--run` first when given); a stop file per run holds its record (so a restart stops no run twice)."""
    signal = exporter.stop_signal
    if signal is None or not signal.settings.signals:
        return
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
    _hook(exporter, TrainerStopper(s, names[0], target, record_path(signal.path_for(names[0]))))


def _hook(exporter: Exporter, stopper: TrainerStopper) -> None:
    assert exporter.stop_signal is not None
    exporter.stop_signal.listeners.append(stopper.request)
    stopper.on_sent = exporter.trainer_stopped
    exporter.trainer_stopper = stopper
    s = stopper.settings
    log.info("early stop: a %s finding of run %s sends %s to %s (SIGTERM after %gs, SIGKILL %gs later)", s.severity,
             stopper.run, s.signal, stopper.target.describe(), s.grace_seconds, s.kill_after_seconds)
