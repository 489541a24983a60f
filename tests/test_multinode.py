"""Many pods, many teams, and DCGM beside us, on a real Prometheus.

Three exporters (the real `posttrain-exporter serve`, each with a fake NVML of its own GPUs) and a static
dcgm-exporter page, scraped by one Prometheus with the target labels a PodMonitor gives (namespace, pod):
- run "grpo-multi" of namespace team-a on two nodes: rank 0 logs the training records (the TRL GRPO fixture) and
  serves two GPUs; rank 1 logs no metrics (a worker's output) and serves its own two GPUs;
- run "grpo-multi" of namespace team-b: another team's run with the same name, one GPU.

Checked: the GPU series join DCGM's on(UUID) (the same label name), the GPU board shows every rank's GPUs of the
selected run and namespace (none of the other team's), and the training boards keep two same-named runs of two
namespaces apart."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from conftest import REPO, TRL, require_binary
from support import boards as preview
from support.loopback import Processes, free_port, http_ready

from exporter.dashboards import gpu as gpu_board
from exporter.dashboards import grpo as grpo_board

RUN = "grpo-multi"
# pod -> (namespace, log holds training records, {UUID: utilization %})
PODS = {
    "team-a-rank0": ("team-a", True, {"GPU-0a000000-0000-0000-0000-000000000000": 91,
                                      "GPU-0a000000-0000-0000-0000-000000000001": 87}),
    "team-a-rank1": ("team-a", False, {"GPU-1b000000-0000-0000-0000-000000000000": 64,
                                       "GPU-1b000000-0000-0000-0000-000000000001": 58}),
    "team-b-rank0": ("team-b", True, {"GPU-2c000000-0000-0000-0000-000000000000": 33}),
}
ALL_GPUS = {u: util for _, _, gpus in PODS.values() for u, util in gpus.items()}

# The real exporter CLI with tests/fake_nvml.py standing in for pynvml (the sampler imports pynvml lazily).
LAUNCHER = """\
import os, sys
sys.path.insert(0, {tests!r})
import fake_nvml
gpus = [fake_nvml.FakeGpu(uuid=u, utilization=int(util), power_mw=400_000)
        for u, util in (item.split("=") for item in sys.argv[1].split(","))]
sys.modules["pynvml"] = fake_nvml.FakeNvml(gpus)
for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
    os.environ.pop(k, None)
