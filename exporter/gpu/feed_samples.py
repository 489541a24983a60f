"""The trainer's GPU samples (gpu.source: feed): the line format both sides share, and the sidecar's reader.

The trainer's process sees its GPUs where the sidecar does not (a pod's GPUs go to the container that requests
them). exporter/integrations/gpu_feed.py polls NVML there, at a bounded rate, and appends one JSON line per poll
to a file beside its feed:

    {"t": <unix time>, "nvml_up": true, "cuda_devices": 8, "gpus": [{"gpu": 0, "uuid": "GPU-...",
     "model": "NVIDIA H100 80GB HBM3", "utilization_ratio": 1.0, "power_watts": 612.5, ...}]}

with the fields of exporter/gpu/fields.py by their GpuReading names, already converted. The sidecar follows the
file (FeedGpuReader) and serves the same posttrain_gpu_* families as from its own NVML (GpuCollector), the phase
computed here by the same PhaseTracker from the samples' own times. A bad line is counted
(posttrain_gpu_nvml_errors{kind="feed_bad_line"}) and skipped. Data are served while fresh: the last sample is at
most `stale_after_seconds` old by its stamp, and the reader saw a new sample arrive within as long by its own
monotonic clock (the trainer stopped, or its sampling did, or its clock runs ahead: nothing frozen is served).

A sample stamped more than `stale_after_seconds` ahead of the reader's clock (a clock step, a line from a skewed
host) is skipped and counted (kind feed_future_sample): it would otherwise become the reference that every later,
real sample is "older than". If the clock steps back under an accepted sample, the next sample replaces it. A
value no GPU can have (fields.RANGES: utilization outside [0, 1], which refuses a percent rather than guessing it;
negative power or memory; memory used above total) is not served, counted as feed_out_of_range.

Bounded whatever the file holds: a line over MAX_LINE_BYTES is skipped unparsed, a sample of more than MAX_GPUS
GPUs is skipped (both feed_bad_line), at most MAX_PHASES GPUs' phase windows are kept, and a look
reads at most CHUNK_BYTES."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from exporter.gpu.fields import FIELDS, out_of_range
from exporter.gpu.phase import PhaseByGpu, PhaseConfig
from exporter.gpu.sampler import GpuReading, GpuSnapshot
from exporter.periodic import Periodic

log = logging.getLogger(__name__)

VALUE_FIELDS: tuple[str, ...] = tuple(f.attr for f in FIELDS)
MAX_LINE_BYTES = 1 << 16  # a line longer than this is not ours: skipped unparsed, counted (feed_bad_line)
MAX_GPUS = 64  # GPUs of one sample (a node has at most a few dozen): a sample with more is skipped, counted
MAX_PHASES = 4 * MAX_GPUS  # GPUs whose phase is followed: beyond, those absent from the latest sample are forgotten
# A sidecar (re)started beside a long run starts this far from the file's end (the phase windows need minutes, not
# the whole history), and reads at most a chunk per look: its memory does not grow with the run.
TAIL_START_BYTES = 1 << 20
CHUNK_BYTES = 4 << 20
# utilization_ratio is a ratio: a value in (1, 100] is most likely a percent (an older or hand-written writer), but a
# guess could as well hide garbage, so it is refused like any other out-of-range value, with this hint.
PERCENT_HINT = "; a percent? the feed wants a ratio in [0, 1]"


def sample_line(t: float, readings: Iterable[GpuReading], nvml_up: bool, cuda_devices: int) -> str:
    """One poll of the trainer's GPUs as a feed line (lost GPUs and missing fields left out)."""
    gpus = []
    for r in readings:
        if not r.up:
            continue
        g: dict[str, Any] = {"gpu": r.index, "uuid": r.uuid, "model": r.model}
        for attr in VALUE_FIELDS:
            v = getattr(r, attr)
            if v is not None:
                g[attr] = v
        gpus.append(g)
    return json.dumps({"t": round(t, 3), "nvml_up": nvml_up, "cuda_devices": cuda_devices, "gpus": gpus},
                      separators=(",", ":")) + "\n"


class BadSample(ValueError):
    pass


