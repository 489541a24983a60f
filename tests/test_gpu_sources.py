"""The three GPU sources on real parts (docs/gpu.md "Where GPU data come from").

One real Prometheus on loopback with the project's rules (durations scaled by SCALE), scraping:
- the sidecar of the chart's Job example, rendered by the real Helm engine, run as rendered (its args, its config
  from the rendered ConfigMap), with no GPU given to it;
- a dcgm-exporter page served by this test in dcgm-exporter's text format: its field names (etc/default-counters.csv)
  and labels (gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, and in Kubernetes mode
  container, namespace, pod), scraped as the GPU Operator's ServiceMonitor does (without honor_labels: the pod's
  labels arrive as exported_namespace / exported_pod);
- a kube-state-metrics page with one pod's GPU request;
- three more sidecars: a GPU run whose GPUs appear nowhere, a CPU-only run, and a run configured for the sidecar's
  NVML (which sees no GPU here) whose pod requests GPUs.
The phase that the recording rules derive from DCGM's samples is compared, sample by sample, with PhaseTracker's
(exporter/gpu/phase.py) on the same samples. The trainer's GPU feed runs in a real TRL training on CPU with the fake
NVML (tests/fake_nvml.py)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import IN_CI, REPO, require_binary, require_module
from support.boards import all_panels, load_boards, substitute
from support.loopback import Processes, free_port, http_ready

from exporter.alerting.rules import RulesSettings, alert_groups, recording_groups, render
from exporter.cli import build_parser
from exporter.gpu.feed_samples import FeedGpuReader, parse_sample
from exporter.gpu.phase import PhaseConfig, PhaseTracker

SCALE = 1 / 30  # the phase windows of 600 s become 20 s, the alert's 3 minutes 6 s
STEP = 1.0  # scrape and evaluation interval, seconds
EXAMPLES = REPO / "helm" / "examples"
NAMESPACE, RELEASE = "ml", "grpo-demo"
EXAMPLE_POD = "grpo-demo-x7k2p"  # a Job's pod: <job name>-<5 characters>
MODEL = "NVIDIA H100 80GB HBM3"

# (utilization %, watts, seconds) segments: training near 300 W, generation near 150 W, samples in the hysteresis
# band between (0.70 and 0.80 of the reference), idle stretches between.
TRACES = {
    ("0", "GPU-6c1f0a52-2d1e-4b7a-9f3e-0a1b2c3d4e01"): [
        (100, 300, 6), (97, 140, 5), (99, 225, 3), (100, 310, 4), (98, 228, 3), (0, 60, 3), (99, 226, 2),
        (96, 150, 5), (2, 70, 2), (100, 305, 5)],
    ("1", "GPU-6c1f0a52-2d1e-4b7a-9f3e-0a1b2c3d4e02"): [
        (0, 55, 3), (95, 150, 4), (100, 300, 5), (97, 145, 6), (99, 220, 3), (100, 295, 5), (0, 60, 2),
        (99, 225, 2), (96, 150, 5), (100, 300, 3)],
}
TRACE_SECONDS = max(sum(n for _, _, n in segs) for segs in TRACES.values())


def _at(segments: list[tuple[int, float, int]], i: int) -> tuple[int, float]:
    for util, watts, n in segments:
        if i < n:
            return util, watts
        i -= n
    return segments[-1][0], segments[-1][1]


# --- the pages Prometheus scrapes besides the sidecars ---------------------------------------------------------------

DCGM_FAMILIES = [  # (field, type, HELP) as dcgm-exporter's etc/default-counters.csv has them
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
]


def dcgm_page(i: int) -> str:
    """dcgm-exporter's /metrics at second i: the example pod's two GPUs, a GPU of another pod, a GPU of no pod."""
    gpus = []
    for (gpu, uuid), segs in TRACES.items():
        util, watts = _at(segs, i)
        gpus.append((gpu, uuid, {"container": "trainer", "namespace": NAMESPACE, "pod": EXAMPLE_POD}, util, watts))
    gpus.append(("2", "GPU-6c1f0a52-2d1e-4b7a-9f3e-0a1b2c3d4e03",
                 {"container": "trainer", "namespace": NAMESPACE, "pod": "someone-else-0"}, 100, 400.0))
    gpus.append(("3", "GPU-6c1f0a52-2d1e-4b7a-9f3e-0a1b2c3d4e04", {}, 0, 50.0))
    lines = []
    for field, kind, help_ in DCGM_FAMILIES:
        lines += [f"# HELP {field} {help_}", f"# TYPE {field} {kind}"]
        for gpu, uuid, pod, util, watts in gpus:
            labels = {"gpu": gpu, "UUID": uuid, "pci_bus_id": f"00000000:{18 + int(gpu):02X}:00.0",
                      "device": f"nvidia{gpu}", "modelName": MODEL, "Hostname": "gpu-node-7",
                      "DCGM_FI_DRIVER_VERSION": "550.90.07", **pod}
            value = {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_GPU_TEMP": 41 + int(gpu),
                     "DCGM_FI_DEV_POWER_USAGE": watts, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 5_000_000 + 1000 * i,
                     "DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_FB_FREE": 81559 - 60000,
                     "DCGM_FI_DEV_FB_USED": 60000}[field]
            body = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{field}{{{body}}} {value}")
    return "\n".join(lines) + "\n"


KSM_PAGE = ("# HELP kube_pod_container_resource_requests The number of requested request resource by a container.\n"
            "# TYPE kube_pod_container_resource_requests gauge\n"
            f'kube_pod_container_resource_requests{{namespace="{NAMESPACE}",pod="nvml-requests-0",uid="3f1c",'
            'container="trainer",node="gpu-node-7",resource="nvidia_com_gpu",unit="integer"} 8\n'
            f'kube_pod_container_resource_requests{{namespace="{NAMESPACE}",pod="cpu-only-0",uid="3f1d",'
            'container="trainer",node="cpu-node-1",resource="cpu",unit="core"} 4\n')


class Pages:
    def __init__(self) -> None:
        self.t0 = time.time()
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                i = int((time.time() - pages.t0) / STEP)
                body = (dcgm_page(i) if self.path.startswith("/metrics") else KSM_PAGE).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the rendered example -------------------------------------------------------------------------------------------


def render_example(tmp: Path, name: str) -> list[dict]:
    try:
        import helm_python
    except ImportError:
        msg = "helm-python-sdk is not installed (the `test` extra)"
        if IN_CI:
            pytest.fail(msg + "; the Helm tests never skip in CI")
        pytest.skip(msg)
    from test_helm import NEW_KUBE, example_chart, render_at

    with helm_python.Chart.load(example_chart(tmp, name)) as c:
        return render_at(c, None, NEW_KUBE, name=RELEASE, namespace=NAMESPACE)


def sidecar_command(docs: list[dict], tmp: Path, port: int) -> tuple[list[str], dict]:
    """The rendered sidecar's command line, run here: its config from the rendered ConfigMap, its log and listen
    address on loopback, $(RUN_NAME) as the Job controller would set it. Returns (argv, the config)."""
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    spec = job["spec"]["template"]["spec"]
    (side,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "posttrain-exporter"]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    (tmp / "config.yaml").write_text(cm["data"]["config.yaml"])
    (tmp / "train.log").write_text("")
    swap = {"/etc/posttrain-exporter/config.yaml": str(tmp / "config.yaml"), "/logs/train.log": str(tmp / "train.log"),
            "0.0.0.0:9847": f"127.0.0.1:{port}", "$(RUN_NAME)": job["metadata"]["name"]}
    return [sys.executable, "-m", "exporter", *(swap.get(a, a) for a in side["args"])], config


# --- the stack ------------------------------------------------------------------------------------------------------


class Stack:
    def __init__(self, procs: Processes, port: int) -> None:
        self.procs, self.port = procs, port

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("/api/v1/query", query=promql)["result"]

    def firing(self) -> list[dict]:
        return [a for a in self.api("/api/v1/alerts")["alerts"] if a["state"] == "firing"]


SIDECARS = {  # run -> (pod, the exporter's config): the three besides the rendered example
    "gpu-missing": ("gpu-missing-0", {"gpu": {"source": "dcgm", "expected": True}}),
    "cpu-only": ("cpu-only-0", {"gpu": {"source": "dcgm"}}),
    "nvml-requests": ("nvml-requests-0", {"gpu": {"source": "nvml"}}),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Stack, dict]]:
    prometheus = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("gpu-sources")
    docs = render_example(tmp / "chart", "job")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = str(REPO)
    pages = Pages()
    ports = {run: free_port() for run in ("example", *SIDECARS)}
    prom_port = free_port()
    rules = tmp / "rules"
    rules.mkdir()
    settings = RulesSettings(scale=SCALE)
    (rules / "alerts.yml").write_text(render(alert_groups(settings)))
    (rules / "recording.yml").write_text(render(recording_groups(settings)))
    # as the PodMonitor labels a sidecar's target: its pod's namespace and name, its container
    targets = [{"targets": [f"127.0.0.1:{ports['example']}"],
                "labels": {"namespace": NAMESPACE, "pod": EXAMPLE_POD, "container": "posttrain-exporter"}}]
    targets += [{"targets": [f"127.0.0.1:{ports[run]}"],
                 "labels": {"namespace": NAMESPACE, "pod": pod, "container": "posttrain-exporter"}}
                for run, (pod, _) in SIDECARS.items()]
    interval = f"{int(STEP * 1000)}ms"
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules / "*.yml")],
        "scrape_configs": [
            {"job_name": "posttrain", "static_configs": targets},
            # the GPU Operator's ServiceMonitor: dcgm-exporter's own namespace and pod as target labels
            {"job_name": "gpu-metrics", "static_configs": [{
                "targets": [f"127.0.0.1:{pages.port}"],
                "labels": {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-5tq9w"}}]},
            {"job_name": "kube-state-metrics", "honor_labels": True, "metrics_path": "/ksm",
             "static_configs": [{"targets": [f"127.0.0.1:{pages.port}"]}]},
        ]}))
    with Processes(tmp, REPO) as procs:
        argv, config = sidecar_command(docs, tmp, ports["example"])
        procs.start("example", argv)
        for run, (_, cfg) in SIDECARS.items():
            (tmp / f"{run}.yml").write_text(yaml.safe_dump(cfg))
            procs.start(run, [sys.executable, "-m", "exporter", "serve", "--run", run, "--config",
                              str(tmp / f"{run}.yml"), "--listen-address", f"127.0.0.1:{ports[run]}"])
        procs.start("prometheus", [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        procs.wait("Prometheus ready", lambda: http_ready(prom_port), 60)
        pages.t0 = time.time()  # the traces start now
        s = Stack(procs, prom_port)
        procs.wait("every target up", lambda: len(s.query("up == 1")) == 6, 60)
        # the traces played out, and a few evaluations more
        time.sleep(max(0.0, pages.t0 + TRACE_SECONDS * STEP + 4 - time.time()))
        try:
            yield s, {"docs": docs, "config": config, "argv": argv}
        finally:
            pages.close()


# --- the tests --------------------------------------------------------------------------------------------------------


def test_the_rendered_example_gives_its_sidecar_no_gpu_and_chooses_dcgm(stack) -> None:
    _, ex = stack
    (job,) = [d for d in ex["docs"] if d["kind"] == "Job"]
    spec = job["spec"]["template"]["spec"]
    (side,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "posttrain-exporter"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in side.get("env", [])}
    assert "nvidia.com/gpu" not in json.dumps(side.get("resources", {}))
    assert ex["config"]["gpu"] == {"source": "dcgm", "expected": True}
    assert not build_parser().parse_args(ex["argv"][3:]).no_gpu


def _by_uuid(result: list[dict]) -> dict[str, dict]:
    return {r["metric"]["UUID"]: r for r in result}


def test_dcgm_series_are_recorded_as_the_sidecars_own(stack) -> None:
    s, _ = stack
    power = _by_uuid(s.query(f'posttrain_gpu_power_watts{{pod="{EXAMPLE_POD}"}}'))
    assert set(power) == {uuid for _, uuid in TRACES}  # the pod's GPUs, not another pod's, not a GPU of no pod
    for (gpu, uuid), segs in TRACES.items():
        labels = power[uuid]["metric"]
        # the sidecar's labels (its instance, job, namespace, pod) and its GPU labels; none of DCGM's own
        assert labels == {"__name__": "posttrain_gpu_power_watts", "gpu": gpu, "UUID": uuid, "model_name": MODEL,
                          "namespace": NAMESPACE, "pod": EXAMPLE_POD, "instance": labels["instance"],
                          "job": "posttrain"}
        assert float(power[uuid]["value"][1]) == segs[-1][1]
    memory = s.query(f'posttrain_gpu_memory_total_bytes{{pod="{EXAMPLE_POD}"}}')
    assert {float(r["value"][1]) for r in memory} == {81559 * 1048576}  # used + free, in bytes
    assert {float(r["value"][1]) for r in s.query(f'posttrain_gpu_sm_clock_hertz{{pod="{EXAMPLE_POD}"}}')} == {1.98e9}
    assert s.query('posttrain_gpu_power_watts{pod="someone-else-0"}') == []
    (devices,) = s.query(f'posttrain_gpu_visible_devices{{pod="{EXAMPLE_POD}"}}')
    assert devices["value"][1] == "2"


def test_the_phase_from_dcgm_equals_the_sidecars_on_the_same_samples(stack) -> None:
    s, _ = stack
    window = f"{int(TRACE_SECONDS + 30)}s"

    def raw(metric: str) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for r in s.query(f'{metric}{{pod="{EXAMPLE_POD}"}}[{window}]'):
            key = r["metric"]["UUID"] + "/" + r["metric"].get("phase", "")
            out[key] = {round(float(t) * 1000): float(v) for t, v in r["values"]}
        return out

    util, power, phases = raw("posttrain_gpu_utilization_ratio"), raw("posttrain_gpu_power_watts"), \
        raw("posttrain_gpu_phase")
    # windows in milliseconds: Prometheus's sample times are whole milliseconds, so the window's edge is exact
    cfg = PhaseConfig(reference_window_seconds=20_000, ratio_window_seconds=20_000, max_gap_seconds=1e9)
    seen: set[tuple[str, str]] = set()
    for _, uuid in TRACES:
        tracker = PhaseTracker(cfg, 1000)
        times = sorted(set(util[uuid + "/"]) & set(power[uuid + "/"]))
        assert len(times) >= TRACE_SECONDS - 5
        mismatches = []
        for t in times:
            u, p = util[uuid + "/"][t], power[uuid + "/"][t]
            want = tracker.update(float(t), u, p).phase
            got = [ph for ph in ("generation", "training", "idle") if phases[f"{uuid}/{ph}"].get(t) == 1.0]
            if got != [want]:
                mismatches.append((t, u, p, want, got))
            seen.add((want, "band" if 215 <= p <= 230 else "clear"))
        assert mismatches == [], mismatches[:5]
    # the trace went through every phase, and through the hysteresis band from both sides
    assert {("generation", "band"), ("training", "band"), ("idle", "clear"), ("generation", "clear")} <= seen


# One sample per second through the recording rules in promtool (Prometheus's own rule engine, evaluated at exact
# steps): the trace above, and samples where Prometheus's quantile and a nearest-rank one call different phases.
EXACT_TRACE = [(u, w) for u, w, n in TRACES[("0", "GPU-6c1f0a52-2d1e-4b7a-9f3e-0a1b2c3d4e01")] for _ in range(n)] + \
    [(100, w) for w in (320, 400, 150, 260, 400, 300, 200, 300)]


def _phases(samples: list[tuple[int, float]], nearest_rank: bool = False) -> list[str]:
    tracker = PhaseTracker(PhaseConfig(reference_window_seconds=20_000, ratio_window_seconds=20_000,
                                       max_gap_seconds=1e9), 1000)
    if nearest_rank:  # the quantile PhaseTracker had before: a value of the window, no interpolation
        import math

        def reference(now: float, t: PhaseTracker = tracker) -> float | None:
            while t._ref_times and t._ref_times[0][0] < now - 20_000:
                t._drop_oldest_reference()
            ordered = t._ref_sorted
            return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)] if ordered else None

        tracker._reference = reference  # type: ignore[method-assign]
    return [tracker.update(1000.0 * i, u / 100, w).phase for i, (u, w) in enumerate(samples)]


def test_the_dcgm_phase_rules_agree_with_phase_tracker_at_every_step(tmp_path) -> None:
    promtool = require_binary("promtool")
    want = _phases(EXACT_TRACE)
    assert want != _phases(EXACT_TRACE, nearest_rank=True)  # the trace tells the quantiles apart
    (tmp_path / "recording.yml").write_text(render(recording_groups(RulesSettings(scale=SCALE))))
    dcgm = (f'{{gpu="0", UUID="GPU-x", modelName="{MODEL}", Hostname="n1", container="trainer", '
            'namespace="gpu-operator", pod="nvidia-dcgm-exporter-1", exported_namespace="ml", exported_pod="p-0"}')
    sidecar = '{namespace="ml", pod="p-0", instance="10.0.0.1:9847", job="posttrain"}'
    series = [("DCGM_FI_DEV_GPU_UTIL" + dcgm, " ".join(str(u) for u, _ in EXACT_TRACE)),
              ("DCGM_FI_DEV_POWER_USAGE" + dcgm, " ".join(str(w) for _, w in EXACT_TRACE)),
              ('posttrain_gpu_source_configured{source="dcgm", ' + sidecar[1:], f"1x{len(EXACT_TRACE)}"),
              ('posttrain_run_finished{run="p", ' + sidecar[1:], f"0x{len(EXACT_TRACE)}")]
    labels = ('{{phase="{p}", gpu="0", UUID="GPU-x", model_name="' + MODEL + '", namespace="ml", pod="p-0", '
              'instance="10.0.0.1:9847", job="posttrain"}}')
    tests = [{"expr": "posttrain_gpu_phase == 1", "eval_time": f"{i}s",
              "exp_samples": [{"labels": "posttrain_gpu_phase" + labels.format(p=phase), "value": 1}]}
             for i, phase in enumerate(want)]
    (tmp_path / "phase.test.yml").write_text(yaml.safe_dump({
        "rule_files": ["recording.yml"], "evaluation_interval": "1s",
        "group_eval_order": ["posttrain.recording", "posttrain.gpu"],
        "tests": [{"interval": "1s", "input_series": [{"series": n, "values": v} for n, v in series],
                   "promql_expr_test": tests}]}, width=1000))
    r = subprocess.run([promtool, "test", "rules", str(tmp_path / "phase.test.yml")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def test_the_gpu_board_reads_the_dcgm_series_for_the_example_run(stack) -> None:
    s, _ = stack
    board = load_boards()["gpu"]
    # not from dcgm-exporter's default counters (docs/gpu.md), and the NVML health of a sidecar that reads no GPU
    not_in_dcgm_defaults = ("posttrain_gpu_power_limit_watts", "posttrain_generation_time_ratio{",
                            "posttrain_gpu_nvml_up")
    checked = 0
    for panel in all_panels(board):
        for target in panel.get("targets", []):
            expr = substitute(target["expr"], [RELEASE], namespaces=[NAMESPACE])
            if expr.startswith(not_in_dcgm_defaults):
                continue
            result = s.query(expr)
            assert result, f"{panel['title']}: no data\n{expr}"
            assert {r["metric"].get("run") for r in result} == {RELEASE}, panel["title"]
            checked += 1
    assert checked == 10
    (source,) = s.query(f'posttrain_gpu_data_source{{run="{RELEASE}"}}')
    assert source["metric"]["source"] == "dcgm"
    phase = s.query(substitute(next(t["expr"] for p in all_panels(board) if p["title"] == "Phase"
                                    for t in p["targets"]), [RELEASE]))
    assert {r["metric"]["gpu"] for r in phase} == {"0", "1"}


def test_a_gpu_run_without_gpu_data_alerts_and_a_cpu_run_does_not(stack) -> None:
    s, _ = stack
    s.procs.wait("PostTrainGPUDataMissing firing for both GPU runs without data",
                 lambda: {a["labels"]["run"] for a in s.firing() if a["labels"]["alertname"] ==
                          "PostTrainGPUDataMissing"} == {"gpu-missing", "nvml-requests"}, 30)
    firing = {(a["labels"]["alertname"], a["labels"].get("run")) for a in s.firing()}
    assert ("PostTrainGPUDataMissing", "cpu-only") not in firing
    assert ("PostTrainGPUDataMissing", RELEASE) not in firing
    sources = {(r["metric"]["run"], r["metric"]["source"]) for r in s.query("posttrain_gpu_data_source")}
    assert sources == {(RELEASE, "dcgm")}
    configured = {r["metric"]["pod"]: r["metric"]["source"] for r in s.query("posttrain_gpu_source_configured")}
    assert configured["nvml-requests-0"] == "nvml" and configured["cpu-only-0"] == "dcgm"


def test_every_example_chooses_a_source_and_exposes_no_gpu_to_the_sidecar(tmp_path) -> None:
    for name in ("job", "pytorchjob", "rayjob", "jobset"):
        docs = render_example(tmp_path / name, name)
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        assert yaml.safe_load(cm["data"]["config.yaml"])["gpu"] == {"source": "dcgm", "expected": True}, name
        text = json.dumps([d for d in docs if d["kind"] != "ConfigMap"])
        assert "NVIDIA_VISIBLE_DEVICES" not in text, name
        values = (EXAMPLES / name / "values.yaml").read_text()
        assert "gpu:" in values and "source: dcgm" in values, name


# --- the trainer's GPU feed -------------------------------------------------------------------------------------------

FEED_TRAIN = REPO / "tests" / "support" / "gpu_feed_train.py"


def test_the_trainers_gpu_samples_through_the_trl_callback_become_the_gpu_series(tmp_path) -> None:
    """A real SFT training on CPU with ExporterFeedCallback(gpu_feed=...) and the fake NVML: the trainer's
    process writes its GPU samples at the bounded rate beside the feed, and the exporter, configured
    gpu.source: feed, serves them as the same posttrain_gpu_* series, with the phase."""
    require_module("trl", "trl")
    model = tmp_path / "model"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    subprocess.run([sys.executable, str(REPO / "tests" / "support" / "trl_train.py"), "build", str(model)], env=env,
                   check=True, capture_output=True, timeout=300)
    feed, samples = tmp_path / "feed.jsonl", tmp_path / "gpu-samples.jsonl"
    res = subprocess.run([sys.executable, str(FEED_TRAIN), str(model), str(tmp_path / "out"), "--feed", str(feed),
                          "--gpu-feed", str(samples)], env=env, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode()[-4000:]
    lines = [parse_sample(line) for line in samples.read_text().splitlines()]
    assert len(lines) >= 3, samples.read_text()
    times = [t for t, *_ in lines]
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.45  # the bounded rate (0.5 s)
    for _, nvml_up, _, gpus in lines:
        assert nvml_up and [g["uuid"] for g in gpus] == ["GPU-feed-0", "GPU-feed-1"]
        assert {g["power_watts"] for g in gpus} <= {300.0, 150.0, 320.0, 140.0}
    # the exporter, configured for the feed, on the training's own files
    cfg = tmp_path / "exporter.yml"
    cfg.write_text(yaml.safe_dump({"gpu": {"source": "feed", "feed_file": str(samples)}}))
    out = subprocess.run([sys.executable, "-m", "exporter", "dump", "--config", str(cfg), "--run", "sft", str(feed)],
                         env=env, capture_output=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    text = out.stdout.decode()
    assert 'posttrain_gpu_source_configured{source="feed"} 1.0' in text
    assert 'posttrain_gpu_source_active{source="feed"} 1.0' in text
    lines_out = text.splitlines()
    for uuid in ("GPU-feed-0", "GPU-feed-1"):
        assert any(ln.startswith("posttrain_gpu_power_watts{") and f'UUID="{uuid}"' in ln for ln in lines_out), text
        assert any(ln.startswith("posttrain_gpu_phase{") and f'UUID="{uuid}"' in ln and ln.endswith(" 1.0")
                   for ln in lines_out)
    assert "posttrain_step" in text  # the training's own records beside them


def test_the_gpu_feed_reader_counts_bad_lines_and_drops_stale_samples(tmp_path) -> None:
    path = tmp_path / "gpu.jsonl"
    good = {"t": 1000.0, "nvml_up": True, "cuda_devices": 1,
            "gpus": [{"gpu": 0, "uuid": "GPU-a", "model": "m", "utilization_ratio": 1.0, "power_watts": 300.0}]}
    path.write_text("not json\n" + json.dumps(good) + "\n" + '{"t": 1001, "gpus": [{"gpu": "zero"}]}\n'
                    + '{"t": 1002, "nvml_up": true, "gpus": [{"gpu": 0, "uuid": "GPU-a", "power_watts": "hot"}]}\n')
    now = [1010.0]
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=lambda: now[0])
    snap = reader.poll_once()
    assert dict(snap.errors) == {"feed_bad_line": 3}
    (g,) = snap.gpus
    assert (g.uuid, g.power_watts, g.phase.phase) == ("GPU-a", 300.0, "training")
    assert reader.trainer_has_gpus()
    now[0] = 1100.0  # the trainer stopped sampling: nothing stale is served
    assert reader.poll_once().gpus == ()
    assert not reader.active()
    with path.open("a") as f:  # a line being written is not read before its end
        f.write(json.dumps({**good, "t": 1101.0})[:20])
    assert reader.poll_once().gpus == ()
    with path.open("a") as f:
        f.write(json.dumps({**good, "t": 1101.0})[20:] + "\n")
    assert reader.poll_once().gpus[0].power_watts == 300.0


def _gpu_line(t: float, **values: float) -> str:
    gpu = {"gpu": 0, "uuid": "GPU-a", "model": "m", "utilization_ratio": 0.9, "power_watts": 600.0,
           "memory_used_bytes": 2e9, "memory_total_bytes": 8e10, **values}
    return json.dumps({"t": t, "nvml_up": True, "cuda_devices": 1, "gpus": [gpu]}) + "\n"


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_sample_from_the_future_neither_freezes_the_feed_nor_keeps_it_fresh(tmp_path, caplog) -> None:
    """A line stamped an hour ahead (a clock step): skipped and counted, said once; the real samples after it are
    served; freshness follows arrival on the reader's own clock, not the stamps."""
    caplog.set_level(logging.INFO, logger="exporter.gpu.feed_samples")
    path = tmp_path / "gpu.jsonl"
    wall, mono = _Clock(1000.0), _Clock(0.0)
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=wall, clock=mono)
    path.write_text(_gpu_line(1000.0) + _gpu_line(1000.0 + 3600) + _gpu_line(1000.0 + 3601))
    reader.poll_once()
    for k in range(1, 6):
        wall.t, mono.t = 1000.0 + 10 * k, 10.0 * k
        with path.open("a") as f:  # the GPU goes idle: the board must show it
            f.write(_gpu_line(wall.t, utilization_ratio=0.0, power_watts=70.0))
        snap = reader.poll_once()
    assert dict(snap.errors) == {"feed_future_sample": 2}
    (g,) = snap.gpus
    assert (g.utilization_ratio, g.power_watts, g.phase.phase) == (0.0, 70.0, "idle")
    assert snap.last_poll_timestamp == 1050.0
    said = [r.getMessage() for r in caplog.records if "ahead of this clock" in r.getMessage()]
    assert len(said) == 1 and r"3600s ahead" in said[0]
    # Stamps that stay within the bound of the wall clock (a trainer's clock 25 s fast) but no new line for longer
    # than the bound on the reader's own clock: stale, whatever the stamps say.
    with path.open("a") as f:
        f.write(_gpu_line(wall.t + 25))
    reader.poll_once()
    assert reader.active()
    mono.t += 31
    assert reader.poll_once().gpus == () and not reader.active()


