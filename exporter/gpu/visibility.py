"""Which GPUs this pod sees: CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (or the config's visible_devices) parsed
as CUDA parses them, and matched against the GPUs NVML lists. Pure functions; the sampler (sampler.py) calls them
once, at construction and at each NVML init."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

# The sampler's logger: every line about the GPUs comes under one name (docs/gpu.md).
log = logging.getLogger("exporter.gpu.sampler")


@dataclass(frozen=True)
class Visibility:
    source: str  # the variable it came from, or "default"
    entries: tuple[str, ...] | None  # indices or GPU-UUIDs (or prefixes); None: every GPU NVML lists
    # MIG instances named (MIG-...): GPUs are assigned, but instances are not sampled, so they give no data (and the
    # GPU-data alert says so) rather than reading as a pod without GPUs
    mig: tuple[str, ...] = ()

    @property
    def none(self) -> bool:
        return self.entries == () and not self.mig


def parse_visibility(source: str, value: str) -> Visibility:
    v = value.strip()
    if v.lower() == "all":
        return Visibility(source, None)
    if v.lower() in ("", "none", "void"):
        return Visibility(source, ())
    entries: list[str] = []
    mig: list[str] = []
    for item in (i.strip() for i in v.split(",")):
        if item.isdigit() or item.upper().startswith("GPU-"):
            entries.append(item)
        elif item.upper().startswith("MIG-"):
            mig.append(item)
        else:
            break  # as CUDA does: an invalid entry hides itself and every entry after it ("-1" = none)
    if mig:
        log.warning("%s: MIG instance%s %s not sampled (NVML gives a MIG instance no utilisation or power): the GPU "
                    "board stays without %s, and PostTrainGPUDataMissing says so unless another source (dcgm) gives "
                    "data or gpu.expected is false", source, "s" if len(mig) > 1 else "", ", ".join(mig),
                    "them" if len(mig) > 1 else "it")
    return Visibility(source, tuple(entries), tuple(mig))


def visibility_from_env(env: Mapping[str, str]) -> Visibility:
    """CUDA_VISIBLE_DEVICES (the process's own view) wins over NVIDIA_VISIBLE_DEVICES (the container's)."""
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if var in env:
            return parse_visibility(var, env[var])
    return Visibility("default", None)


def select_devices(vis: Visibility, found: list[tuple[int, str]]) -> tuple[list[int], list[str]]:
    """NVML indices to sample (in NVML order) among `found` (index, uuid), and the entries that matched none.

    Indices are NVML's (PCI bus order, as nvidia-smi); CUDA's ordinals are the same with
    CUDA_DEVICE_ORDER=PCI_BUS_ID, and on identical GPUs. UUIDs (or unique prefixes) are exact."""
    if vis.entries is None:
        return [i for i, _ in found], []
    if (vis.source == "NVIDIA_VISIBLE_DEVICES" and vis.entries and all(e.isdigit() for e in vis.entries)
            and len(found) == len(set(vis.entries))):
        # Inside a container the runtime already applied these host indices: NVML lists only them.
        return [i for i, _ in found], []
    chosen: set[int] = set()
    unmatched: list[str] = []
    for e in vis.entries:
        if e.isdigit():
            hits = [i for i, _ in found if i == int(e)]
        else:
            hits = [i for i, u in found if u.lower().startswith(e.lower())]
        if len(hits) == 1:
            chosen.add(hits[0])
        else:
            unmatched.append(e)
    return sorted(chosen), unmatched
