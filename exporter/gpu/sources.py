"""Where a run's GPU data come from, and whether it should have any.

Three sources feed the same posttrain_gpu_* families (docs/gpu.md "Where GPU data come from"):

    nvml   the sidecar's own NVML (sampler.py): bare metal, Slurm, a VM, or a pod given the GPUs explicitly
    feed   the trainer's own process samples NVML (exporter/integrations/gpu_feed.py) into a file beside its
           feed; the sidecar reads it (feed_samples.py): the trainer sees its GPUs where the sidecar does not
    dcgm   dcgm-exporter, joined to the sidecar's pod by namespace and pod in Prometheus recording rules
           (dcgm.py): the sidecar reads no GPU at all

The sidecar says which one it was configured with (posttrain_gpu_source_configured{source}), whether that source
gave data at its last look (posttrain_gpu_source_active{source}; the recording rules add source="dcgm"), and
whether the run trains on GPUs (posttrain_gpu_training_expected): the alert PostTrainGPUDataMissing reads them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

GPU_SOURCES: tuple[str, ...] = ("dcgm", "feed", "nvml")
DEFAULT_SOURCE = "nvml"  # the exporter's own default (bare metal); the Helm chart defaults to dcgm


class GpuSourceCollector(Collector):
    """The source series of one exporter. `active()` says whether its local source (nvml or feed) gave GPU readings
    at the last look (None for dcgm, whose activity only Prometheus sees); `trainer_has_gpus()` whether the trainer
    said it runs on GPUs (the GPU feed's header)."""

    def __init__(self, source: str, expected: bool, active: Callable[[], bool] | None = None,
                 assigned: Callable[[], bool] | None = None,
                 trainer_has_gpus: Callable[[], bool] | None = None) -> None:
        if source not in GPU_SOURCES:
            raise ValueError(f"gpu source must be one of {', '.join(GPU_SOURCES)}, got {source!r}")
        self.source, self.expected = source, expected
        self._active, self._assigned, self._trainer = active, assigned, trainer_has_gpus

    def training_expected(self) -> bool:
        """The run trains on GPUs, as far as the exporter knows: its config says so, GPUs are assigned to its own
        NVML, or the trainer's GPU feed says it has CUDA devices. (A pod that requests GPUs is known to Prometheus
        through kube-state-metrics: the alert reads that too.)"""
        return (self.expected or (self._assigned is not None and self._assigned())
                or (self._trainer is not None and self._trainer()))

    def collect(self) -> Iterator[Metric]:
        configured = GaugeMetricFamily("posttrain_gpu_source_configured", "1 for the GPU data source this exporter "
                                       "is configured with (gpu.source: dcgm, feed or nvml).", labels=["source"])
        configured.add_metric([self.source], 1.0)
        yield configured
        expected = GaugeMetricFamily("posttrain_gpu_training_expected", "1 when the run trains on GPUs as far as "
                                     "the exporter knows (gpu.expected in its config, GPUs assigned to its NVML, or "
                                     "the trainer's GPU feed reports CUDA devices); PostTrainGPUDataMissing fires "
                                     "when such a run has GPU data from no source.")
        expected.add_metric([], 1.0 if self.training_expected() else 0.0)
        yield expected
        if self._active is not None:
            active = GaugeMetricFamily("posttrain_gpu_source_active", "1 when this source gave GPU readings at its "
                                       "last look (nvml: the last poll read a GPU and is not stale; feed: the "
                                       "trainer's GPU samples are fresh); the recording rules add "
                                       "source=\"dcgm\" for dcgm-exporter's.",
                                       labels=["source"])
            active.add_metric([self.source], 1.0 if self._active() else 0.0)
            yield active
