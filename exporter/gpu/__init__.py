"""GPU metrics from NVML, for the pods that train on GPUs.

    sampler.py    polls NVML in a background thread; immutable snapshots; failure handling
    phase.py      generation / training / idle per GPU, from power and utilization
    collector.py  the snapshot as Prometheus families (posttrain_gpu_*)

Wiring: `sampler = GpuSampler(config=SamplerConfig(...)); sampler.start();
registry.register(GpuCollector(sampler))`, and `sampler.stop()` on exit.
"""

from exporter.gpu.collector import GpuCollector
from exporter.gpu.phase import PhaseConfig, PhaseTracker
from exporter.gpu.sampler import GpuSampler, GpuSnapshot, SamplerConfig

__all__ = ["GpuCollector", "GpuSampler", "GpuSnapshot", "PhaseConfig", "PhaseTracker", "SamplerConfig"]