def test_a_clock_stepped_back_under_the_last_sample_does_not_freeze_the_feed(tmp_path) -> None:
    path = tmp_path / "gpu.jsonl"
    wall, mono = _Clock(5000.0), _Clock(0.0)
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=wall, clock=mono)
    path.write_text(_gpu_line(5000.0))
    reader.poll_once()
    wall.t, mono.t = 1000.0, 1.0  # the clock (both sides') stepped back more than an hour
    with path.open("a") as f:
        f.write(_gpu_line(1000.0, power_watts=300.0))
    snap = reader.poll_once()
    assert [g.power_watts for g in snap.gpus] == [300.0] and snap.errors == ()


def test_feed_values_out_of_range_are_refused_counted_and_a_percent_is_not_guessed(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="exporter.gpu.feed_samples")
    path = tmp_path / "gpu.jsonl"
    path.write_text(_gpu_line(1000.0, utilization_ratio=87.0, power_watts=-5.0, memory_used_bytes=9e10))
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=lambda: 1000.0)
    snap = reader.poll_once()
    (g,) = snap.gpus
    assert (g.utilization_ratio, g.power_watts, g.memory_used_bytes, g.memory_total_bytes, g.phase) == \
        (None, None, None, None, None)
    assert dict(snap.errors) == {"feed_out_of_range": 4}
    said = [r.getMessage() for r in caplog.records if "out of range" in r.getMessage()]
    assert any("utilization_ratio out of range (87 > 1; a percent?" in m for m in said)
    with path.open("a") as f:  # plausible again
        f.write(_gpu_line(1001.0, utilization_ratio=1.0, power_watts=0.0))
    (g,) = reader.poll_once().gpus
    assert (g.utilization_ratio, g.power_watts, g.memory_used_bytes) == (1.0, 0.0, 2e9)