def _number(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadSample(f"{what} is not a finite number: {v!r}")
    return float(v)


def parse_sample(line: str) -> tuple[float, bool, int, list[dict[str, Any]]]:
    """(t, nvml_up, cuda_devices, gpus) of a line, or BadSample saying what is wrong."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise BadSample(f"not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("gpus"), list):
        raise BadSample("not a GPU sample (no `gpus` list)")
    if len(obj["gpus"]) > MAX_GPUS:
        raise BadSample(f"{len(obj['gpus'])} GPUs in one sample (at most {MAX_GPUS})")
    t = _number(obj.get("t"), "t")
    gpus = []
    for g in obj["gpus"]:
        if not isinstance(g, dict) or not isinstance(g.get("uuid"), str) or isinstance(g.get("gpu"), bool) \
                or not isinstance(g.get("gpu"), int):
            raise BadSample(f"a GPU without an integer `gpu` and a string `uuid`: {g!r}"[:200])
        values = {a: _number(g[a], a) for a in VALUE_FIELDS if a in g}
        gpus.append({"gpu": g["gpu"], "uuid": g["uuid"], "model": str(g.get("model", "")), **values})
    cuda = obj.get("cuda_devices", 0)
    return t, bool(obj.get("nvml_up", bool(gpus))), cuda if isinstance(cuda, int) and cuda > 0 else 0, gpus


class FeedGpuReader:
    """Follows the trainer's GPU sample file; `snapshot()` for GpuCollector. `start()` reads in a thread every
    `interval_seconds`; `poll_once()` reads what is new in the caller (tests, `dump`). Never raises."""

    def __init__(self, path: str, interval_seconds: float = 1.0, stale_after_seconds: float = 30.0,
                 phase: PhaseConfig | None = None, wall_clock: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.interval, self.stale_after = path, interval_seconds, stale_after_seconds
        self.phase_config = phase or PhaseConfig()
        self._wall, self._clock = wall_clock, clock
        self._arrived: float | None = None  # self._clock() when the last sample was taken in
        self._offset = 0
        self._inode: int | None = None
        self._partial = b""
        self._phases = PhaseByGpu(self.phase_config, interval_seconds, limit=MAX_PHASES)
        self._skipping = False  # inside a line over MAX_LINE_BYTES: the rest of it, to its newline, is skipped
        self._errors: Counter[str] = Counter()
        self._lines = 0
        self._last: tuple[float, bool, tuple[GpuReading, ...]] | None = None  # (t, nvml_up, readings)
        self.cuda_devices = 0
        self._lock = threading.Lock()
        self._snapshot = GpuSnapshot()
        self._loop = Periodic(self.poll_once, interval_seconds, "gpu-feed-reader")
        self._warned: set[str] = set()

    # -- what the collectors read --

    def snapshot(self) -> GpuSnapshot:
        with self._lock:
            return self._snapshot

    def active(self) -> bool:
        return bool(self.snapshot().gpus)

    def trainer_has_gpus(self) -> bool:
        return self.cuda_devices > 0 or self.active()

    # -- the loop --

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._loop.stop(timeout)

    def poll_once(self) -> GpuSnapshot:
        try:
            for line in self._new_lines():
                self._apply(line)
        except Exception as e:  # a bug must not stop the sidecar: counted and logged once per kind
            self._count(type(e).__name__.lower(), f"GPU feed {self.path}: unexpected {type(e).__name__}: {e}")
        snap = self._build()
        with self._lock:
            self._snapshot = snap
        return snap

    # -- reading --

    def _new_lines(self) -> list[bytes]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []  # not yet: the trainer writes it once it starts
        except OSError as e:
            self._count("feed_unreadable", f"GPU feed {self.path}: cannot read ({e})")
            return []
        skip_first = False
        if self._inode is None and st.st_size > TAIL_START_BYTES:  # first look at a long file: its recent end
            self._inode, self._offset, skip_first = st.st_ino, st.st_size - TAIL_START_BYTES, True
        elif st.st_ino != self._inode or st.st_size < self._offset:  # a new file, or truncated: from its start
            self._inode, self._offset, self._partial = st.st_ino, 0, b""
        if st.st_size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(min(st.st_size - self._offset, CHUNK_BYTES))
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        if skip_first or self._skipping:  # started mid-line, or in the rest of an over-long one
            if self._skipping and len(lines) == 1:
                return []  # still inside it
            lines, self._skipping = lines[1:] or [b""], False
        self._partial = lines.pop()  # an incomplete last line waits for its end
        if len(self._partial) > MAX_LINE_BYTES:
            self._too_long()
            self._partial, self._skipping = b"", True
        kept = []
        for ln in lines:
            if len(ln) > MAX_LINE_BYTES:
                self._too_long()
            elif ln.strip():
                kept.append(ln)
        return kept

    def _too_long(self) -> None:
        self._count("feed_bad_line", f"GPU feed {self.path}: a line longer than {MAX_LINE_BYTES} bytes skipped")

    def _apply(self, raw: bytes) -> None:
        self._lines += 1
        try:
            t, nvml_up, cuda, gpus = parse_sample(raw.decode("utf-8", errors="replace"))
        except BadSample as e:
            self._count("feed_bad_line", f"GPU feed {self.path}: line skipped ({e})")
            return
        now = self._wall()
        if t - now > self.stale_after:  # never the reference: every real sample after it would be "older"
            self._count("feed_future_sample", f"GPU feed {self.path}: a sample stamped {t - now:.0f}s ahead of this "
                        "clock skipped (a clock step, or the trainer's clock is wrong)")
            return
        if self._last is not None and t < self._last[0]:
            if self._last[0] - now <= self.stale_after:
                self._count("feed_bad_line", f"GPU feed {self.path}: a sample older than the last one skipped")
                return
            # The clock stepped back under the last sample: it is the one out of line now. Fresh phase windows
            # (their times would run backwards).
            log.info("GPU feed %s: the clock stepped back %.0fs; following the new samples", self.path,
                     self._last[0] - t)
            self._phases.clear()
        self.cuda_devices = cuda
        readings = []
        self._phases.bound({x["uuid"] for x in gpus})  # GPUs come and go (another node's file?): keep today's
        for g in gpus:
            values = {a: g[a] for a in VALUE_FIELDS if a in g}
            self._drop_out_of_range(g["gpu"], values)
            phase = self._phases.update(g["uuid"], t, values.get("utilization_ratio"), values.get("power_watts"))
            readings.append(GpuReading(g["gpu"], g["uuid"], g["model"], True, **values, phase=phase))
        self._last = (t, nvml_up, tuple(readings))
        self._arrived = self._clock()

    def _drop_out_of_range(self, gpu: int, values: dict[str, float]) -> None:
        for attr, why in out_of_range(values).items():
            hint = PERCENT_HINT if attr == "utilization_ratio" and 1.0 < values[attr] <= 100.0 else ""
            del values[attr]
            self._count("feed_out_of_range", f"GPU feed {self.path}: GPU {gpu} {attr} out of range ({why}{hint}); "
                        "not served", key=f"feed_out_of_range/{attr}")

    def _build(self) -> GpuSnapshot:
        errors = tuple(sorted(self._errors.items()))
        if self._last is None:
            return GpuSnapshot(errors=errors, polls=self._lines)
        t, nvml_up, readings = self._last
        # By the stamp (a sidecar started beside an old file) and by arrival (a stamp ahead of this clock)
        fresh = (self._wall() - t <= self.stale_after and self._arrived is not None
                 and self._clock() - self._arrived <= self.stale_after)
        return GpuSnapshot(nvml_up=nvml_up, gpus=readings if fresh else (),
                           visible_devices=len(readings) if fresh else 0, errors=errors, polls=self._lines,
                           last_poll_timestamp=t)

    def _count(self, kind: str, message: str, key: str | None = None) -> None:
        self._errors[kind] += 1
        if (key := key or kind) not in self._warned:  # one line per kind: garbage must not flood the log
            self._warned.add(key)
            log.warning("%s (further such problems are only counted: posttrain_gpu_nvml_errors_total{kind=%r})",
                        message, kind)
