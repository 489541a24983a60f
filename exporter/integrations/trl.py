"""A transformers `TrainerCallback` (TRL's trainers, or any HF Trainer) that feeds the sidecar exactly and can stop
the training on the exporter's word. Needs the `trl` extra: `pip install 'posttrain-exporter[trl]'`.

    from exporter.integrations.trl import ExporterFeedCallback

    trainer = GRPOTrainer(..., callbacks=[ExporterFeedCallback("/logs/feed.jsonl",
                                                               stop_file="/logs/posttrain-stop.json")])

and the sidecar follows the feed: `posttrain-exporter serve --log /logs/feed.jsonl --config exporter.yml`.

- The feed: every record the trainer logs (`on_log`: training, evaluation, the end-of-training summary) as the
  JSON line `{"step": N, ...}` with N = `state.global_step`, its values as `trainer_state.json` holds them, so
  the exporter gets the trainer's own steps whatever `logging_steps` and with `disable_tqdm=True`.
- The training: at every train start a new identity (a random id and the start time, `self.training`) heads its
  records in the feed, so that the exporter judges each training on its own, even in a feed reused by another.
- The stop: with `stop_file` (the exporter's config `early_stop.file`) and/or `verdict_url` (the exporter's
  address: its /api/v1/verdict), checked at the end of every step; when the exporter says a finding of the
  severity holds for this training (not another one's, not a finished run's, not at a step ahead of this one's:
  exporter/integrations/stopwatch.py), `control.should_training_stop` is set (and the step logged), with a
  warning that says why.
- In multi-process training the feed is written by the main process only, and its answer about the stop is
  shared with every rank (one broadcast per step), so that all ranks stop at the same step.

Nothing here raises into the trainer: a problem is logged once and training goes on."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from exporter.integrations.feed import STEP_KEY, FeedWriter
from exporter.integrations.gpu_feed import GpuFeedWriter
from exporter.integrations.stopwatch import SEVERITY_LEVELS, StopFileWatch, StopNotice, VerdictPoller
from exporter.parsers.training import LAUNCH_ENV, Training

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _never_raises(hook: F) -> F:
    """A callback hook that fails is logged (once per hook) and leaves the trainer's control as it was."""

    @functools.wraps(hook)
    def guarded(self: ExporterFeedCallback, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception:
            if hook.__name__ not in self._failed_hooks:
                self._failed_hooks.add(hook.__name__)
                log.exception("posttrain-exporter callback: %s failed; training goes on (further failures are not "
                              "logged)", hook.__name__)
        return None

    return guarded  # type: ignore[return-value]


class ExporterFeedCallback(TrainerCallback):
    """Writes each log record with its exact step to `path` and, when given `stop_file` or `verdict_url`, stops the
    training when the exporter raises its stop signal.

    path: the JSON-lines feed the sidecar follows (appended to; its folder is made if missing).
    stop_file: the exporter's `early_stop.file` (on a volume both see).
    verdict_url: the exporter's address (http://127.0.0.1:9847) or its /api/v1/verdict URL, asked every
        `verdict_interval_seconds` in a thread; `verdict_auth` (user, password) and `verdict_cafile` as its web
        config needs.
    run: only a signal for this run counts (the exporter's run label); default: any.
    stop_severity: with verdict_url, the lowest severity that stops: critical (pages, default) or warning (the
        stop file's severity is the exporter's early_stop.severity).
    gpu_feed: a file the trainer's GPUs are sampled into through NVML every `gpu_interval_seconds` (at least 0.5 s),
        by each node's main process, for a sidecar configured `gpu.source: feed` (gpu_feed.py).
    """

    def __init__(self, path: str | os.PathLike[str], *, stop_file: str | os.PathLike[str] | None = None,
                 verdict_url: str | None = None, run: str | None = None, stop_severity: str = "critical",
                 verdict_interval_seconds: float = 2.0, verdict_auth: tuple[str, str] | None = None,
                 verdict_cafile: str | None = None,
                 gpu_feed: str | os.PathLike[str] | None = None, gpu_interval_seconds: float = 1.0,
                 gpu_nvml: Any = None) -> None:
        if stop_severity not in SEVERITY_LEVELS:  # a mistake in the training script: said before training starts
            raise ValueError(f"stop_severity must be one of {', '.join(SEVERITY_LEVELS)}, got {stop_severity!r}")
        self.writer = FeedWriter(path)
        self.stop_file = StopFileWatch(stop_file, run) if stop_file is not None else None
        self.verdict = (VerdictPoller(verdict_url, run, stop_severity, verdict_interval_seconds, auth=verdict_auth,
                                      cafile=verdict_cafile) if verdict_url is not None else None)
        self.stopped: StopNotice | None = None  # why this callback stopped the training
        self.training: Training | None = None  # the training under way (made at its start)
        self._checked_step = -1
        self._failed_hooks: set[str] = set()
        # gpu_feed: the trainer's GPUs sampled into this file for the sidecar (gpu.source: feed; gpu_feed.py)
        self.gpu_feed = GpuFeedWriter(gpu_feed, gpu_interval_seconds, nvml=gpu_nvml) if gpu_feed is not None else None

    # --- hooks --------------------------------------------------------------------------------------------

    @_never_raises
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.stopped, self._checked_step = None, -1
        self.training = Training.new(state.global_step, os.environ.get(LAUNCH_ENV))
        if state.is_world_process_zero:
            self.writer.begin(self.training)
        if self.stop_file is not None:
            self.stop_file.start(self.training.id)
        if self.verdict is not None and state.is_world_process_zero:
            self.verdict.start(self.training.id)
        if self.gpu_feed is not None and state.is_local_process_zero:  # one writer per node, for its GPUs
            self.gpu_feed.start()

    @_never_raises
    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            self.writer.write(state.global_step, logged_record(state, logs))

    @_never_raises
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if (self.stop_file is None and self.verdict is None) or self.stopped or state.global_step == self._checked_step:
            return
        self._checked_step = state.global_step
        notice = self._notice(state.global_step) if state.is_world_process_zero else None
        notice = shared_from_main_process(notice)  # reached on every rank at every step, whatever happened above
        if notice is None:
            return
        self.stopped = notice
        control.should_training_stop = True
        control.should_log = True  # the step it stopped at is logged (and so fed), as the last step of a run is
        log.warning("posttrain-exporter: stopping the training at step %d: %s (from %s)%s", state.global_step,
                    notice.reason, notice.source,
                    f". The exporter's judgment: {notice.judgment}" if notice.judgment else "")

    @_never_raises
    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.writer.close()
        if self.verdict is not None:
            self.verdict.stop()
        if self.gpu_feed is not None:
            self.gpu_feed.stop()

    # --- helpers ------------------------------------------------------------------------------------------

    def _notice(self, step: int) -> StopNotice | None:
        try:
            for source in (self.stop_file, self.verdict):
                if source is not None and (notice := source.check(step)) is not None:
                    return notice
        except Exception:  # the sources never raise; were one to, the other ranks still wait for our broadcast
            if "check" not in self._failed_hooks:
                self._failed_hooks.add("check")
                log.exception("posttrain-exporter callback: checking the stop signal failed; training goes on")
        return None


def logged_record(state: TrainerState, logs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The record as `trainer_state.json` keeps it: Trainer.log appends {**logs, "step"} to log_history before it
    calls on_log, and callbacks called before this one may change `logs` (the console's pops total_flos)."""
    history = getattr(state, "log_history", None)
    last = history[-1] if history else None
    if isinstance(last, dict) and last.get(STEP_KEY) == state.global_step and logs.keys() <= last.keys():
        return last
    return logs


def shared_from_main_process(notice: StopNotice | None) -> StopNotice | None:
    """The main process's answer on every rank: ranks stopping at different steps would hang in their next
    collective. Every rank calls this at the same step (on_step_end); without torch.distributed it is a no-op."""
    try:
        import torch.distributed as dist
    except ImportError:
        return notice
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return notice
    box = [notice]
    dist.broadcast_object_list(box, src=0)
    return box[0]
