"""Prometheus rules for the GPU sources (sources.py): the per-run GPU series from dcgm-exporter, the per-run source
series, and the alert for a GPU run without GPU data. exporter/alerting/rules.py adds them to rules/.

dcgm-exporter in Kubernetes mode labels each GPU's series with the `namespace`, `pod` and `container` that holds
the GPU (its pod-resources mapping; `pod_namespace` / `pod_name` with its old label names; `exported_namespace` /
`exported_pod` when Prometheus scraped it without honor_labels, its own target labels taking the plain names). The
sidecar's series carry the same `namespace` and `pod` as target labels (the PodMonitor's). The recording rules
join the two on (namespace, pod) for the pods whose sidecar is configured `gpu.source: dcgm`, and record
posttrain_gpu_* series named and labelled as the sidecar's own (gpu, UUID, model_name, and the sidecar's
cluster, namespace, pod, instance, job), so the GPU board and the GPU alerts read them unchanged.

The phase (phase.py) from DCGM's samples, at each rule evaluation, with the PhaseConfig defaults:

    busy power     power, while utilization >= idle_utilization
    reference R    quantile_over_time(reference_quantile, busy power [reference_window]): Prometheus's quantile,
                   the one PhaseTracker computes too
    busy phase     training if p >= training_ratio * R, generation if p <= generation_ratio * R, else the last
                   busy phase (a rule that reads its own previous value), training if there is none
    phase          the busy phase, or idle while utilization < idle_utilization

From the same samples (those the rules evaluated) PhaseTracker gives the same phase (tests/test_gpu_sources.py).
The generation time ratio is the share of the evaluations of the ratio window spent in generation. There is no
posttrain_gpu_phase_seconds_total from DCGM (a counter a rule would have to integrate itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.gpu.fields import FIELDS, GpuField
from exporter.gpu.phase import PhaseConfig

Dur = Callable[[float], str]  # seconds -> a Prometheus duration (scaled by the rules' settings)

# The sidecar's identity labels, which every recorded series takes from the sidecar (the board joins its GPU series to
# the run on cluster, namespace and instance).
SIDECAR = "cluster, namespace, pod, instance, job"
EXPORTER = "cluster, namespace, pod, instance"
DCGM_CONFIGURED = 'posttrain_gpu_source_configured{source="dcgm", pod!=""}'  # a pod: GPUs of no pod never join
# One series per pod whose sidecar is configured dcgm, with one scrape's identity labels (the join's right-hand side).
SIDECAR_OF_POD = f"topk by (namespace, pod) (1, max by ({SIDECAR}) ({DCGM_CONFIGURED}))"
# (label dcgm-exporter may use, the name the join uses), applied in order: the later wins
POD_LABELS = (("pod_namespace", "namespace"), ("pod_name", "pod"),
              ("exported_namespace", "namespace"), ("exported_pod", "pod"))
RUN_OF_EXPORTER = ("topk by (cluster, namespace, instance) (1,\n"
                   "  group by (cluster, namespace, instance, run) (posttrain_run_finished)\n)")
# kube-state-metrics' series of a container's GPU request (the resource nvidia.com/gpu, sanitized)
# whole GPUs and MIG instances (`nvidia.com/mig-1g.10gb` is kube-state-metrics' `nvidia_com_mig_1g_10gb`)
GPU_REQUESTS = 'kube_pod_container_resource_requests{resource=~"nvidia_com_gpu|nvidia_com_mig_.+"}'

BUSY_POWER = "posttrain_gpu:dcgm_busy_power_watts"
BUSY_PHASE = "posttrain_gpu:dcgm_busy_phase"  # 1 training, 0 generation; only while busy
LAST_BUSY_PHASE = "posttrain_gpu:dcgm_last_busy_phase"


def _by_pod(dcgm_field: str) -> str:
    """A DCGM field per GPU and pod, with the pod's labels under their plain names."""
    expr = dcgm_field
    for src, dst in POD_LABELS:
        expr = f'label_replace({expr}, "{dst}", "$1", "{src}", "(.+)")'
    return f"max by (namespace, pod, gpu, UUID, modelName) (\n  {expr}\n)"


def _joined(value: str) -> str:
    """A per-GPU-and-pod DCGM value as the sidecar would label it, for the pods whose sidecar is configured dcgm.

    The right-hand side is cut to one series per (namespace, pod) first: a sidecar scraped twice (two jobs, or two
    instances) would otherwise give two series for the match group, and the many-to-many error fails the whole rule,
    for every run. topk keeps one scrape's labels (Prometheus keeps the first of equal values)."""
    return (f'max without (modelName) (label_replace(\n{value},\n"model_name", "$1", "modelName", "(.*)"))\n'
            f"* on (namespace, pod) group_left (cluster, instance, job)\n"
            f"{SIDECAR_OF_POD}\n")


def _field_value(f: GpuField) -> str:
    value = f"({_by_pod(f.dcgm)}){f.dcgm_scale}"
    if f.attr == "memory_total_bytes":  # not in dcgm-exporter's default counters: used + free then
        used_free = f"({_by_pod('DCGM_FI_DEV_FB_USED')}\n+ {_by_pod('DCGM_FI_DEV_FB_FREE')}){f.dcgm_scale}"
        value = f"(\n{value}\nor\n{used_free}\n)"
    return value