def test_a_wrong_gpu_source_stops_the_exporter_at_start_saying_what_to_fix() -> None:
    from exporter.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"gpu\.source.*dcgm, feed, nvml"):
        parse_config({"gpu": {"source": "dcgm-exporter"}})
    with pytest.raises(ConfigError, match=r"gpu\.feed_file"):
        parse_config({"gpu": {"source": "feed"}})
    with pytest.raises(ConfigError, match=r"gpu\.expected"):
        parse_config({"gpu": {"expected": "yes"}})
    cfg = parse_config({"gpu": {"source": "feed", "feed_file": "/logs/gpu-samples.jsonl", "expected": True}})
    assert (cfg.gpu.source, cfg.gpu.feed_file, cfg.gpu.expected) == ("feed", "/logs/gpu-samples.jsonl", True)


def test_the_chart_passes_the_gpu_source_to_the_exporter_and_refuses_an_unknown_one(tmp_path) -> None:
    try:
        import helm_python
    except ImportError:
        if IN_CI:
            pytest.fail("helm-python-sdk is not installed; the Helm tests never skip in CI")
        pytest.skip("helm-python-sdk is not installed")
    from exporter.config import parse_config

    with helm_python.Chart.load(REPO / "helm" / "posttrain-exporter") as chart:
        out = chart.render(values={"gpu": {"source": "feed", "expected": True}}, name="demo", namespace="ml")
        cm = yaml.safe_load(out["posttrain-exporter/templates/configmap.yaml"])
        gpu = yaml.safe_load(cm["data"]["config.yaml"])["gpu"]
        assert gpu == {"source": "feed", "expected": True, "feed_file": "/logs/gpu-samples.jsonl"}
        assert parse_config({"gpu": gpu}).gpu.source == "feed"
        # the user's config.gpu keeps what it sets
        out = chart.render(values={"config": {"gpu": {"source": "nvml", "interval_seconds": 2}}}, name="d",
                           namespace="ml")
        cm = yaml.safe_load(out["posttrain-exporter/templates/configmap.yaml"])
        assert yaml.safe_load(cm["data"]["config.yaml"])["gpu"] == {"source": "nvml", "interval_seconds": 2,
                                                                     "expected": False}
        with pytest.raises(Exception, match="source"):
            chart.render(values={"gpu": {"source": "dcgm-exporter"}}, name="demo", namespace="ml")


