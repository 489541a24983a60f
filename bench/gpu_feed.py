"""What the trainer's GPU feed costs (gpu.source: feed): CPU per sample of the trainer-side writer
(exporter/integrations/gpu_feed.py: one sampler poll, the JSON line, the write) against the sampler's poll alone, and
the sidecar-side reader's CPU per line (exporter/gpu/feed_samples.py: parse, the phase per GPU), with 8 GPUs of the
fake NVML (tests/fake_nvml.py).

    .venv/bin/python bench/gpu_feed.py [--gpus 8] [--samples 2000] [--repeat 3]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

from exporter.gpu.feed_samples import FeedGpuReader  # noqa: E402
from exporter.gpu.sampler import GpuSampler, SamplerConfig  # noqa: E402
from exporter.integrations.gpu_feed import GpuFeedWriter  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()

    def gpus() -> list[FakeGpu]:  # generation and training power in turn, as in bench/gpu_sampler.py
        return [FakeGpu(f"GPU-{i:04d}", utilization=[100, 97], power_mw=[640_000, 380_000]) for i in range(a.gpus)]

    res: dict[str, list[float]] = {"sampler poll": [], "writer sample": [], "reader line": []}
    size = 0
    for _ in range(a.repeat):
        sampler = GpuSampler(FakeNvml(gpus()), SamplerConfig(slow_interval_seconds=3600.0), env={})
        sampler.poll_once()  # NVML init, left out
        c = time.thread_time()
        for _ in range(a.samples):
            sampler.poll_once()
        res["sampler poll"].append((time.thread_time() - c) / a.samples * 1e6)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "gpu-samples.jsonl")
            writer = GpuFeedWriter(path, nvml=FakeNvml(gpus()), env={})
            writer.sample_once()
            c = time.thread_time()
            for _ in range(a.samples):
                writer.sample_once()
            res["writer sample"].append((time.thread_time() - c) / a.samples * 1e6)
            writer.stop()
            size = os.path.getsize(path) / (a.samples + 1)
            reader = FeedGpuReader(path, stale_after_seconds=1e9)
            c, lines = time.thread_time(), 0
            while (snap := reader.poll_once()).polls > lines:  # a chunk per look
                lines = snap.polls
            res["reader line"].append((time.thread_time() - c) / lines * 1e6)
    for name, values in res.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:14s} median {statistics.median(values):7.1f} us CPU  (runs: {runs})")
    print(f"line size {size:.0f} bytes ({a.gpus} GPUs)")


if __name__ == "__main__":
    main()
