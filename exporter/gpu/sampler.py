"""NVML sampler: reads the GPUs visible to this pod in a background thread, one poll per interval,
and keeps the latest reading as an immutable snapshot that scrapes only copy out.

Failure behaviour (the sampler never raises into its caller):

- NVML cannot start (no library, no driver, a timeout): `nvml_up` is 0, the error is
  counted by kind, one line is logged, and nvmlInit is retried with exponential backoff
  (backoff_initial_seconds doubling up to backoff_max_seconds). When it comes back, one line.
- NVML fails for every device mid-run (Uninitialized, DriverNotLoaded, ...): the same, after a
  best-effort nvmlShutdown.
- One field of one GPU fails (a timeout, no permission): that field is missing from this poll, the
  others are read; one line when the field starts failing, one when it reads again.
- A field the GPU does not have (NotSupported, FunctionNotFound from its first answer on): never exported, never
  asked again until NVML is re-initialized, not an error; said once per GPU at info, naming the fields. A field that
  answered before and then says NotSupported (a transient answer, a mode change) is an error for that poll, counted
  (kind not_supported) and asked again at the next poll, like any failing field.
- A value no GPU can have (utilization above 100 %, power above 10 kW such as NVML's 0xFFFFFFFF "no value",
  memory used above total, a negative one): not exported for that poll, counted (kind out_of_range), one line
  when it starts and one when it ends.
- A GPU falls off the bus (GpuIsLost, ResetRequired): its series are dropped, `posttrain_gpu_up` for
  it is 0, the other GPUs are still read, and the lost one is probed again with backoff. The same for a GPU
  already lost when NVML starts (its UUID unknown until it answers: probed by index; under UUID visibility kept
  while an entry matches no GPU, and dropped if it turns out to be another's). A GPU that
  answers no field in a poll (every call failing, handle still valid) is not up either, for that poll.
- An NVML call that never returns (a wedged driver): the thread cannot say so itself, so `snapshot()`
  does. Once no poll has finished for `SamplerConfig.stale_after_seconds`, it reports NVML down and no
  GPU (nothing frozen is served as current), logs one warning, and one line when a poll finishes again.

The module is injected (`nvml=`), `import pynvml` by default, so tests run a fake with the same
functions and the real exception classes.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, NamedTuple

from exporter.gpu.fields import READS, out_of_range
from exporter.gpu.phase import PhaseByGpu, PhaseConfig, PhaseReading
from exporter.gpu.visibility import parse_visibility, select_devices, visibility_from_env
from exporter.periodic import Periodic

log = logging.getLogger(__name__)

# nvml.h enum values (ABI-stable), passed as arguments so the sampler does not depend on the
# module's constants (the one-value fields' own are in fields.py).
ECC_TYPES: tuple[tuple[str, int], ...] = (("corrected", 0), ("uncorrected", 1))  # nvmlMemoryErrorType_t
ECC_SCOPES: tuple[tuple[str, int], ...] = (("volatile", 0), ("aggregate", 1))  # nvmlEccCounterType_t
RETIREMENT_CAUSES: tuple[tuple[str, int], ...] = (  # nvmlPageRetirementCause_t
    ("multiple_single_bit_ecc", 0), ("double_bit_ecc", 1))
# nvmlClocksEventReason* bits (formerly nvmlClocksThrottleReason*, same values).
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
    ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20), ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80), ("display_clock_setting", 0x100),
)

# A poll is ~0.1 ms of work per GPU (docs/gpu.md "Cost"), but a healthy one can still take seconds: nvmlInit
# without persistence mode, or a call that NVML itself times out (NVML_ERROR_TIMEOUT). Only a snapshot older than
# three intervals (two polls missed) and this floor says a call has hung; 30 s is also how old the trainer's GPU
# feed may get (feed_samples.py), and far inside the alerts' 3 and 10 minutes.
STALE_FLOOR_SECONDS = 30.0

# Error kinds (snake_case of the NVMLError subclass) by what they mean for the sampler.
UNSUPPORTED = frozenset({"not_supported", "function_not_found"})
DEVICE_LOST = frozenset({"gpu_is_lost", "reset_required"})
NVML_DOWN = frozenset({"uninitialized", "driver_not_loaded", "library_not_found", "lib_rm_version_mismatch"})


def error_kind(e: BaseException) -> str:
    """`NVMLError_GpuIsLost` -> gpu_is_lost; other exceptions by their own class name."""
    name = type(e).__name__
    if name == "NVMLError":  # an error code this pynvml has no subclass for
        return f"nvml_error_{getattr(e, 'value', 'unknown')}"
    name = name.removeprefix("NVMLError_")
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


_THROTTLE_CACHE: dict[int, tuple[tuple[str, float], ...]] = {}


def _throttle_series(bits: int) -> tuple[tuple[str, float], ...]:
    """(reason, 0/1) per known reason; cached by bit pattern (they rarely change, and 2^9 at most)."""
    bits &= (1 << 9) - 1
    out = _THROTTLE_CACHE.get(bits)
    if out is None:
        out = _THROTTLE_CACHE[bits] = tuple((n, 1.0 if bits & b else 0.0) for n, b in THROTTLE_REASONS)
    return out


# --- the snapshot --------------------------------------------------------------------------------


class GpuReading(NamedTuple):
    """One GPU at one poll. None: not read this poll (an error) or not supported by this GPU.

    A NamedTuple rather than a frozen dataclass: as immutable, and a quarter of the poll's own
    cost cheaper to build (one per GPU per poll)."""

    index: int
    uuid: str
    model: str
    up: bool  # False: lost (GpuIsLost) or no field answered this poll; then every other field is empty
    utilization_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    energy_joules: float | None = None
    throttle_reasons: tuple[tuple[str, float], ...] = ()
    ecc_errors: tuple[tuple[str, str, float], ...] = ()  # (type, scope, count)
    retired_pages: tuple[tuple[str, float], ...] = ()  # (cause, count)
    remapped_rows: tuple[tuple[str, float], ...] = ()  # (cause, count)
    row_remap_pending: float | None = None
    row_remap_failure: float | None = None
    phase: PhaseReading | None = None

    @property
    def labels(self) -> tuple[str, str, str]:
        return str(self.index), self.uuid, self.model


@dataclass(frozen=True)
class GpuSnapshot:
    nvml_up: bool = False
    gpus: tuple[GpuReading, ...] = ()
    visible_devices: int | None = None  # None: unknown (NVML down)
    errors: tuple[tuple[str, int], ...] = ()  # (kind, count), cumulative
    polls: int = 0
    poll_seconds: float = 0.0  # wall time spent polling, cumulative
    cpu_seconds: float = 0.0  # CPU time of the polling thread spent polling, cumulative
    last_poll_timestamp: float | None = None  # Unix time
    expected: bool = False  # GPUs are assigned to this process (visible devices named, not unset or none)


@dataclass(frozen=True)
class SamplerConfig:
    interval_seconds: float = 1.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    # ECC counts, retired pages and remapped rows change rarely: read them this often, not every poll.
    slow_interval_seconds: float = 30.0
    visible_devices: str | None = None  # overrides the environment (same syntax as CUDA_VISIBLE_DEVICES)
    phase: PhaseConfig = field(default_factory=PhaseConfig)

    @property
    def stale_after_seconds(self) -> float:
        """Age past which the last snapshot means a hung NVML call (see STALE_FLOOR_SECONDS)."""
        return max(3.0 * self.interval_seconds, STALE_FLOOR_SECONDS)

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        if not 0 < self.backoff_initial_seconds <= self.backoff_max_seconds:
            raise ValueError("need 0 < backoff_initial_seconds <= backoff_max_seconds")
        if self.slow_interval_seconds < 0:
            raise ValueError("slow_interval_seconds must be >= 0")


# --- internals -----------------------------------------------------------------------------------


class _Backoff:
    def __init__(self, initial: float, cap: float) -> None:
        self.initial, self.cap = initial, cap
        self.delay = initial
        self.next_at = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> float:
        wait = self.delay
        self.next_at = now + wait
        self.delay = min(self.delay * 2.0, self.cap)
        return wait

    def reset(self) -> None:
        self.delay = self.initial
        self.next_at = float("-inf")


class _DeviceLost(Exception):
    def __init__(self, kind: str, error: BaseException) -> None:
        super().__init__(kind)
        self.kind, self.error = kind, error


class _NvmlDown(Exception):
    def __init__(self, kind: str, error: BaseException) -> None:
        super().__init__(kind)
        self.kind, self.error = kind, error


@dataclass
class _Device:
    index: int
    uuid: str
    model: str
    handle: Any
    backoff: _Backoff
    lost: bool = False
    # Unreadable at init and kept only because a UUID entry of the visibility matched no GPU: judged once readable.
    maybe_foreign: bool = False
    foreign: bool = False  # ... and it was not one of ours: no longer sampled
    unsupported: set[str] = field(default_factory=set)
    supported: set[str] = field(default_factory=set)  # fields that answered once: NotSupported is an error for them
    new_unsupported: list[str] = field(default_factory=list)  # found unsupported in this poll, to be said once
    slow_at: float = float("-inf")  # next time the slow fields are due
    slow: dict[str, Any] = field(default_factory=dict)  # last slow readings, carried between slow reads


# Error kinds that mean this machine has no NVIDIA driver at all (rather than a driver that failed).
NO_NVML_HERE = frozenset({"library_not_found", "driver_not_loaded", "module_not_found_error", "import_error"})


class GpuSampler:
    """Polls NVML; `start()` runs the thread, `poll_once()` polls in the caller (tests, bench),
    `snapshot()` returns the latest reading (for the collector)."""

    def __init__(self, nvml: ModuleType | Any | None = None, config: SamplerConfig | None = None, *,
                 env: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config or SamplerConfig()
        self._nvml = nvml
        self._clock, self._wall = clock, wall_clock
        cfg = self.config
        self.visibility = (parse_visibility("config", cfg.visible_devices) if cfg.visible_devices is not None
                           else visibility_from_env(os.environ if env is None else env))
        self._backoff = _Backoff(cfg.backoff_initial_seconds, cfg.backoff_max_seconds)
        self._up = False
        self._ever_up = False  # NVML worked here once: its loss is a fault, whatever the machine was given
        self._devices: list[_Device] = []
        self._phases = PhaseByGpu(cfg.phase, cfg.interval_seconds)  # by UUID, so a re-init keeps the windows
        self._errors: Counter[str] = Counter()
        # Last logged state per key, so that a state logs one line when it changes, not one per poll:
        # "nvml" ("up" or an error kind), "visibility", "gpu0" (a kind while lost) ...
        self._states: dict[str, str] = {}
        # ... and per failing field ("gpu0/power" -> kind), kept apart so the common case checks an empty dict.
        self._field_states: dict[str, str] = {}
        self._said_unsupported: set[tuple[str, str]] = set()  # (UUID, field) said to be unsupported
        self._polls = 0
        self._poll_seconds = 0.0
        self._cpu_seconds = 0.0
        self._lock = threading.Lock()
        self._snapshot = GpuSnapshot(visible_devices=0 if self.visibility.none else None, expected=self.expected)
        # self._clock() when the last poll finished (or the thread started), and whether a scrape found the thread
        # stuck since: both under the lock, so the stuck line and the moving-again line pair up.
        self._snapshot_at: float | None = None
        self._stuck = False
        self._loop = Periodic(self.poll_once, self.config.interval_seconds, "gpu-sampler", clock=time.monotonic)

    @property
    def expected(self) -> bool:
        """GPUs were assigned: the config or CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES names some (or
        all). A pod without GPUs has neither set (or `void`): NVML is absent there by design."""
        return self.visibility.source != "default" and not self.visibility.none

    # -- public API --

    def snapshot(self) -> GpuSnapshot:
        """The last poll's snapshot; while the thread runs and that is older than `stale_after_seconds`, the same
        with NVML down and no GPU: a hung call must not keep the last values (and `nvml_up` 1) on the board.
        The counters and the last poll's timestamp stay."""
        bound = self.config.stale_after_seconds
        with self._lock:
            snap, at = self._snapshot, self._snapshot_at
            # Only the thread's polls are due on time: a caller polling by hand (tests, `dump`) polls when it likes.
            age = 0.0 if at is None or not self._loop.running else self._clock() - at
            if age <= bound:
                return snap
            newly, self._stuck = not self._stuck, True
        if newly:
            log.warning("GPU sampler: no poll has finished for %.0fs (an NVML call has not returned); reporting NVML "
                        "down and no GPU values until one does", age)
        return replace(snap, nvml_up=False, gpus=(), visible_devices=None)

    def active(self) -> bool:
        """The last poll read a GPU (posttrain_gpu_source_active): a lost or unanswering GPU is not data."""
        return any(g.up for g in self.snapshot().gpus)

    def start(self) -> None:
        if self._loop.running:
            return
        with self._lock:  # the first poll is due from now: one that hangs (in nvmlInit) goes stale too
            self._snapshot_at = self._clock()
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        if not self._loop.stop(timeout):  # stuck in an NVML call: shutting NVML down under it would race
            log.warning("GPU sampler: thread still in an NVML call after %gs; leaving it (daemon)", timeout)
            return
        if self._up:
            self._shutdown()
            self._up = False

    def poll_once(self) -> GpuSnapshot:
        """One poll; never raises. Also what the thread runs each interval."""
        t0, c0 = time.perf_counter(), time.thread_time()
        readings: list[GpuReading] = []
        try:
            readings = self._poll(self._clock())
        except Exception as e:  # a bug or a ctypes surprise must not kill the thread or the scrape
            kind = error_kind(e)
            self._errors[kind] += 1
            if self._up:
                self._shutdown()
            self._up = False
            wait = self._backoff.failed(self._clock())
            self._transition(self._states, "nvml", kind, f"GPU sampler: unexpected {type(e).__name__}: {e}; GPU "
                             f"metrics off, retrying NVML in {wait:g}s", logging.ERROR, exc_info=True)
        self._polls += 1
        self._poll_seconds += time.perf_counter() - t0
        self._cpu_seconds += time.thread_time() - c0
        visible = len(self._devices) if self._up else (0 if self.visibility.none else None)
        snap = GpuSnapshot(self._up, tuple(readings), visible, tuple(sorted(self._errors.items())), self._polls,
                           self._poll_seconds, self._cpu_seconds, self._wall(), self.expected)
        with self._lock:
            self._snapshot, self._snapshot_at = snap, self._clock()
            recovered, self._stuck = self._stuck, False
        if recovered:
            log.info("GPU sampler: polling again (a poll finished after a stuck NVML call)")
        return snap

    def _poll(self, now: float) -> list[GpuReading]:
        if self.visibility.none:
            self._transition(self._states, "visibility", "none", f"GPU sampler: no GPU visible "
                             f"({self.visibility.source} is empty/none); NVML not used", logging.INFO)
            return []
        if not self._up:
            if not self._backoff.due(now):
                return []
            self._init(now)
            if not self._up:
                return []
        readings = []
        for dev in self._devices:
            try:
                reading = self._read_device(dev, now)
            except _NvmlDown as e:
                self._go_down(e.kind, e.error, now)
                return []
            if not dev.foreign:
                readings.append(reading)
        if len(readings) < len(self._devices):
            self._devices = [d for d in self._devices if not d.foreign]
        # Up only once a whole poll went through: an init that succeeds before every read fails
        # keeps backing off, and logs nothing new.
        if self._states.get("nvml") != "up":
            self._backoff.reset()
            gpus = ", ".join(f"{d.index}:{d.model or 'unreadable'}" for d in self._devices) or "none"
            self._transition(self._states, "nvml", "up", f"GPU sampler: NVML up, sampling {len(self._devices)} "
                             f"GPU(s) ({gpus}) every {self.config.interval_seconds:g}s", logging.INFO)
        return readings

    # -- NVML lifecycle --

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml  # lazily: a CPU-only install runs without touching libnvidia-ml

            self._nvml = pynvml
        return self._nvml

    def _init(self, now: float) -> None:
        initialized = False
        try:
            nvml = self._module()
            nvml.nvmlInit()
            initialized = True
            found: list[tuple[int, str, str, Any]] = []
            unread: dict[int, tuple[str, BaseException]] = {}  # index -> (kind, error)
            for i in range(nvml.nvmlDeviceGetCount()):
                try:
                    h = nvml.nvmlDeviceGetHandleByIndex(i)
                    found.append((i, nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetName(h), h))
                except nvml.NVMLError as e:  # one unreadable GPU does not hide the others
                    kind = error_kind(e)
                    if kind in NVML_DOWN:
                        raise
                    self._errors[kind] += 1
                    if kind in DEVICE_LOST:
                        unread[i] = (kind, e)
                    else:  # (no_permission: a GPU outside this cgroup, not a fault of one of ours)
                        log.warning("GPU sampler: GPU %d unreadable at NVML init (%s: %s); skipped until NVML is "
                                    "re-initialized", i, kind, e)
        except Exception as e:
            if initialized:
                self._shutdown()
            self._go_down(error_kind(e), e, now)
            return
        # An unreadable GPU (UUID unknown, "") is matched by its index; under UUID entries it is kept while an entry
        # is unmatched (it may be that GPU) and judged once its UUID is read (_probe).
        chosen, unmatched = select_devices(self.visibility, [(i, u) for i, u, _, _ in found]
                                           + [(i, "") for i in unread])
        by_uuid = any(not e.isdigit() for e in unmatched)
        if unmatched:
            log.warning("GPU sampler: %s entries %s match no GPU NVML lists (%s)%s", self.visibility.source,
                        ",".join(unmatched), ", ".join(f"{i}:{u}" for i, u, _, _ in found) or "none",
                        f"; {len(unread)} GPU(s) unreadable at init may be some" if unread else "")
        cfg = self.config
        keep = set(chosen)
        self._devices = [_Device(i, u, m, h, _Backoff(cfg.backoff_initial_seconds, cfg.backoff_max_seconds))
                         for i, u, m, h in found if i in keep]
        self._up = self._ever_up = True
        # A fresh start: earlier GPU and field states are moot (the "NVML up" line lists the GPUs).
        self._field_states.clear()
        for key in [k for k in self._states if k.startswith("gpu")]:
            del self._states[key]
        # A GPU lost at init (GpuIsLost, ResetRequired) is a GPU lost from the start, not one that is not there: up 0,
        # probed again with backoff by its index, as a GPU lost mid-run is by its UUID.
        for i, (kind, e) in unread.items():
            if i not in keep and not by_uuid:
                log.warning("GPU sampler: GPU %d unreadable at NVML init (%s: %s); not one of this process's GPUs "
                            "(%s)", i, kind, e, self.visibility.source)
                continue
            dev = _Device(i, "", "", None, _Backoff(cfg.backoff_initial_seconds, cfg.backoff_max_seconds), lost=True,
                          maybe_foreign=i not in keep)
            wait = dev.backoff.failed(now)
            self._transition(self._states, f"gpu{i}", kind, f"GPU sampler: GPU {i} unreadable at NVML init ({kind}: "
                             f"{e}); reported lost (posttrain_gpu_up 0), probing again in {wait:g}s", logging.WARNING)
            self._devices.append(dev)
        self._devices.sort(key=lambda d: d.index)

    def _go_down(self, kind: str, error: BaseException, now: float) -> None:
        self._errors[kind] += 1
        if self._up:
            self._shutdown()
        self._up = False
        self._devices = []
        wait = self._backoff.failed(now)
        # A retry is only worth saying where there is one (the sampling thread; `dump` polls once), and a machine
        # that was given no GPU and has no NVML is a CPU machine, not a fault: said once at info.
        retry = (f", retrying with backoff (next in {wait:g}s, then at most every "
                 f"{self.config.backoff_max_seconds:g}s)") if self._loop.running else ""
        level = logging.WARNING if self.expected or self._ever_up or kind not in NO_NVML_HERE else logging.INFO
        self._transition(self._states, "nvml", kind, f"GPU sampler: NVML unavailable ({kind}: {error}); GPU "
                         f"metrics off{retry}", level)

    def _shutdown(self) -> None:
        try:
            self._module().nvmlShutdown()
        except Exception as e:  # the library may be the thing that broke; nothing to do about it
            log.debug("nvmlShutdown failed: %s", e)

    # -- one GPU --

    def _read_device(self, dev: _Device, now: float) -> GpuReading:
        if dev.lost and not self._probe(dev, now):
            return GpuReading(dev.index, dev.uuid, dev.model, up=False)
        try:
            return self._read_fields(dev, now)
        except _DeviceLost as e:
            dev.lost = True
            wait = dev.backoff.failed(now)
            self._transition(self._states, f"gpu{dev.index}", e.kind, f"GPU sampler: GPU {dev.index} ({dev.uuid}) "
                             f"lost ({e.kind}: {e.error}); its series are dropped, probing again in {wait:g}s",
                             logging.WARNING)
            return GpuReading(dev.index, dev.uuid, dev.model, up=False)
        finally:
            if dev.new_unsupported:
                self._say_unsupported(dev)

    def _say_unsupported(self, dev: _Device) -> None:
        """One info line per GPU for the fields it does not have, once per GPU and field for the sampler's life (a
        re-init finds them again): a missing panel (no utilization on a MIG-enabled GPU, no power on some boards)
        must be explained somewhere, but it is not a fault."""
        new = [f for f in dev.new_unsupported if (dev.uuid, f) not in self._said_unsupported]
        dev.new_unsupported.clear()
        if new:
            self._said_unsupported.update((dev.uuid, f) for f in new)
            log.info("GPU sampler: GPU %d (%s) does not support %s (NVML NotSupported); not exported, not asked "
                     "again until NVML is re-initialized", dev.index, dev.uuid, ", ".join(new))

    def _probe(self, dev: _Device, now: float) -> bool:
        """A lost GPU comes back (after a reset) with a new handle, found by its UUID; one unreadable since NVML's
        init (no UUID known) by its index, and then named."""
        if not dev.backoff.due(now):
            return False
        nvml = self._nvml
        try:
            if dev.uuid:
                h = nvml.nvmlDeviceGetHandleByUUID(dev.uuid)
            else:
                h = nvml.nvmlDeviceGetHandleByIndex(dev.index)
                uuid, model = nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetName(h)
            nvml.nvmlDeviceGetMemoryInfo(h)
        except nvml.NVMLError as e:
            kind = error_kind(e)
            self._errors[kind] += 1
            if kind in NVML_DOWN:
                raise _NvmlDown(kind, e) from e
            dev.backoff.failed(now)
            return False
        if not dev.uuid:
            if dev.maybe_foreign and not select_devices(self.visibility, [(dev.index, uuid)])[0]:
                dev.foreign = True  # readable now, and not a GPU the visibility names: dropped (_poll)
                self._transition(self._states, f"gpu{dev.index}", None, f"GPU sampler: GPU {dev.index} ({uuid}), "
                                 f"unreadable at NVML init, is readable and not one of {self.visibility.source}'s; "
                                 "not sampled", logging.INFO)
                return False
            dev.uuid, dev.model, dev.maybe_foreign = uuid, model, False
        dev.handle, dev.lost = h, False
        dev.unsupported.clear()
        dev.slow_at = float("-inf")
        dev.backoff.reset()
        self._transition(self._states, f"gpu{dev.index}", None, f"GPU sampler: GPU {dev.index} ({dev.uuid}) is "
                         "back", logging.INFO)
        return True

    def _call(self, dev: _Device, fld: str, fn_name: str, *args: Any) -> Any:
        """One NVML read of one field; None when the field is unsupported or failed this time."""
        if fld in dev.unsupported:
            return None
        nvml = self._nvml
        fn = getattr(nvml, fn_name, None)
        if fn is None:  # an older pynvml without this function
            dev.unsupported.add(fld)
            dev.new_unsupported.append(fld)
            return None
        try:
            value = fn(dev.handle, *args)
        except nvml.NVMLError as e:
            kind = error_kind(e)
            if kind in UNSUPPORTED and fld not in dev.supported:  # the GPU does not have it: stop asking
                dev.unsupported.add(fld)
                dev.new_unsupported.append(fld)
                return None
            # (a field that answered before and now says NotSupported fails this poll only, like any other error)
            self._errors[kind] += 1
            if kind in DEVICE_LOST:
                raise _DeviceLost(kind, e) from e
            if kind in NVML_DOWN:
                raise _NvmlDown(kind, e) from e
            self._transition(self._field_states, f"gpu{dev.index}/{fld}", kind, f"GPU sampler: GPU {dev.index} "
                             f"{fld} unreadable ({kind}: {e}); other fields still exported", logging.WARNING)
            return None
        except Exception as e:  # not an NVMLError (a ctypes surprise): contained to this field all the same
            kind = error_kind(e)
            self._errors[kind] += 1
            self._transition(self._field_states, f"gpu{dev.index}/{fld}", kind, f"GPU sampler: GPU {dev.index} "
                             f"{fld} unreadable (unexpected {type(e).__name__}: {e}); other fields still exported",
                             logging.ERROR, exc_info=True)
            return None
        if fld not in dev.supported:
            dev.supported.add(fld)
        if self._field_states and f"gpu{dev.index}/{fld}" in self._field_states:
            self._transition(self._field_states, f"gpu{dev.index}/{fld}", None, f"GPU sampler: GPU {dev.index} "
                             f"{fld} readable again", logging.INFO)
        return value

    def _read_fields(self, dev: _Device, now: float) -> GpuReading:
        c = self._call
        values: dict[str, float] = {}  # GpuReading attribute -> value, for the fields of exporter/gpu/fields.py
        for r in READS:
            raw = c(dev, r.read, r.call, *r.args)
            if raw is not None:
                for attr, convert in r.outputs:
                    values[attr] = convert(raw)
        bits = c(dev, "clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if bits is None and "clock_event_reasons" in dev.unsupported:  # drivers before 535
            bits = c(dev, "throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        if now >= dev.slow_at:
            self._read_slow(dev)
            dev.slow_at = now + self.config.slow_interval_seconds
        if not values and bits is None:
            # Every call failed (NVML_ERROR_UNKNOWN after an Xid, ...): not a reading of the GPU, so not up. The
            # fields said why, one line each; this says what it means, once.
            self._transition(self._states, f"gpu{dev.index}:unread", "unread", f"GPU sampler: GPU {dev.index} "
                             f"({dev.uuid}) answered no field; posttrain_gpu_up 0 until it does", logging.WARNING)
            return GpuReading(dev.index, dev.uuid, dev.model, up=False)
        if (key := f"gpu{dev.index}:unread") in self._states:
            self._transition(self._states, key, None, f"GPU sampler: GPU {dev.index} ({dev.uuid}) answers again",
                             logging.INFO)
        if values:
            self._drop_out_of_range(dev, values)
        utilization, power = values.get("utilization_ratio"), values.get("power_watts")
        throttle = () if bits is None else _throttle_series(bits)
        phase = self._phases.update(dev.uuid, now, utilization, power)
        slow = dev.slow
        remap = slow.get("remapped_rows")
        return GpuReading(
            dev.index, dev.uuid, dev.model, True,
            **values,
            throttle_reasons=throttle,
            ecc_errors=slow.get("ecc", ()),
            retired_pages=slow.get("retired_pages", ()),
            remapped_rows=() if remap is None else (("correctable_error", float(remap[0])),
                                                    ("uncorrectable_error", float(remap[1]))),
            row_remap_pending=None if remap is None else float(bool(remap[2])),
            row_remap_failure=None if remap is None else float(bool(remap[3])),
            phase=phase,
        )

    def _drop_out_of_range(self, dev: _Device, values: dict[str, float]) -> None:
        """Removes from `values` what no GPU can read (utilization above 100 %, NVML's 0xFFFFFFFF "no value" as
        power, memory used above total): such a value would draw a false line and a false phase. Counted per value
        as kind out_of_range; one line when a field goes out of range, one when it is back."""
        for attr, why in out_of_range(values).items():
            del values[attr]
            self._errors["out_of_range"] += 1
            self._transition(self._field_states, f"gpu{dev.index}/{attr}", "out_of_range", f"GPU sampler: GPU "
                             f"{dev.index} ({dev.uuid}) {attr} out of range ({why}); not exported while it is",
                             logging.WARNING)
        if self._field_states:
            for attr in values:
                if self._field_states.get(key := f"gpu{dev.index}/{attr}") == "out_of_range":
                    self._transition(self._field_states, key, None, f"GPU sampler: GPU {dev.index} {attr} in range "
                                     "again", logging.INFO)

    def _read_slow(self, dev: _Device) -> None:
        # A failed read keeps the last value: these are counters of rare events, a stale count is
        # closer to the truth than a gap in the series.
        ecc = []
        for tname, t in ECC_TYPES:
            for sname, s in ECC_SCOPES:
                n = self._call(dev, f"ecc_{tname}_{sname}", "nvmlDeviceGetTotalEccErrors", t, s)
                if n is not None:
                    ecc.append((tname, sname, float(n)))
        pages = []
        for cname, cause in RETIREMENT_CAUSES:
            lst = self._call(dev, f"retired_pages_{cname}", "nvmlDeviceGetRetiredPages", cause)
            if lst is not None:
                pages.append((cname, float(len(lst))))
        rows = self._call(dev, "remapped_rows", "nvmlDeviceGetRemappedRows")
        for key, value in (("ecc", tuple(ecc)), ("retired_pages", tuple(pages)), ("remapped_rows", rows)):
            if value:
                dev.slow[key] = value

    # -- one log line per state change --

    @staticmethod
    def _transition(states: dict[str, str], key: str, state: str | None, message: str, level: int,
                    exc_info: bool = False) -> None:
        """Log `message` only when `key` changes state (None: fine, forgotten)."""
        if states.get(key) == state:
            return
        if state is None:
            del states[key]
        else:
            states[key] = state
        log.log(level, message, exc_info=exc_info)
