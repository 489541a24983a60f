"""GPU metrics from NVML, for the pods that train on GPUs.

    sampler.py     polls NVML in a background thread (the NVML lifecycle); immutable snapshots; failure handling
    visibility.py  which GPUs: CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES, matched against NVML's list
    fields.py      the one table of one-value fields: NVML call, conversion, family, HELP, DCGM field
    phase.py       generation / training / idle per GPU, from power and utilization
    collector.py   the snapshot as Prometheus families (posttrain_gpu_*)

Wiring: `sampler = GpuSampler(config=SamplerConfig(...)); sampler.start();
registry.register(GpuCollector(sampler))`, and `sampler.stop()` on exit.
"""

from exporter.gpu.collector import GpuCollector
from exporter.gpu.phase import PhaseConfig, PhaseTracker
from exporter.gpu.sampler import GpuSampler, GpuSnapshot, SamplerConfig

__all__ = ["GpuCollector", "GpuSampler", "GpuSnapshot", "PhaseConfig", "PhaseTracker", "SamplerConfig"]