from exporter.cli import main
sys.exit(main(sys.argv[2:]))
"""


def dcgm_page() -> bytes:
    """What dcgm-exporter serves for these GPUs (its label names: gpu, UUID, pci_bus_id, device, modelName,
    Hostname), utilization in percent."""
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for n, (_ns, _, gpus) in enumerate(PODS.values()):
        for i, (uuid, util) in enumerate(gpus.items()):
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="{uuid}",pci_bus_id="00000000:{i + 0x18:02X}:00.0",'
                         f'device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-{n}"}} {util}')
    return ("\n".join(lines) + "\n").encode()


class Prom:
    def __init__(self, port: int) -> None:
        self.port = port

    def query(self, promql: str, path: str = "query", **params: float) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode({'query': promql, **params})}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as e:
            answer = json.loads(e.read())
        if answer["status"] != "success":
            raise ValueError(f"{answer.get('error')}\n{promql}")
        return answer["data"]["result"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    prometheus = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("multinode")
    (tmp / "launch.py").write_text(LAUNCHER.format(tests=str(REPO / "tests")))
    page = dcgm_page()

    class Dcgm(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    dcgm = ThreadingHTTPServer(("127.0.0.1", 0), Dcgm)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    ports = {pod: free_port() for pod in PODS}
    prom_port = free_port()
    targets = [{"targets": [f"127.0.0.1:{ports[pod]}"], "labels": {"namespace": ns, "pod": pod}}
               for pod, (ns, _, _) in PODS.items()]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
        "rule_files": [str(REPO / "rules" / "posttrain.recording.yml")],  # the GPU board's data source series
        "scrape_configs": [
            {"job_name": "posttrain", "static_configs": targets},
            {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{dcgm.server_address[1]}"],
                                                     "labels": {"namespace": "gpu-operator"}}]}]}))
    with Processes(tmp, REPO) as procs:
        for pod, (_ns, records, gpus) in PODS.items():
            log = tmp / f"{pod}.train.log"  # not {pod}.log: the process's own output goes there
            if records:
                shutil.copyfile(TRL / "grpo" / "combined.log", log)
            else:  # a worker rank: its trainer prints, but logs no metrics
                log.write_text("[rank1]: loading checkpoint shards\n[rank1]: waiting for rank 0\n")
            cfg = {"listen_address": f"127.0.0.1:{ports[pod]}", "poll_interval_seconds": 0.1,
                   "logs": [{"path": str(log), "run": RUN}]}
            (tmp / f"{pod}.yml").write_text(yaml.safe_dump(cfg))
            procs.start(pod, [sys.executable, str(tmp / "launch.py"),
                              ",".join(f"{u}={util}" for u, util in gpus.items()),
                              "serve", "--config", str(tmp / f"{pod}.yml")])
        procs.start("prometheus", [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        s = Prom(prom_port)
        procs.wait("Prometheus ready", lambda: http_ready(prom_port), 30)
        procs.wait("every target up", lambda: len(s.query("up == 1")) == len(PODS) + 1, 30)
        procs.wait("every GPU sampled", lambda: len(s.query("posttrain_gpu_phase_seconds_total")) >= 3 * 5, 30)
        procs.wait("every pod's GPU source recorded", lambda: len(s.query("posttrain_gpu_data_source")) == 3, 30)
        procs.wait("both rank 0s read", lambda: len(s.query(f'posttrain_run_finished{{run="{RUN}"}} == 1')) == 2,
                   60)
        try:
            yield s
        finally:
            dcgm.shutdown()
            dcgm.server_close()


def test_gpu_series_join_dcgm_on_uuid(stack) -> None:
    joined = stack.query("DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left posttrain_gpu_utilization_ratio")
    assert {r["metric"]["UUID"]: float(r["value"][1]) for r in joined} \
        == pytest.approx({u: util * util / 100 for u, util in ALL_GPUS.items()})
    # the same GPU, read by both: DCGM's percent is the exporter's ratio
    diff = stack.query("DCGM_FI_DEV_GPU_UTIL / 100 - on(UUID) group_left posttrain_gpu_utilization_ratio")
    assert len(diff) == len(ALL_GPUS) and all(abs(float(r["value"][1])) < 1e-9 for r in diff)
    # and the other way round, DCGM's labels onto ours
    named = stack.query("posttrain_gpu_power_watts * on(UUID) group_left(Hostname, modelName) "
                        "(0 * DCGM_FI_DEV_GPU_UTIL + 1)")
    assert {r["metric"]["UUID"] for r in named} == set(ALL_GPUS)
    assert all(r["metric"]["modelName"] == "NVIDIA H100 80GB HBM3" and r["metric"]["Hostname"] for r in named)


def gpu_targets() -> list[tuple[str, str, str]]:
    board = gpu_board.gpu()
    return [(p["title"], tg["refId"], tg["expr"]) for p in preview.all_panels(board) for tg in p.get("targets", [])
            if "posttrain_gpu_" in tg["expr"]]


def test_gpu_board_keeps_every_rank(stack) -> None:
    team_a = {u for pod, (ns, _, gpus) in PODS.items() if ns == "team-a" for u in gpus}
    instances = {r["metric"]["instance"]: r["metric"]["pod"] for r in stack.query('up{job="posttrain"}')}
    expected = {(pod, str(i)) for pod, (ns, _, gpus) in PODS.items() if ns == "team-a" for i in range(len(gpus))}
    assert len(team_a) == 4 and len(expected) == 4
    checked = 0
    for title, ref, expr in gpu_targets():
        result = stack.query(preview.substitute(expr, [RUN], namespaces=["team-a"]))
        where = f"{title} {ref}"
        assert result, f"{where}: no data"
        assert all(r["metric"]["run"] == RUN and r["metric"]["namespace"] == "team-a" for r in result), where
        if "gpu" in result[0]["metric"]:
            got = {(instances[r["metric"]["instance"]], r["metric"]["gpu"]) for r in result}
            assert got == expected, f"{where}: the GPUs of every rank of the run, and only those: {got}"
            checked += 1
        else:  # the sampler's own health: one series per exporter of the run
            assert {instances[r["metric"]["instance"]] for r in result} == {"team-a-rank0", "team-a-rank1"}, where
    assert checked >= 8
    # the rank without training records has no posttrain_step: joining on it (the old board) loses its GPUs
    assert len(stack.query(f'posttrain_step{{run="{RUN}", namespace="team-a"}}')) == 1


def test_same_run_name_in_two_namespaces_stays_two_runs(stack) -> None:
    board = grpo_board.grpo()
    step = next(p for p in preview.all_panels(board) if p["title"] == "Step")["targets"][0]["expr"]
    both = stack.query(preview.substitute(step, [RUN]))
    assert sorted(r["metric"]["namespace"] for r in both) == ["team-a", "team-b"]
    one = stack.query(preview.substitute(step, [RUN], namespaces=["team-b"]))
    assert [r["metric"]["namespace"] for r in one] == ["team-b"]
    # the step-aligned panels: one line per (namespace, run), named by both
    now = time.time()
    for p in (q for q in preview.all_panels(board) if q["type"] == "trend"):
        answers = {tg["refId"]: stack.query(preview.substitute(tg["expr"], [RUN]), "query_range",
                                            start=now - 3, end=now, step=0.5) for tg in p["targets"]}
        lines = preview.trend_series(p, answers)
        assert sorted(lines) == ["team-a/grpo-multi", "team-b/grpo-multi"], p["title"]
        # the same fixture in both namespaces: the same last logged step and value, on two lines
        assert lines["team-a/grpo-multi"] and lines["team-a/grpo-multi"] == lines["team-b/grpo-multi"], p["title"]
    # the GPU board of team-b: its one GPU, none of team-a's
    for title, ref, expr in gpu_targets():
        result = stack.query(preview.substitute(expr, [RUN], namespaces=["team-b"]))
        assert result and {r["metric"]["namespace"] for r in result} == {"team-b"}, f"{title} {ref}"
