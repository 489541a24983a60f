"""The exporter's GPU side for its configured source (sources.py): what runs (the NVML sampler, the trainer's
GPU feed reader, or nothing for dcgm) and the collectors to register. The CLI starts, polls and stops it."""

from __future__ import annotations

from prometheus_client.registry import Collector

from exporter.gpu.collector import GpuCollector
from exporter.gpu.feed_samples import FeedGpuReader
from exporter.gpu.sampler import GpuSampler, SamplerConfig
from exporter.gpu.sources import GpuSourceCollector


class GpuService:
    def __init__(self, source: str, sampler: SamplerConfig, expected: bool = False,
                 feed_file: str | None = None) -> None:
        self.source = source
        self.reader: GpuSampler | FeedGpuReader | None = None
        if source == "nvml":
            nvml = self.reader = GpuSampler(config=sampler)
            self.sources = GpuSourceCollector(source, expected, active=nvml.active,
                                              assigned=lambda: nvml.expected)
        elif source == "feed":
            if not feed_file:
                raise ValueError("gpu.source feed needs gpu.feed_file")
            feed = self.reader = FeedGpuReader(feed_file, sampler.interval_seconds, phase=sampler.phase)
            self.sources = GpuSourceCollector(source, expected, active=feed.active,
                                              trainer_has_gpus=feed.trainer_has_gpus)
        else:  # dcgm: the GPUs are read by dcgm-exporter and joined in Prometheus (gpu/rules.py)
            self.sources = GpuSourceCollector(source, expected)

    def collectors(self) -> list[Collector]:
        return [self.sources] + ([GpuCollector(self.reader)] if self.reader is not None else [])

    def start(self) -> None:
        if self.reader is not None:
            self.reader.start()

    def poll_once(self) -> None:
        if self.reader is not None:
            self.reader.poll_once()

    def stop(self) -> None:
        if self.reader is not None:
            self.reader.stop()