def _dcgm_only(metric: str) -> str:
    return f"({metric} and on (namespace, pod, instance) {DCGM_CONFIGURED})"


def dcgm_recording_rules(dur: Dur, phase: PhaseConfig | None = None) -> list[dict[str, Any]]:
    p = phase or PhaseConfig()
    util, power = _dcgm_only("posttrain_gpu_utilization_ratio"), _dcgm_only("posttrain_gpu_power_watts")
    rules: list[dict[str, Any]] = []
    for f in FIELDS:
        name = f"{f.family}_total" if f.kind == "counter" else f.family
        rules.append({"record": name, "expr": _joined(_field_value(f))})
    rules += [
        {"record": "posttrain_gpu_visible_devices", "expr": f"count by ({SIDECAR}) ({util})\n"},
        {"record": BUSY_POWER, "expr": f"{power}\nand {util} >= {p.idle_utilization}\n"},
        {"record": "posttrain_gpu_phase_reference_watts",
         "expr": f"quantile_over_time({p.reference_quantile}, {BUSY_POWER}[{dur(p.reference_window_seconds)}])\n"},
        {"record": BUSY_PHASE,
         # in order: above the training level, below the generation level, in the band (the last busy phase), first
         "expr": f"(({BUSY_POWER} >= {p.training_power_ratio} * posttrain_gpu_phase_reference_watts) * 0 + 1)\n"
                 f"or (({BUSY_POWER} <= {p.generation_power_ratio} * posttrain_gpu_phase_reference_watts) * 0)\n"
                 f"or ({LAST_BUSY_PHASE} and {BUSY_POWER})\n"
                 f"or ({BUSY_POWER} * 0 + 1)\n"},
        {"record": LAST_BUSY_PHASE,
         # its own previous value carried through idle time, while the GPU has DCGM data
         "expr": f"{BUSY_PHASE}\nor ({LAST_BUSY_PHASE} and {util})\n"},
        # 0 while idle; a busy GPU without a power series (a board or a dcgm-exporter profile without
        # DCGM_FI_DEV_POWER_USAGE) has no phase, as the sidecar's NVML gives none: never "neither", nor a ratio of 0
        {"record": "posttrain_gpu_phase", "labels": {"phase": "training"},
         "expr": f"({BUSY_PHASE} == bool 1)\nor (({util} < {p.idle_utilization}) * 0)\n"},
        {"record": "posttrain_gpu_phase", "labels": {"phase": "generation"},
         "expr": f"({BUSY_PHASE} == bool 0)\nor (({util} < {p.idle_utilization}) * 0)\n"},
        {"record": "posttrain_gpu_phase", "labels": {"phase": "idle"},
         "expr": f"{util} < bool {p.idle_utilization}\n"},
        {"record": "posttrain_gpu_generation_time_ratio",
         "expr": f"max without (phase) (avg_over_time(posttrain_gpu_phase{{phase=\"generation\"}}"
                 f"[{dur(p.ratio_window_seconds)}]))\nand on (namespace, pod, instance) {DCGM_CONFIGURED}\n"},
        {"record": "posttrain_gpu_source_active", "labels": {"source": "dcgm"},
         "expr": f"max by ({SIDECAR}) ({util} * 0 + 1)\n"},
        {"record": "posttrain_gpu_data_source",
         # the active source of every exporter, with its run: what the GPU board's "GPU data" says
         "expr": f"max by ({EXPORTER}, source) (posttrain_gpu_source_active == 1)\n"
                 f"* on (cluster, namespace, instance) group_left (run)\n{RUN_OF_EXPORTER}\n"},
    ]
    return rules


def gpu_data_missing_alert(dur: Dur) -> dict[str, Any]:
    """A run that trains on GPUs (the exporter says so, or its pod requests GPUs) with GPU data from no source."""
    return {
        "alert": "PostTrainGPUDataMissing",
        "expr": "(\n"
                f"  (\n    max by ({EXPORTER}) (posttrain_gpu_training_expected == 1)\n"
                f"    or (\n      max by ({EXPORTER}) (posttrain_run_finished)\n"
                f"      and on (namespace, pod) (max by (namespace, pod) ({GPU_REQUESTS}) > 0)\n    )\n  )\n"
                f"  unless on ({EXPORTER}) posttrain_gpu_data_source\n"
                f"  unless on (cluster, namespace, instance) (max by (cluster, namespace, instance) "
                "(posttrain_run_finished) == 1)\n)\n"
                f"* on (cluster, namespace, instance) group_left (run)\n{RUN_OF_EXPORTER}\n",
        "for": dur(180), "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Run {{ $labels.run }} trains on GPUs but has no GPU data.",
            "description": "The exporter of run {{ $labels.run }} on {{ $labels.instance }} (pod {{ $labels.pod }}) "
                           "belongs to a run on GPUs (its config or trainer says so, or its pod requests GPUs), but "
                           "no GPU source (dcgm-exporter, the trainer's GPU feed, the sidecar's NVML) has given data "
                           "for 3 minutes: the GPU board, the generation/training phase and the GPU memory alerts "
                           "are blind. Check the source named by gpu.source (posttrain_gpu_source_configured)."}}
