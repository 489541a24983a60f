"""Renders the GPU sampler's latest snapshot as Prometheus metric families.

Everything is converted and computed when the sampler polls; a scrape only copies the immutable
snapshot out (taken under the sampler's lock, then read without it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from exporter.gpu.fields import FIELDS
from exporter.gpu.phase import PHASES
from exporter.gpu.sampler import GpuSnapshot

# The identity dcgm-exporter gives every GPU, with its label names for the join keys: `gpu` (NVML's index) and `UUID`,
# so that posttrain_gpu_* and DCGM_FI_* series join on(UUID) (or on(gpu, UUID)) without relabeling. DCGM's
# `modelName` is `model_name` here: a camelCase label name fails `promtool check metrics` (exit 3).
GPU_LABELS = ["gpu", "UUID", "model_name"]



class SnapshotSource(Protocol):
    def snapshot(self) -> GpuSnapshot: ...


def _family(name: str, kind: str, doc: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class GpuCollector(Collector):
    def __init__(self, source: SnapshotSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        snap = self.source.snapshot()
        yield from self._health(snap)
        yield from self._gpus(snap)
        yield from self._phases(snap)

    def _health(self, snap: GpuSnapshot) -> Iterator[Metric]:
        up = GaugeMetricFamily("posttrain_gpu_nvml_up", "1 when NVML is initialized and answered the sampler's "
                               "last poll, 0 while it is unavailable (retried with backoff) or a call has hung (no "
                               "poll finished for 3 intervals, at least 30 s). Lost or unanswering GPUs show in "
                               "posttrain_gpu_up.")
        up.add_metric([], 1.0 if snap.nvml_up else 0.0)
        yield up
        expected = GaugeMetricFamily("posttrain_gpu_expected", "1 when GPUs are assigned to the exporter (the config "
                                     "or CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES name some or all), 0 on a pod "
                                     "without GPUs, where NVML is absent by design.")
        expected.add_metric([], 1.0 if snap.expected else 0.0)
        yield expected
        if snap.visible_devices is not None:
            visible = GaugeMetricFamily("posttrain_gpu_visible_devices", "GPUs the sampler reads: the ones NVML "
                                        "lists, filtered by CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES.")
            visible.add_metric([], snap.visible_devices)
            yield visible
        errors = CounterMetricFamily("posttrain_gpu_nvml_errors", "NVML calls that failed, by error kind "
                                     "(the NVMLError class in snake_case: timeout, gpu_is_lost, "
                                     "library_not_found, ...), and values not exported because no GPU can have "
                                     "them (out_of_range). With the trainer's GPU feed: feed_bad_line, "
                                     "feed_unreadable, feed_future_sample (stamped ahead of this clock), "
                                     "feed_out_of_range. A field the GPU never supported is not an error.",
                                     labels=["kind"])
        for kind, n in snap.errors:
            errors.add_metric([kind], n)
        yield errors
        polls = CounterMetricFamily("posttrain_gpu_sampler_polls", "Polls of the GPU sampler (one per interval).")
        polls.add_metric([], snap.polls)
        yield polls
        yield SummaryMetricFamily("posttrain_gpu_sampler_poll_seconds", "Wall time of the sampler's polls "
                                  "(NVML calls included).", count_value=snap.polls, sum_value=snap.poll_seconds)
        cpu = CounterMetricFamily("posttrain_gpu_sampler_cpu_seconds", "CPU time the sampler's thread spent "
                                  "polling: the sampler's own cost.")
        cpu.add_metric([], snap.cpu_seconds)
        yield cpu
        if snap.last_poll_timestamp is not None:
            last = GaugeMetricFamily("posttrain_gpu_sampler_last_poll_timestamp_seconds", "Unix time of the last "
                                     "poll that finished (a stuck NVML call shows as time() minus this growing; past "
                                     "3 intervals, at least 30 s, posttrain_gpu_nvml_up is 0).")
            last.add_metric([], snap.last_poll_timestamp)
            yield last

    def _gpus(self, snap: GpuSnapshot) -> Iterator[Metric]:
        up = GaugeMetricFamily("posttrain_gpu_up", "1 when the GPU was read at the last poll, 0 when it is lost "
                               "(GpuIsLost, ResetRequired) or answered no field (every call failed); its other "
                               "series are dropped while 0.", labels=GPU_LABELS)
        simple = [(f.attr, _family(f.family, f.kind, f.help, GPU_LABELS)) for f in FIELDS]
        throttle = GaugeMetricFamily("posttrain_gpu_throttle_reason", "1 while this reason holds the clocks down "
                                     "(NVML clock event reasons).", labels=[*GPU_LABELS, "reason"])
        ecc = CounterMetricFamily("posttrain_gpu_ecc_errors", "ECC memory errors, by type (corrected, uncorrected) "
                                  "and scope (volatile: since the driver loaded; aggregate: lifetime).",
                                  labels=[*GPU_LABELS, "type", "scope"])
        pages = CounterMetricFamily("posttrain_gpu_retired_pages", "Memory pages retired, by cause (GPUs before "
                                    "Ampere).", labels=[*GPU_LABELS, "cause"])
        rows = CounterMetricFamily("posttrain_gpu_remapped_rows", "Memory rows remapped, by the cause "
                                   "(Ampere and later).", labels=[*GPU_LABELS, "cause"])
        pending = GaugeMetricFamily("posttrain_gpu_row_remap_pending", "1 when a row remap waits for a GPU "
                                    "reset.", labels=GPU_LABELS)
        failure = GaugeMetricFamily("posttrain_gpu_row_remap_failure", "1 when a row remap failed (the GPU "
                                    "needs service).", labels=GPU_LABELS)
        for g in snap.gpus:
            lv = list(g.labels)
            up.add_metric(lv, 1.0 if g.up else 0.0)
            for attr, fam in simple:
                v = getattr(g, attr)
                if v is not None:
                    fam.add_metric(lv, v)
            for reason, v in g.throttle_reasons:
                throttle.add_metric([*lv, reason], v)
            for etype, scope, n in g.ecc_errors:
                ecc.add_metric([*lv, etype, scope], n)
            for cause, n in g.retired_pages:
                pages.add_metric([*lv, cause], n)
            for cause, n in g.remapped_rows:
                rows.add_metric([*lv, cause], n)
            if g.row_remap_pending is not None:
                pending.add_metric(lv, g.row_remap_pending)
            if g.row_remap_failure is not None:
                failure.add_metric(lv, g.row_remap_failure)
        yield up
        yield from (fam for _, fam in simple)
        yield from (throttle, ecc, pages, rows, pending, failure)

    def _phases(self, snap: GpuSnapshot) -> Iterator[Metric]:
        phase = GaugeMetricFamily("posttrain_gpu_phase", "Phase of the GPU at the last poll, 1 for the current "
                                  "one: generation (busy, power clearly below the recent high level), training "
                                  "(busy, near it) or idle (utilization ~0); see docs/gpu.md.",
                                  labels=[*GPU_LABELS, "phase"])
        seconds = CounterMetricFamily("posttrain_gpu_phase_seconds", "Time spent in each phase since the "
                                      "sampler started.", labels=[*GPU_LABELS, "phase"])
        ratio = GaugeMetricFamily("posttrain_gpu_generation_time_ratio", "Share of the recent window "
                                  "(phase.ratio_window_seconds, default 600 s) spent in generation.",
                                  labels=GPU_LABELS)
        ref = GaugeMetricFamily("posttrain_gpu_phase_reference_watts", "Recent high busy power level the "
                                "phase rule compares power with.", labels=GPU_LABELS)
        for g in snap.gpus:
            p = g.phase
            if p is None:
                continue
            lv = list(g.labels)
            for name, secs in zip(PHASES, p.seconds, strict=True):
                phase.add_metric([*lv, name], 1.0 if name == p.phase else 0.0)
                seconds.add_metric([*lv, name], secs)
            ratio.add_metric(lv, p.generation_ratio)
            if p.reference_watts is not None:
                ref.add_metric(lv, p.reference_watts)
        yield from (phase, seconds, ratio, ref)