def test_the_gpu_feed_writer_counts_what_it_cannot_write_and_writes_again(tmp_path, caplog) -> None:
    """The trainer's GPU feed where its folder cannot be made (a file holds the name): samples are lost, counted,
    said once; once the way is clear, the next sample is written and that is said too. Never raises."""
    import logging

    from fake_nvml import FakeGpu, FakeNvml

    from exporter.integrations.gpu_feed import GpuFeedWriter
    blocker = tmp_path / "volume"
    blocker.write_text("not a folder")
    writer = GpuFeedWriter(blocker / "gpu-samples.jsonl", 1.0, nvml=FakeNvml([FakeGpu("GPU-0000")]), env={})
    with caplog.at_level(logging.WARNING, logger="exporter.integrations.gpu_feed"):
        assert not writer.sample_once() and not writer.sample_once()
        assert writer.lost == 2 and writer.written == 0
        assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1
        blocker.unlink()
        assert writer.sample_once()
        assert writer.written == 1 and "again (2 samples were lost)" in caplog.records[-1].getMessage()
    writer.stop()
    assert json.loads((blocker / "gpu-samples.jsonl").read_text().splitlines()[0])


# --- hostile GPU feeds -------------------------------------------------------------------------------------------


def _gpu_sample(t: float, gpus: int = 1, uuid: str = "GPU-a", model: str = "m") -> str:
    return json.dumps({"t": t, "nvml_up": True, "cuda_devices": gpus, "gpus": [
        {"gpu": g, "uuid": f"{uuid}{'' if gpus == 1 else g}", "model": model, "utilization_ratio": 1.0,
         "power_watts": 300.0} for g in range(gpus)]}) + "\n"


