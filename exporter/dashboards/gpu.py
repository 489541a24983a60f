"""The GPU board: the training pods' GPUs (docs/gpu.md) from whichever source a run has, every rank of a run."""

from __future__ import annotations

from exporter.dashboards.builders import (
    KEY,
    KEY_LABELS,
    dashboard,
    numbered_states,
    override,
    right,
    row,
    series,
    stat,
    state,
    t,
    timeseries,
)
from exporter.gpu.phase import PHASES

# The run of each exporter: every exporter of a run carries posttrain_run_finished{run} from its start, whether
# its log holds training records (rank 0 of a multi-node run) or not (the other ranks, which serve their pod's GPUs
# only). One run per exporter (an exporter reading several logs is labelled with one of them).
EXPORTER_KEY = ", ".join((*KEY_LABELS[:-1], "instance"))
RUN_OF_EXPORTER = (f"topk by ({EXPORTER_KEY}) (1,\n"
                   f"  group by ({EXPORTER_KEY}, run) ({series('posttrain_run_finished')})\n)")
GPU_KEY = f"{KEY}, instance, gpu"


def _gpu(metric: str, extra: str = "") -> str:
    """A GPU family (no run label of its own) given the run of its exporter: the GPUs of every exporter serving a
    selected run, on every pod of the run (not only the pod whose log has the training records)."""
    sel = f"{{{extra}}}" if extra else ""
    return f"{metric}{sel}\n* on ({EXPORTER_KEY}) group_left (run)\n{RUN_OF_EXPORTER}"


# posttrain_gpu_phase as one number per GPU: each phase's text and color, in the order of their numbers. The names
# are the sampler's (exporter/gpu/phase.py).
PHASE_STYLES = {"idle": ("idle", "text"), "generation": ("generation", "purple"), "training": ("training", "green")}
GPU_PHASE_EXPR, GPU_PHASE_MAPPINGS = numbered_states(
    GPU_KEY, PHASE_STYLES, PHASES, lambda name: f'({_gpu("posttrain_gpu_phase", f"phase={chr(34)}{name}{chr(34)}")})')


def gpu() -> dict:
    return dashboard("posttrain-gpu", "Post-training: GPU",
                     "The training pods' GPUs (docs/gpu.md), from dcgm-exporter, the trainer's own NVML or the "
                     "sidecar's: every pod of the selected runs, every rank of a multi-node run.", [
        row("Sampler", [
            stat("NVML up", "1 when the NVML that reads the GPUs (the sidecar's, or the trainer's with gpu.source "
                 "feed) is initialized and read them at its last poll; 0 without a GPU, a driver or NVML. Empty with "
                 "gpu.source dcgm (no NVML of ours). Training metrics are unaffected.",
                 [t(_gpu("posttrain_gpu_nvml_up"), "{{run}} {{instance}}")], decimals=0,
                 steps=[(None, "red"), (1, "green")], w=4),
            stat("GPU data", "Where the GPU data of each exporter of the run come from (the legend): dcgm "
                 "(dcgm-exporter, joined by namespace and pod in the recording rules), feed (the trainer's own NVML "
                 "samples) or nvml (the sidecar's NVML); none shown: no source gives data (PostTrainGPUDataMissing "
                 "when the run trains on GPUs). Training metrics are unaffected either way.",
                 [t(series("posttrain_gpu_data_source"), "{{run}} {{instance}} {{source}}")], decimals=0,
                 steps=[(None, "red"), (1, "green")], w=4),
            stat("GPUs sampled", "GPUs the sampler reads (after CUDA_VISIBLE_DEVICES).",
                 [t(_gpu("posttrain_gpu_visible_devices"), "{{run}} {{instance}}")], decimals=0, w=4),
            state("Phase", "Generation (memory-bound, lower power) versus training (compute-bound), judged from "
                  "power against the GPU's own recent training level. RL should alternate; one phase for long "
                  "means a stage is starved.",
                  [t(GPU_PHASE_EXPR, "{{run}} {{instance}} gpu {{gpu}}")], mappings=GPU_PHASE_MAPPINGS, w=12, h=6),
        ]),
        row("Utilization and power", [
            timeseries("Utilization", "Share of time a kernel ran. Both phases read ~100%: utilization cannot "
                       "tell generation from training, power can.",
                       [t(_gpu("posttrain_gpu_utilization_ratio"), "{{run}} {{instance}} gpu {{gpu}}")],
                       unit="percentunit"),
            timeseries("Power and limit", "Board power against the enforced limit (dashed): training draws near "
                       "the limit, generation clearly below it.",
                       [t(_gpu("posttrain_gpu_power_watts"), "{{run}} {{instance}} gpu {{gpu}}"),
                        t(_gpu("posttrain_gpu_power_limit_watts"), "{{run}} {{instance}} gpu {{gpu}} limit")],
                       unit="watt", overrides=[override(".*limit.*", ("custom.lineStyle",
                                                                       {"fill": "dash", "dash": [10, 10]}))]),
            timeseries("Memory", "Memory used against installed; colocated inference engines preallocate, so a "
                       "flat line is normal.",
                       [t(_gpu("posttrain_gpu_memory_used_bytes"), "{{run}} {{instance}} gpu {{gpu}} used"),
                        t(_gpu("posttrain_gpu_memory_total_bytes"), "{{run}} {{instance}} gpu {{gpu}} total")],
                       unit="bytes"),
            timeseries("Generation time ratio",
                       "Share of time spent generating: from NVML's phase rule per GPU, and from the trainer's own "
                       "timing keys per run. RL runs often spend most of the step generating.",
                       [t(_gpu("posttrain_gpu_generation_time_ratio"), "{{run}} {{instance}} gpu {{gpu}}"),
                        t(series("posttrain_generation_time_ratio"), "{{run}} trainer timing")],
                       unit="percentunit", w=12),
            timeseries("Temperature and SM clock", "Die temperature and SM clock (right): a clock that drops "
                       "while hot is thermal throttling.",
                       [t(_gpu("posttrain_gpu_temperature_celsius"), "{{run}} {{instance}} gpu {{gpu}} temperature"),
                        t(_gpu("posttrain_gpu_sm_clock_hertz"), "{{run}} {{instance}} gpu {{gpu}} sm clock")],
                       unit="celsius", overrides=[right(".*clock.*", "hertz")], w=12),
        ]),
    ], ["gpu"])
