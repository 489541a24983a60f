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
import time
from types import ModuleType
from typing import Any

from exporter.gpu.feed_samples import sample_line
from exporter.gpu.sampler import GpuSampler, SamplerConfig
from exporter.integrations.appender import AppendingWriter, LineAppender
from exporter.periodic import Periodic

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


class GpuFeedWriter(AppendingWriter):
    """Samples the trainer's GPUs into `path` every `interval_seconds` in a daemon thread (`start`/`stop`)."""

    def __init__(self, path: str | os.PathLike[str], interval_seconds: float = 1.0, *, nvml: ModuleType | Any = None,
                 env: dict[str, str] | None = None) -> None:
        self.path = os.fspath(path)
        self.interval = max(float(interval_seconds), MIN_INTERVAL_SECONDS)
        # the slow fields (ECC, retired pages) stay the sidecar's business: not sampled in the trainer
        self.sampler = GpuSampler(nvml, SamplerConfig(interval_seconds=self.interval, slow_interval_seconds=3600.0),
                                  env=env)
        self._out = LineAppender(path, "GPU feed", "sample", log)
        self._loop = Periodic(self.sample_once, self.interval, "posttrain-gpu-feed")

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._loop.stop(timeout)
        with contextlib.suppress(Exception):
            self.sampler.stop(timeout)
        self._out.close()

    def sample_once(self) -> bool:
        """One poll, one line; False when it could not be written. Never raises."""
        def line() -> str:
            snap = self.sampler.poll_once()
            return sample_line(time.time(), snap.gpus, snap.nvml_up, cuda_device_count())
        return self._out.put(line)
