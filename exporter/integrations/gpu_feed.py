"""The trainer's GPU samples for the sidecar (gpu.source: feed, docs/gpu.md "Where GPU data come from").

In a pod, only the container that requests GPUs sees them; the sidecar's NVML sees none. The trainer does: this
polls NVML in the trainer's process, in a daemon thread, at most once per `interval_seconds` (never faster than
MIN_INTERVAL_SECONDS), and appends each poll as one line (exporter/gpu/feed_samples.py) to a file beside the
feed, which the sidecar follows. The poll is the sidecar's own sampler (exporter/gpu/sampler.py: the same fields,
the same failure handling); its cost is the sampler's (bench/README.md "GPU sampler").

Nothing here raises into the trainer: NVML missing is a line with `nvml_up: false` (and the sidecar's
PostTrainGPUDataMissing says so when the run has GPUs), a failed write is logged once and tried again at the next
poll. One writer per node: the local main process (each node's sidecar reads its own node's file)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from types import ModuleType
from typing import IO, Any

from exporter.gpu.feed_samples import sample_line
from exporter.gpu.sampler import GpuSampler, SamplerConfig

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 0.5  # the bound on the rate: NVML calls cost the trainer's host CPU


def cuda_device_count() -> int:
    """CUDA devices of the trainer, without importing torch when the trainer did not (0 without torch or CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # a broken CUDA install: the samples say nvml_up false and no device
        return 0


class GpuFeedWriter:
    """Samples the trainer's GPUs into `path` every `interval_seconds` in a daemon thread (`start`/`stop`)."""

    def __init__(self, path: str | os.PathLike[str], interval_seconds: float = 1.0, *, nvml: ModuleType | Any = None,
                 env: dict[str, str] | None = None) -> None:
        self.path = os.fspath(path)
        self.interval = max(float(interval_seconds), MIN_INTERVAL_SECONDS)
        # the slow fields (ECC, retired pages) stay the sidecar's business: not sampled in the trainer
        self.sampler = GpuSampler(nvml, SamplerConfig(interval_seconds=self.interval, slow_interval_seconds=3600.0),
                                  env=env)
        self.written = 0
        self.lost = 0
        self._file: IO[str] | None = None
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="posttrain-gpu-feed", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with contextlib.suppress(Exception):
            self.sampler.stop(timeout)
        self._close()

    def sample_once(self) -> bool:
        """One poll, one line; False when it could not be written. Never raises."""
        try:
            snap = self.sampler.poll_once()
            line = sample_line(time.time(), snap.gpus, snap.nvml_up, cuda_device_count())
            if self._file is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (kept open across polls)
            self._file.write(line)
            self._file.flush()
        except Exception as e:  # a full disk, a vanished volume: never the trainer's problem
            self.lost += 1
            self._close()
            if not self._failing:
                self._failing = True
                log.warning("posttrain-exporter GPU feed: cannot write %s (%s); training goes on, retried at the "
                            "next poll", self.path, e)
            return False
        self.written += 1
        if self._failing:
            self._failing = False
            log.warning("posttrain-exporter GPU feed: writing %s again (%d samples were lost)", self.path, self.lost)
        return True

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # a slow poll: skip the missed ticks, never burst
                next_at = now + self.interval
            self._stop.wait(next_at - now)

    def _close(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()
