"""A fake NVML module for the GPU sampler's tests and benchmark.

It behaves like pynvml where the sampler can tell: the same function names and signatures
(tests/test_gpu.py checks them against the installed pynvml), the real exception classes (raised
as `pynvml.NVMLError(code)`, which pynvml maps to its per-code subclass, with `.value`), the real
ctypes structures for utilization and memory, str names and UUIDs, argument checks, and
Uninitialized before nvmlInit and after the last nvmlShutdown (NVML's init is reference counted).

What a test can set:
- FakeGpu fields: name, UUID, memory, power limit, and per-tick traces (a number, or a list indexed
  by the fake's tick, the last value held) for utilization, memory used and power;
- `lost`: every call on the GPU raises GpuIsLost (the handle is kept, as after a bus drop);
- `unsupported`: function names that raise NotSupported on this GPU;
- `errors`: function name -> NVML error code raised on every call of it (Timeout sleeps first);
- FakeNvml(init_error=...): nvmlInit fails (LibraryNotFound, DriverNotLoaded, Timeout, ...);
- FakeNvml.broken: every call fails with this code (the driver went away mid-run);
- FakeNvml(missing=...): function names the module does not have (an older pynvml).
`calls` counts the calls per function; `advance()` moves the traces and the energy counter on.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

Trace = float | Sequence[float]

# The same constants and exception classes as pynvml, so `fake.NVMLError_GpuIsLost` is pynvml's.
_EXPORTS = {k: v for k, v in vars(pynvml).items() if k.startswith(("NVML_", "NVMLError", "nvmlClocks"))}


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 2**30
    memory_used: Trace = 2 * 2**30
    utilization: Trace = 0  # percent, as NVML reports it
    power_mw: Trace = 70_000
    power_limit_mw: int = 700_000
    temperature: int = 35
    sm_clock_mhz: int = 1980
    energy_mj: int = 1_000_000  # at tick 0; then + power x 1 s per tick
    throttle_reasons: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (errorType, counterType) -> count
    retired_pages: dict[int, list[int]] = field(default_factory=dict)  # cause -> page addresses
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failure
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)


class _Handle:
    """Opaque like pynvml's c_nvmlDevice_t pointer."""

    __slots__ = ("gpu",)

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


def _at(trace: Trace, tick: int) -> float:
    if isinstance(trace, int | float):
        return trace
    return trace[min(tick, len(trace) - 1)]


def _absent(name: str):
    def get(self: Any) -> Any:
        raise AttributeError(f"module 'pynvml' has no attribute {name!r}")

    return get


class FakeNvml:
    def __init__(self, gpus: Sequence[FakeGpu] = (), *, init_error: int | None = None,
                 timeout_seconds: float = 0.0, missing: Sequence[str] = ()) -> None:
        self.__dict__.update(_EXPORTS)
        if missing:  # a subclass whose attributes raise AttributeError, as a module without them would
            self.__class__ = type("OlderFakeNvml", (type(self),), {n: property(_absent(n)) for n in missing})
        self.gpus = list(gpus)
        self.init_error = init_error
        self.timeout_seconds = timeout_seconds
        self.broken: int | None = None
        self.refcount = 0
        self.tick = 0
        self.calls: Counter[str] = Counter()

    def advance(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            for g in self.gpus:
                g.energy_mj += int(_at(g.power_mw, self.tick))  # mW x 1 s = mJ
            self.tick += 1

    # -- plumbing --

    def _raise(self, code: int) -> None:
        if code == pynvml.NVML_ERROR_TIMEOUT and self.timeout_seconds:
            time.sleep(self.timeout_seconds)
        raise pynvml.NVMLError(code)

    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if self.broken is not None:
            self._raise(self.broken)
        if self.refcount == 0:
            self._raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        self._enter(fn)
        if not isinstance(handle, _Handle):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = handle.gpu
        if g.lost:
            self._raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in g.errors:
            self._raise(g.errors[fn])
        return g

    # -- the functions the sampler uses, with pynvml's signatures --

    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        code = self.broken if self.broken is not None else self.init_error
        if code is not None:
            self._raise(code)
        self.refcount += 1

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.refcount -= 1

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            self._raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._enter("nvmlDeviceGetHandleByUUID")
        for g in self.gpus:
            if g.uuid == uuid:
                if g.lost:
                    self._raise(pynvml.NVML_ERROR_GPU_IS_LOST)
                return _Handle(g)
        self._raise(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUtilizationRates(self, handle):
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=int(_at(g.utilization, self.tick)), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if version is not None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only the v1 structure is faked
        used = int(_at(g.memory_used, self.tick))
        return pynvml.c_nvmlMemory_t(total=g.memory_total, free=g.memory_total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle):
        return int(_at(self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw, self.tick))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTemperature(self, handle, sensor):
        g = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.temperature

    def nvmlDeviceGetClockInfo(self, handle, type):
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type != pynvml.NVML_CLOCK_SM:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only the SM clock is faked
        return g.sm_clock_mhz

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        g = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if errorType not in (0, 1) or counterType not in (0, 1):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRetiredPages(self, device, sourceFilter):
        g = self._gpu(device, "nvmlDeviceGetRetiredPages")
        if sourceFilter not in (0, 1):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return list(g.retired_pages.get(sourceFilter, []))

    def nvmlDeviceGetRemappedRows(self, device):
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped_rows


def h100s(n: int, **kw: Any) -> list[FakeGpu]:
    """n H100s with distinct UUIDs (GPU-00000000-..., GPU-11111111-..., ...)."""
    return [FakeGpu(uuid=f"GPU-{str(i % 10) * 8}-aaaa-bbbb-cccc-{i:012d}", **kw) for i in range(n)]