def test_the_gpu_feed_reader_skips_long_lines_and_samples_of_too_many_gpus(tmp_path) -> None:
    """A whole line over 64 KiB was parsed when it came in one read (a GPU named by 100 KB of text was served), and
    a sample of 5,000 GPUs was served as 5,000 GPUs: both are skipped and counted; the samples around them are read."""
    path = tmp_path / "gpu.jsonl"
    path.write_text(_gpu_sample(1000.0) + _gpu_sample(1001.0, uuid="GPU-long", model="x" * 100_000)
                    + _gpu_sample(1002.0, gpus=5000, uuid="GPU-many-") + _gpu_sample(1003.0))
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=lambda: 1005.0)
    snap = reader.poll_once()
    assert [g.uuid for g in snap.gpus] == ["GPU-a"] and snap.last_poll_timestamp == 1003.0
    assert dict(snap.errors) == {"feed_bad_line": 2}


def test_the_rest_of_a_long_line_read_across_looks_is_skipped_once(tmp_path) -> None:
    """A 200 KB line whose end had not been written yet was dropped at its first look, and its rest, read at the
    next, was parsed as a line of its own (a second error, garbage read as a sample): the rest is skipped to its
    newline, the error counted once, and the sample after it read."""
    path = tmp_path / "gpu.jsonl"
    path.write_text(_gpu_sample(1000.0) + '{"t": 1001, "gpus": [], "pad": "' + "g" * 200_000)
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=lambda: 1005.0)
    assert [g.uuid for g in reader.poll_once().gpus] == ["GPU-a"]
    with path.open("a") as f:
        f.write("g" * 1000 + '"}\n' + _gpu_sample(1004.0, uuid="GPU-b"))
    snap = reader.poll_once()
    assert [g.uuid for g in snap.gpus] == ["GPU-b"] and dict(snap.errors) == {"feed_bad_line": 1}


def test_gpus_that_come_and_go_keep_the_phase_trackers_bounded(tmp_path) -> None:
    """A feed whose every sample names new GPUs (another node's file appended to it, or garbage that parses) kept a
    phase tracker for every UUID ever seen: at most MAX_PHASES are kept, today's GPUs among them."""
    from exporter.gpu.feed_samples import MAX_PHASES

    path = tmp_path / "gpu.jsonl"
    path.write_text("".join(_gpu_sample(1000.0 + i / 100, uuid=f"GPU-{i}") for i in range(MAX_PHASES + 200)))
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=lambda: 1010.0)
    snap = reader.poll_once()
    assert len(reader._phases) <= MAX_PHASES and f"GPU-{MAX_PHASES + 199}" in reader._phases
    assert [g.uuid for g in snap.gpus] == [f"GPU-{MAX_PHASES + 199}"]


def test_a_gpu_feed_left_by_another_run_is_not_served(tmp_path) -> None:
    """A sidecar started beside the GPU file of a run that ended an hour ago (the same path, another training): its
    samples are not served as this run's GPUs. This held before; the test keeps it so."""
    path = tmp_path / "gpu.jsonl"
    path.write_text("".join(_gpu_sample(1000.0 + i) for i in range(100)))
    reader = FeedGpuReader(str(path), stale_after_seconds=30, wall_clock=lambda: 1000.0 + 3600)
    snap = reader.poll_once()
    assert snap.gpus == () and not reader.active() and snap.visible_devices == 0
    with path.open("a") as f:  # the new run starts writing: its samples are served
        f.write(_gpu_sample(4599.0, uuid="GPU-new"))
    assert [g.uuid for g in reader.poll_once().gpus] == ["GPU-new"]
