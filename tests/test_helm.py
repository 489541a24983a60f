"""The Helm chart (helm/posttrain-exporter): linted and rendered by Helm's own engine (helm-python-sdk, offline),
every manifest validated against the Kubernetes schemas (kubernetes-validate) and the prometheus-operator CRDs'
essential shape, the PrometheusRule checked by real promtool and against rules/, the dashboards against grafana/,
the sidecar's arguments against the exporter's CLI, and the fallback sidecar's wrapper run for real."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import IN_CI, REPO, free_port, require_binary
from support.loopback import scrape_until

from exporter.cli import build_parser
from exporter.config import parse_config

CHART = REPO / "helm" / "posttrain-exporter"
RULES_DIR = REPO / "rules"
GRAFANA_DIR = REPO / "grafana"
RELEASE, NAMESPACE = "demo", "ml"
FULLNAME = "demo-posttrain-exporter"
JOB = "posttrain-exporter/templates/example-job.yaml"
NATIVE_SIDECAR_MIN = "1.29.0"  # native sidecars (initContainers[].restartPolicy) are beta and on by default


def _require_module(name: str, dist: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        msg = f"{dist} is not installed: pip install helm-python-sdk kubernetes-validate (the `test` extra)"
        if IN_CI:
            pytest.fail(msg + "; the Helm tests never skip in CI")
        pytest.skip(msg)


@pytest.fixture(scope="module")
def helm():
    return _require_module("helm_python", "helm-python-sdk")


@pytest.fixture(scope="module")
def kval():
    return _require_module("kubernetes_validate", "kubernetes-validate")


@pytest.fixture(scope="module")
def chart(helm):
    with helm.Chart.load(CHART) as c:
        yield c


def render(chart, values: dict | None = None) -> list[dict]:
    """Every manifest the chart renders with `values`, NOTES.txt left out."""
    out = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def pod_spec(docs: list[dict]) -> dict:
    (job,) = of_kind(docs, "Job")
    return job["spec"]["template"]["spec"]


def sidecar_of(spec: dict) -> dict:
    (c,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "posttrain-exporter"]
    return c


@pytest.fixture(scope="module")
def rendered(chart) -> dict[str, list[dict]]:
    return {
        "default": render(chart),
        "example": render(chart, {"exampleJob": {"enabled": True}}),
        "fallback": render(chart, {"exampleJob": {"enabled": True}, "sidecar": {"native": False}}),
    }


# --- one source: the chart's copies of rules/ and grafana/ ----------------------------------------------------


def test_chart_copies_equal_rules_and_grafana():
    done = subprocess.run([sys.executable, "scripts/sync_chart.py", "--check"], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"chart copies out of date:\n{done.stdout}{done.stderr}"


def test_image_tag_is_the_app_version():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    from exporter.buildinfo import VERSION  # pyproject.toml reads its version from there

    assert meta["apiVersion"] == "v2"
    assert values["image"]["tag"] == str(meta["appVersion"]) == VERSION


# --- lint and schema ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, {"exampleJob": {"enabled": True}},
                                    {"exampleJob": {"enabled": True}, "sidecar": {"native": False}},
                                    {"exampleJob": {"enabled": True}, "sidecar": {"logSource": "kubernetes"},
                                     "serviceAccount": {"create": True}},
                                    yaml.safe_load((REPO / "helm" / "examples" / "cluster-values.yaml").read_text())])
def test_lint_strict_is_clean(helm, values):
    report = helm.lint(CHART, values, strict=True, kube_version="v" + NATIVE_SIDECAR_MIN)
    assert not report["errors"], report
    # severity 1 (info, e.g. "icon is recommended") is fine; warnings and errors are not
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(("values", "where", "why"), [
    ({"podMonitor": {"interval": "-30s"}}, "/podMonitor/interval", "does not match pattern"),
    ({"podMonitor": {"scrapeTimeout": "ten seconds"}}, "/podMonitor/scrapeTimeout", "does not match pattern"),
    ({"podMonitr": {"enabled": False}}, "additional properties 'podMonitr' not allowed", ""),
    ({"sidecar": {"nativ": True}}, "additional properties 'nativ' not allowed", ""),
    ({"sidecar": {"port": "9847"}}, "/sidecar/port", "want integer"),
    ({"sidecar": {"port": 9847.5}}, "/sidecar/port", "want integer"),
    ({"sidecar": {"port": 70000}}, "/sidecar/port", "maximum"),
    ({"alerts": {"disabled": "PostTrainKLWarning"}}, "/alerts/disabled", "want array"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", ""),
])
def test_schema_refuses_wrong_values_with_the_key(helm, chart, values, where, why):
    with pytest.raises(helm.HelmValuesError) as e:
        chart.render(values=values, name=RELEASE)
    assert where in str(e.value) and why in str(e.value), str(e.value)


def test_unknown_disabled_alert_stops_the_render_naming_the_known_ones(helm, chart):
    with pytest.raises(helm.HelmRenderError, match=r'alerts.disabled: "PostTrainNoSuchAlert" is not an alert.*'
                                                    r'PostTrainKLCritical'):
        chart.render(values={"alerts": {"disabled": ["PostTrainNoSuchAlert"]}}, name=RELEASE)


# --- Kubernetes schemas and the CRDs' shapes ------------------------------------------------------------------

DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                         r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                           "labels": STRMAP, "annotations": STRMAP}}
# SecretKeySelector, SafeTLSConfig and BasicAuth of prometheus-operator's API reference (monitoring.coreos.com/v1).
SECRET_KEY = {"type": "object", "required": ["key"], "additionalProperties": False,
              "properties": {"name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}}}
SECRET_OR_CONFIGMAP = {"type": "object", "additionalProperties": False,
                       "properties": {"secret": SECRET_KEY, "configMap": SECRET_KEY}}
SAFE_TLS_CONFIG = {"type": "object", "additionalProperties": False, "properties": {
    "ca": SECRET_OR_CONFIGMAP, "cert": SECRET_OR_CONFIGMAP, "keySecret": SECRET_KEY, "serverName": {"type": "string"},
    "insecureSkipVerify": {"type": "boolean"}, "minVersion": {"type": "string"}, "maxVersion": {"type": "string"}}}
BASIC_AUTH = {"type": "object", "additionalProperties": False,
              "properties": {"username": SECRET_KEY, "password": SECRET_KEY}}
# The essential fields of prometheus-operator's monitoring.coreos.com/v1 CRDs (their openAPIV3Schema: field
# names, types, Duration pattern, required fields), written from the operator's API reference.
CRD_SCHEMAS = {
    "PodMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": METADATA,
            "spec": {"type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
                "selector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchLabels": STRMAP, "matchExpressions": {"type": "array"}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "jobLabel": {"type": "string"},
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "properties": {
                        "port": {"type": "string"}, "portNumber": {"type": "integer"}, "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https"]}, "interval": DURATION,
                        "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
                        "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"},
                        "tlsConfig": SAFE_TLS_CONFIG, "basicAuth": BASIC_AUTH}}}}}}},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": METADATA,
            "spec": {"type": "object", "additionalProperties": False, "properties": {
                "groups": {"type": "array", "items": {
                    "type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                        "name": {"type": "string", "minLength": 1}, "interval": DURATION,
                        "query_offset": DURATION, "limit": {"type": "integer"}, "labels": STRMAP,
                        "partial_response_strategy": {"type": "string"},
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["expr"], "additionalProperties": False,
                            "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                            "properties": {
                                "alert": {"type": "string"}, "record": {"type": "string"},
                                "expr": {"type": ["string", "integer"]}, "for": DURATION,
                                "keep_firing_for": DURATION, "labels": STRMAP, "annotations": STRMAP}}}}}}}}}},
}


@pytest.mark.parametrize("case", ["default", "example", "fallback"])
def test_every_manifest_validates(kval, rendered, case):
    versions = [NATIVE_SIDECAR_MIN, kval.utils.latest_version()]
    kinds = set()
    for doc in rendered[case]:
        kinds.add(doc["kind"])
        if doc["kind"] in CRD_SCHEMAS:
            jsonschema.Draft7Validator(CRD_SCHEMAS[doc["kind"]]).validate(doc)
            continue
        for version in versions:
            try:
                kval.validate(doc, version, strict=True)
            except kval.ValidationError as e:
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']} against Kubernetes {version}: {e.message} "
                            f"at {'/'.join(map(str, e.path))}")
    assert {"ConfigMap", "PodMonitor", "PrometheusRule"} <= kinds
    assert ("Job" in kinds) == (case != "default")


def test_example_job_is_off_by_default_and_podmonitor_selects_its_pod(rendered):
    assert of_kind(rendered["default"], "Job") == []
    (pm,) = of_kind(rendered["example"], "PodMonitor")
    (job,) = of_kind(rendered["example"], "Job")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}


# --- the sidecar ----------------------------------------------------------------------------------------------


def test_example_job_uses_a_native_sidecar(rendered):
    spec = pod_spec(rendered["example"])
    (init,) = spec["initContainers"]
    assert init["name"] == "posttrain-exporter" and init["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["trainer"]
    assert spec["restartPolicy"] == "Never"
    trainer = spec["containers"][0]
    assert "python train.py 2>&1 | tee /logs/train.log" in trainer["args"][0]
    assert {"name": "posttrain-logs", "mountPath": "/logs"} in trainer["volumeMounts"]


def test_fallback_makes_it_a_regular_container_that_the_trainer_stops(rendered):
    spec = pod_spec(rendered["fallback"])
    assert "initContainers" not in spec
    names = [c["name"] for c in spec["containers"]]
    assert names == ["trainer", "posttrain-exporter"]
    side = sidecar_of(spec)
    assert "restartPolicy" not in side
    assert side["command"][:2] == ["sh", "-c"]
    env = {e["name"]: e.get("value") for e in side["env"]}
    assert env["DONE_FILE"] == "/logs/.training-done"
    assert "trap 'touch /logs/.training-done' EXIT" in spec["containers"][0]["args"][0]


@pytest.mark.parametrize("case", ["example", "fallback"])
def test_sidecar_spec(rendered, case):
    spec = pod_spec(rendered[case])
    side = sidecar_of(spec)
    sc = side["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert side["ports"] == [{"name": "metrics", "containerPort": 9847, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert side[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # a restart reads the whole log again: liveness waits until the first start answered (up to 10 minutes)
    assert side["startupProbe"]["periodSeconds"] * side["startupProbe"]["failureThreshold"] >= 600
    assert side["resources"] == {"requests": {"cpu": "50m", "memory": "100Mi"}, "limits": {"memory": "128Mi"}}
    assert {"name": "posttrain-logs", "mountPath": "/logs", "readOnly": True} in side["volumeMounts"]
    # The rendered arguments are accepted by the exporter's own CLI.
    args = build_parser().parse_args(side["args"])
    assert (args.command, args.logs, args.run) == ("serve", ["/logs/train.log"], "example-grpo")
    assert (args.config, args.listen_address) == ("/etc/posttrain-exporter/config.yaml", "0.0.0.0:9847")
    (cfg_vol,) = [v for v in spec["volumes"] if v["name"] == "posttrain-exporter-config"]
    assert cfg_vol["configMap"]["name"] == FULLNAME
    assert any(v["name"] == "posttrain-logs" and "emptyDir" in v for v in spec["volumes"])


def test_config_configmap_is_a_config_the_exporter_accepts(chart):
    config = {"run": "grpo-7b", "thresholds": {"kl_warning": 0.3}, "windows": {"size": 30, "min_points": 5}}
    (cm,) = [d for d in of_kind(render(chart, {"config": config}), "ConfigMap") if d["metadata"]["name"] == FULLNAME]
    loaded = yaml.safe_load(cm["data"]["config.yaml"])
    assert loaded["thresholds"]["kl_warning"] == 0.3 and loaded["run"] == "grpo-7b"
    parse_config(loaded)  # raises ConfigError on a config the exporter would refuse at start
    (default_cm,) = [d for d in of_kind(render(chart), "ConfigMap") if d["metadata"]["name"] == FULLNAME]
    # The chart copies no default of the exporter's (a threshold's default changes in one place, the exporter):
    # by default the config is empty and the exporter's own defaults apply, but for where the GPU data come from
    # (values.gpu: a pod's sidecar sees no GPU, so the chart's default source is dcgm, docs/gpu.md).
    default = yaml.safe_load(default_cm["data"]["config.yaml"])
    assert default.pop("gpu") == {"source": "dcgm", "expected": False}
    assert parse_config(default) == parse_config({})
    assert not yaml.safe_load((CHART / "values.yaml").read_text())["config"]


def test_fallback_wrapper_stops_the_exporter_when_the_trainer_is_done(rendered, tmp_path):
    """Runs the fallback sidecar's shell wrapper with the real exporter: it serves until the done file appears,
    then exits 0 after the grace period, so that the Job's pod can complete."""
    side = sidecar_of(pod_spec(rendered["fallback"]))
    log, done, port = tmp_path / "train.log", tmp_path / ".training-done", free_port()
    log.write_text("{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}\n")
    args = [a.replace("/logs/train.log", str(log)).replace("/etc/posttrain-exporter/config.yaml", os.devnull)
            .replace("0.0.0.0:9847", f"127.0.0.1:{port}") for a in side["args"]] + ["--no-gpu"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "posttrain-exporter").symlink_to(Path(sys.executable).parent / "posttrain-exporter")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "DONE_FILE": str(done), "DONE_GRACE_SECONDS": "1"}
    # its own process group: on failure the wrapper and the exporter it started are killed together; its own PID
    # namespace where the tools allow (a pod without shareProcessNamespace: the wrapper is PID 1 and sees no trainer)
    own = ["unshare", "--pid", "--fork", "--mount-proc"] if os.geteuid() == 0 and shutil.which("unshare") else []
    proc = subprocess.Popen([*own, *side["command"], *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, body = time.monotonic() + 20, ""
        while time.monotonic() < deadline and "posttrain_loss{" not in body:  # not posttrain_loss_sign_flips
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
        assert 'posttrain_loss{run="example-grpo"} 0.5' in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200
        time.sleep(2.5)
        assert proc.poll() is None, "the sidecar stopped before the trainer was done"
        done.touch()
        assert proc.wait(timeout=15) == 0, proc.stdout.read().decode()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _pod_namespace():
    """A pod's shared process namespace, as the container runtime makes it with shareProcessNamespace: a new PID
    namespace whose PID 1 stands for the pause process; `_in_pod` starts a container's main process in it, its
    parent outside (so, as in a pod, its parent PID reads 0 there). Needs unshare/nsenter (util-linux) and root."""
    for tool in ("unshare", "nsenter"):
        require_binary(tool)
    if os.geteuid() != 0:
        msg = "a PID namespace needs root here"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    pause = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "600"], start_new_session=True)
    try:
        deadline, pid1, ready = time.monotonic() + 10, "", False
        while time.monotonic() < deadline and not ready:
            with contextlib.suppress(OSError):  # empty until unshare has forked; sleep runs once /proc is mounted
                pid1 = Path(f"/proc/{pause.pid}/task/{pause.pid}/children").read_text().strip()
                ready = bool(pid1) and Path(f"/proc/{pid1}/cmdline").read_bytes().startswith(b"sleep\0")
            time.sleep(0.05)
        assert ready, "the pod's namespace did not start"
        yield pid1
    finally:
        os.killpg(pause.pid, signal.SIGKILL)
        pause.wait()


def _in_pod(pid1: str, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    """A container's main process in the pod's namespace (its own process group: killed as a container is)."""
    return subprocess.Popen(["nsenter", "-t", pid1, "-p", "-m", "--", *argv], env=env, start_new_session=True, **kw)


def _fallback_pod(chart, tmp_path: Path, values: dict) -> tuple[list[str], list[str], dict[str, str], int]:
    """The fallback Job's rendered trainer (argv) and sidecar (argv, env), on this machine's paths: /logs is
    tmp_path, the exporter on PATH, its port free."""
    spec = pod_spec(render(chart, {"exampleJob": {"enabled": True, "command": _TRAINER_LOOP},
                                   "sidecar": {"native": False, **values}}))
    assert spec["shareProcessNamespace"] is True
    (trainer,) = [c for c in spec["containers"] if c["name"] == "trainer"]
    side = sidecar_of(spec)
    logs, port = str(tmp_path), free_port()
    trainer_argv = [*trainer["command"], *(a.replace("/logs", logs) for a in trainer["args"])]
    args = [a.replace("/logs", logs).replace("/etc/posttrain-exporter/config.yaml", os.devnull)
            .replace("0.0.0.0:9847", f"127.0.0.1:{port}") for a in side["args"]] + ["--no-gpu"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "posttrain-exporter").symlink_to(Path(sys.executable).parent / "posttrain-exporter")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env |= {e["name"]: e["value"].replace("/logs", logs) for e in side["env"] if "value" in e}
    return trainer_argv, [*side["command"], *args], env, port


# A trainer that logs a record every 0.2 s for ever (until it is killed)
_TRAINER_LOOP = ("python3 -u -c \"import time; [print({'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, "
                 "'epoch': i / 1000}) or time.sleep(0.2) for i in range(10**6)]\"")


@pytest.mark.parametrize("trainer_process", ["", "python3 -u"])
def test_fallback_sidecar_ends_when_its_trainer_is_killed(chart, tmp_path, trainer_process):
    """The fallback Job's rendered pod spec run as processes in one shared process namespace: the trainer is killed
    (SIGKILL, as the out-of-memory killer does: its EXIT trap never touches the done file); the sidecar sees its
    processes gone, serves its grace period and exits 0 well within a minute, so the Job can complete. With
    trainerProcess set it watches only the trainer's processes, and a pod's other long-lived container does not
    hold it."""
    trainer_argv, sidecar_argv, env, port = _fallback_pod(
        chart, tmp_path, {"doneGraceSeconds": 3, "trainerProcess": trainer_process})
    with _pod_namespace() as pid1:
        other = _in_pod(pid1, ["sleep", "600"], env) if trainer_process else None  # e.g. a proxy's container
        trainer = _in_pod(pid1, trainer_argv, env, stdout=subprocess.DEVNULL)
        sidecar = _in_pod(pid1, sidecar_argv, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            body = scrape_until(port, lambda b: 'posttrain_loss{run="example-grpo"} 0.5' in b, sidecar, 30)
            assert 'posttrain_loss{run="example-grpo"} 0.5' in body
            time.sleep(5)  # longer than the grace period: a live trainer keeps the sidecar up
            assert sidecar.poll() is None, sidecar.stdout.read().decode()
            os.killpg(trainer.pid, signal.SIGKILL)
            killed = time.monotonic()
            rc = sidecar.wait(timeout=60)
            took = time.monotonic() - killed
            out = sidecar.stdout.read().decode()
            assert rc == 0 and "the trainer's processes are gone" in out, out
            assert 3 <= took < 60, took
            assert not (tmp_path / ".training-done").exists()  # it ended without the trainer's word
        finally:
            for p in (trainer, sidecar, other):
                if p is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def test_parent_chart_includes_the_sidecar(helm, kval, tmp_path):
    """What a user does: a training chart that depends on this one and includes the three templates."""
    parent = tmp_path / "training"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "posttrain-exporter")
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "training", "version": "1.0.0", "appVersion": "9.9.9",
        "dependencies": [{"name": "posttrain-exporter", "version": "0.1.0"}]}))
    (parent / "values.yaml").write_text("posttrain-exporter:\n  sidecar:\n    port: 9900\n")
    (parent / "templates" / "job.yaml").write_text("""\
apiVersion: batch/v1
kind: Job
metadata:
  name: grpo-7b
spec:
  template:
    metadata:
      labels:
        {{- include "posttrain-exporter.podLabels" (dict "root" $) | nindent 8 }}
    spec:
      restartPolicy: Never
      initContainers:
        {{- include "posttrain-exporter.sidecar" (dict "root" $) | nindent 8 }}
      containers:
        - name: trainer
          image: trainer:latest
          command: [bash, -c, "set -o pipefail; python train.py 2>&1 | tee /logs/train.log"]
          volumeMounts: [{name: posttrain-logs, mountPath: /logs}]
      volumes:
        {{- include "posttrain-exporter.volumes" (dict "root" $) | nindent 8 }}
""")
    with helm.Chart.load(parent) as c:
        docs = render(c)
    for doc in docs:
        if doc["kind"] not in CRD_SCHEMAS:
            kval.validate(doc, kval.utils.latest_version(), strict=True)
    job = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "grpo-7b")
    spec = job["spec"]["template"]["spec"]
    side = sidecar_of(spec)
    assert side["restartPolicy"] == "Always"
    assert side["image"] == "ghcr.io/posttrain-exporter/posttrain-exporter:0.1.0"  # not the parent's appVersion
    assert side["ports"][0]["containerPort"] == 9900  # the parent's values for the subchart reach the template
    args = build_parser().parse_args(side["args"])
    assert args.run == "$(RUN_NAME)"  # expanded by the kubelet from the env below
    job_name = {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}
    assert side["env"] == [{"name": "RUN_NAME", "valueFrom": job_name}]
    # The volume's ConfigMap is the one the subchart renders, and the subchart's PodMonitor selects the pod.
    (cfg_vol,) = [v for v in spec["volumes"] if v["name"] == "posttrain-exporter-config"]
    assert cfg_vol["configMap"]["name"] in {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    (pm,) = of_kind(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()


# --- the PrometheusRule ---------------------------------------------------------------------------------------


def source_groups() -> list[dict]:
    return [g for path in sorted(RULES_DIR.glob("*.yml")) for g in yaml.safe_load(path.read_text())["groups"]]


def without(groups: list[dict], disabled: set[str]) -> list[dict]:
    out = []
    for g in groups:
        rules = [r for r in g["rules"] if r.get("alert") not in disabled]
        if rules:
            out.append({**g, "rules": rules})
    return out


def normalized(groups: list[dict]) -> list[dict]:
    # YAML through Helm's fromYaml/toYaml: numbers may come back as floats; compare values, not types
    return json.loads(json.dumps(groups), parse_int=float)


def rule_groups(docs: list[dict]) -> list[dict]:
    (pr,) = of_kind(docs, "PrometheusRule")
    return pr["spec"]["groups"]


def test_prometheusrule_holds_the_rules_unchanged(rendered):
    groups = rule_groups(rendered["default"])
    assert normalized(groups) == normalized(source_groups())
    # The Prometheus templates reached the PrometheusRule as they are (not executed or mangled by Helm).
    anns = [r["annotations"]["summary"] for g in groups for r in g["rules"] if "alert" in r]
    assert anns and all("{{" in a for a in anns if "$labels" in a)
    assert any("{{ $labels.run }}" in a for a in anns)


def test_disabled_alerts_are_left_out_and_empty_groups_dropped(chart):
    groups = source_groups()
    pages = next(g for g in groups if g["name"] == "posttrain.pages")
    disabled = {r["alert"] for r in pages["rules"]} | {"PostTrainKLNearZero"}
    got = rule_groups(render(chart, {"alerts": {"disabled": sorted(disabled)}}))
    assert normalized(got) == normalized(without(groups, disabled))
    assert "posttrain.pages" not in {g["name"] for g in got}
    assert of_kind(render(chart, {"prometheusRule": {"enabled": False}, "podMonitor": {"enabled": False}}),
                   "PrometheusRule") == []


@pytest.mark.parametrize("disabled", [[], ["PostTrainKLWarning", "PostTrainGPUMemoryNearCapacity"]])
def test_prometheusrule_passes_promtool(chart, tmp_path, disabled):
    promtool = require_binary("promtool")
    groups = rule_groups(render(chart, {"alerts": {"disabled": disabled}}))
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    n = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {n} rules found" in res.stdout


# --- the dashboards -------------------------------------------------------------------------------------------


def test_dashboard_configmaps_are_those_of_grafana(rendered):
    maps = [d for d in of_kind(rendered["default"], "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    assert all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in maps)
    got = {name: json.loads(text) for d in maps for name, text in d["data"].items()}
    want = {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA_DIR.glob("*.json"))}
    assert got == want  # grafana/ empty: no dashboard ConfigMap at all
    assert len(maps) == len(want)


def test_dashboards_can_be_turned_off(chart):
    docs = render(chart, {"dashboards": {"enabled": False}})
    assert [d for d in of_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]] == []


# --- TLS and basic auth: the web config's Secret and the PodMonitor's scrape settings ---------------------------

WEB = {"secretName": "posttrain-web", "tls": True, "basicAuth": True}
SCRAPE_AUTH = {"scheme": "https", "tlsConfig": {"ca": {"secret": {"name": "posttrain-web", "key": "ca.crt"}},
                                                "serverName": "posttrain-exporter"},
               "basicAuth": {"username": {"name": "posttrain-scrape", "key": "username"},
                             "password": {"name": "posttrain-scrape", "key": "password"}}}


@pytest.fixture(scope="module")
def secured(chart) -> list[dict]:
    return render(chart, {"exampleJob": {"enabled": True}, "sidecar": {"webConfig": WEB}, "podMonitor": SCRAPE_AUTH})


def test_web_config_secret_is_mounted_and_passed(secured):
    spec = pod_spec(secured)
    side = sidecar_of(spec)
    args = build_parser().parse_args(side["args"])
    assert args.web_config_file == "/etc/posttrain-exporter-web/web.yml"
    assert {"name": "posttrain-exporter-web", "mountPath": "/etc/posttrain-exporter-web", "readOnly": True} \
        in side["volumeMounts"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "posttrain-exporter-web"]
    assert vol["secret"] == {"secretName": "posttrain-web"}
    # basic auth on every path: the kubelet's probes check the port (an HTTP probe would get 401)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert side[probe]["tcpSocket"] == {"port": "metrics"} and "httpGet" not in side[probe]


def test_web_config_with_tls_only_probes_over_https(chart):
    side = sidecar_of(pod_spec(render(chart, {"exampleJob": {"enabled": True},
                                              "sidecar": {"webConfig": {"secretName": "w", "tls": True}}})))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert side[probe]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}


def test_no_web_config_by_default(rendered):
    for case in ("example", "fallback"):
        spec = pod_spec(rendered[case])
        side = sidecar_of(spec)
        assert build_parser().parse_args(side["args"]).web_config_file is None
        assert all(v["name"] != "posttrain-exporter-web" for v in spec["volumes"])
        assert all(m["name"] != "posttrain-exporter-web" for m in side["volumeMounts"])


def test_podmonitor_scrapes_with_tls_and_basic_auth(secured, kval):
    (pm,) = of_kind(secured, "PodMonitor")
    jsonschema.Draft7Validator(CRD_SCHEMAS["PodMonitor"]).validate(pm)
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == SCRAPE_AUTH["tlsConfig"] and endpoint["basicAuth"] == SCRAPE_AUTH["basicAuth"]
    for doc in secured:
        if doc["kind"] not in CRD_SCHEMAS:
            kval.validate(doc, kval.utils.latest_version(), strict=True)


def test_lint_is_clean_with_web_config(helm):
    report = helm.lint(CHART, {"exampleJob": {"enabled": True}, "sidecar": {"webConfig": WEB},
                               "podMonitor": SCRAPE_AUTH}, strict=True, kube_version="v" + NATIVE_SIDECAR_MIN)
    assert not report["errors"] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(("values", "where"), [
    ({"podMonitor": {"scheme": "tcp"}}, "/podMonitor/scheme"),
    ({"podMonitor": {"tlsConfig": {"caFile": "/etc/ca.crt"}}}, "additional properties 'caFile' not allowed"),
    ({"podMonitor": {"basicAuth": {"username": "prometheus"}}}, "/podMonitor/basicAuth/username"),
    ({"sidecar": {"webConfig": {"secretName": "w", "key": "a/b"}}}, "/sidecar/webConfig/key"),
    ({"sidecar": {"webConfig": {"secret": "w"}}}, "additional properties 'secret' not allowed"),
])
def test_schema_refuses_wrong_web_values(helm, chart, values, where):
    with pytest.raises(helm.HelmValuesError) as e:
        chart.render(values=values, name=RELEASE)
    assert where in str(e.value), str(e.value)


def test_web_config_from_a_secret_serves_tls_and_auth_for_real(chart, tmp_path):
    """The rendered sidecar's arguments, with the Secret's files where the chart mounts them, start a real exporter
    that answers https with basic auth, as the PodMonitor's settings scrape it."""
    require_binary("openssl")
    import base64
    import ssl

    import bcrypt
    from support.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    secret = tmp_path / "secret"  # what the kubelet puts at webConfig.mountPath
    secret.mkdir()
    for src, name in ((pki.server_cert, "tls.crt"), (pki.server_key, "tls.key")):
        (secret / name).write_bytes(src.read_bytes())
    hashed = bcrypt.hashpw(b"scrape-pass", bcrypt.gensalt(rounds=4)).decode()
    web = {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
           "basic_auth_users": {"prometheus": hashed}}
    (secret / "web.yml").write_text(yaml.safe_dump(web))
    side = sidecar_of(pod_spec(render(chart, {"exampleJob": {"enabled": True}, "sidecar": {"webConfig": WEB}})))
    log, port = tmp_path / "train.log", free_port()
    log.write_text("{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}\n")
    args = [a.replace("/logs/train.log", str(log)).replace("/etc/posttrain-exporter/config.yaml", os.devnull)
            .replace("0.0.0.0:9847", f"127.0.0.1:{port}").replace("/etc/posttrain-exporter-web", str(secret))
            for a in side["args"]] + ["--no-gpu"]
    proc = subprocess.Popen([sys.executable, "-m", "exporter", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        auth = {"Authorization": "Basic " + base64.b64encode(b"prometheus:scrape-pass").decode()}
        deadline, body = time.monotonic() + 20, ""
        while time.monotonic() < deadline and "posttrain_loss{" not in body:
            try:
                req = urllib.request.Request(f"https://localhost:{port}/metrics", headers=auth)
                body = urllib.request.urlopen(req, timeout=2, context=ctx).read().decode()
            except OSError:
                time.sleep(0.2)
        assert 'posttrain_loss{run="example-grpo"} 0.5' in body
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"https://localhost:{port}/metrics", timeout=2, context=ctx)
        assert e.value.code == 401
    finally:
        proc.terminate()
        assert proc.wait(10) == 0, proc.stderr.read().decode()


# --- the cluster's version: native sidecar or the fallback ------------------------------------------------------

OLD_KUBE, NEW_KUBE = "1.28.0", "1.30.0"


def render_at(chart, values: dict | None, kube_version: str, name: str = RELEASE,
              namespace: str = NAMESPACE) -> list[dict]:
    """Like render(), as `helm template --kube-version` renders: .Capabilities.KubeVersion is kube_version.
    helm-python-sdk's Chart.render has no such argument; its native render call takes the option as the Helm SDK
    does (kube_version in the options), so it is called directly."""
    from helm_python import _native

    out = json.loads(_native.call_string("helm_render", chart._raw(), None if values is None else json.dumps(values),
                                         json.dumps({"name": name, "namespace": namespace,
                                                     "kube_version": "v" + kube_version})))
    return [d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def test_native_sidecar_follows_the_kube_version(chart, kval):
    old = pod_spec(render_at(chart, {"exampleJob": {"enabled": True}}, OLD_KUBE))
    new = pod_spec(render_at(chart, {"exampleJob": {"enabled": True}}, NEW_KUBE))
    # 1.30: an init container with restartPolicy Always, the trainer alone in containers
    assert [c["name"] for c in new["initContainers"]] == ["posttrain-exporter"]
    assert new["initContainers"][0]["restartPolicy"] == "Always"
    assert [c["name"] for c in new["containers"]] == ["trainer"]
    # 1.28: the fallback, a regular container stopped by the trainer's done file
    assert "initContainers" not in old
    assert [c["name"] for c in old["containers"]] == ["trainer", "posttrain-exporter"]
    assert "restartPolicy" not in sidecar_of(old)
    assert "trap 'touch /logs/.training-done' EXIT" in old["containers"][0]["args"][0]
    for version, spec in ((OLD_KUBE, old), (NEW_KUBE, new)):
        kval.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                       "template": {"spec": spec}}, version, strict=True)
    # forced either way
    assert "initContainers" not in pod_spec(render_at(chart, {"exampleJob": {"enabled": True},
                                                             "sidecar": {"native": False}}, NEW_KUBE))


def test_forced_native_sidecar_on_an_old_cluster_fails_clearly(helm, chart):
    with pytest.raises(helm.HelmRenderError, match=r"sidecar.native=true needs Kubernetes 1.29 or later .*"
                                                   r"the cluster is v1.28.0"):
        render_at(chart, {"exampleJob": {"enabled": True}, "sidecar": {"native": True}}, OLD_KUBE)
    assert sidecar_of(pod_spec(render_at(chart, {"exampleJob": {"enabled": True}, "sidecar": {"native": True}},
                                         "1.29.0")))["restartPolicy"] == "Always"


def test_chart_kube_version_is_honest():
    """The chart works from 1.25 (the fallback) and says so; the native sidecar is not assumed from it."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["kubeVersion"] == ">=1.25.0-0"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["sidecar"]["native"] is None


# --- the values users reach for ----------------------------------------------------------------------------------


def test_new_values_reach_the_rendered_objects(chart, kval):
    mount = {"name": "hf-cache", "mountPath": "/cache", "readOnly": True}
    startup = {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10, "failureThreshold": 360}
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_label_training_kubeflow_org_replica_index"],
                "targetLabel": "rank"}]
    metric_relabel = [{"sourceLabels": ["__name__"], "regex": "posttrain_gpu_.*", "action": "keep"}]
    docs = render_at(chart, {
        "exampleJob": {"enabled": True},
        "sidecar": {"extraVolumeMounts": [mount], "startupProbe": startup,
                    "extraArgs": ["--log.level", "debug", "--log.format", "json"]},
        "podMonitor": {"honorLabels": True, "relabelings": relabel, "metricRelabelings": metric_relabel,
                       **SCRAPE_AUTH},
        "prometheusRule": {"additionalRuleLabels": {"team": "ml-platform", "severity": "none"},
                           "runbookBaseUrl": "https://wiki.example.com/posttrain/runbooks/"}}, NEW_KUBE)
    side = sidecar_of(pod_spec(docs))
    assert mount in side["volumeMounts"]
    assert side["startupProbe"] == {**side["startupProbe"], **startup}  # merged into the chart's default
    args = build_parser().parse_args(side["args"])  # extraArgs are serve's options, after the subcommand
    assert side["args"][0] == "serve" and side["args"][-4:] == ["--log.level", "debug", "--log.format", "json"]
    assert args.command == "serve"
    (pm,) = of_kind(docs, "PodMonitor")
    jsonschema.Draft7Validator(CRD_SCHEMAS["PodMonitor"]).validate(pm)
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True and endpoint["scheme"] == "https"
    assert endpoint["relabelings"] == relabel and endpoint["metricRelabelings"] == metric_relabel
    assert endpoint["tlsConfig"] == SCRAPE_AUTH["tlsConfig"]
    rules = [r for g in rule_groups(docs) for r in g["rules"]]
    assert all(r["labels"]["team"] == "ml-platform" for r in rules)  # every rule, recording ones too
    # a label the rule sets itself keeps the rule's value
    assert {r["labels"]["severity"] for r in rules if "alert" in r} <= {"critical", "warning"}
    assert all(r["labels"]["severity"] == "none" for r in rules if "record" in r)
    urls = [r["annotations"]["runbook_url"] for r in rules if "alert" in r]
    src = {r["alert"]: r["annotations"]["runbook_url"] for g in source_groups() for r in g["rules"] if "alert" in r}
    assert urls and all(u.startswith("https://wiki.example.com/posttrain/runbooks#") for u in urls)
    assert sorted(u.split("#")[1] for u in urls) == sorted(u.split("#")[1] for u in src.values())
    for doc in docs:
        if doc["kind"] in CRD_SCHEMAS:
            jsonschema.Draft7Validator(CRD_SCHEMAS[doc["kind"]]).validate(doc)
        else:
            kval.validate(doc, NEW_KUBE, strict=True)


def test_kubernetes_log_source_gets_the_downward_api_and_rbac(chart, kval):
    values = {"exampleJob": {"enabled": True}, "serviceAccount": {"create": True},
              "sidecar": {"logSource": "kubernetes", "kubernetesLogs": {"container": "trainer"}}}
    docs = render_at(chart, values, NEW_KUBE)
    spec = pod_spec(docs)
    side = sidecar_of(spec)
    args = build_parser().parse_args(side["args"])
    assert args.logs == ["k8s://trainer"]
    env = {e["name"]: e.get("valueFrom") for e in side["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    (sa,) = of_kind(docs, "ServiceAccount")
    (role,) = of_kind(docs, "Role")
    (binding,) = of_kind(docs, "RoleBinding")
    assert spec["serviceAccountName"] == sa["metadata"]["name"] == FULLNAME
    assert {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]} in role["rules"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    for doc in docs:
        if doc["kind"] not in CRD_SCHEMAS:
            kval.validate(doc, NEW_KUBE, strict=True)
    # an existing service account, no RBAC of ours: nothing rendered for it
    docs = render_at(chart, {**values, "serviceAccount": {"name": "trainer"}, "rbac": {"create": False}}, NEW_KUBE)
    assert pod_spec(docs)["serviceAccountName"] == "trainer"
    assert not of_kind(docs, "ServiceAccount") and not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    # the file source (default) has neither
    docs = render_at(chart, {"exampleJob": {"enabled": True}}, NEW_KUBE)
    assert not of_kind(docs, "Role") and "serviceAccountName" not in pod_spec(docs)
    assert "POD_NAME" not in {e["name"] for e in sidecar_of(pod_spec(docs)).get("env", [])}


@pytest.mark.parametrize(("values", "where"), [
    ({"sidecar": {"native": "yes"}}, "/sidecar/native"),
    ({"sidecar": {"logSource": "stdin"}}, "/sidecar/logSource"),
    ({"sidecar": {"kubernetesLogs": {"container": "Trainer"}}}, "/sidecar/kubernetesLogs/container"),
    ({"sidecar": {"runLabel": "training.kubeflow.org/job name"}}, "/sidecar/runLabel"),
    ({"sidecar": {"extraVolumeMounts": [{"name": "x"}]}}, "/sidecar/extraVolumeMounts/0"),
    ({"podMonitor": {"honorLabels": "true"}}, "/podMonitor/honorLabels"),
    ({"podMonitor": {"relabelings": [{"source_labels": ["a"]}]}}, "additional properties 'source_labels'"),
    ({"podMonitor": {"metricRelabelings": [{"action": "keepit"}]}}, "/podMonitor/metricRelabelings/0/action"),
    ({"prometheusRule": {"additionalRuleLabels": {"team-name": "ml"}}}, "/prometheusRule/additionalRuleLabels"),
    ({"prometheusRule": {"runbookBaseUrl": "wiki/runbooks#x"}}, "/prometheusRule/runbookBaseUrl"),
    ({"serviceAccount": {"craete": True}}, "additional properties 'craete' not allowed"),
])
def test_schema_refuses_wrong_new_values(helm, chart, values, where):
    with pytest.raises(helm.HelmValuesError) as e:
        chart.render(values=values, name=RELEASE)
    assert where in str(e.value), str(e.value)


# --- rules, dashboards and the PodMonitor once per cluster ----------------------------------------------------------

EXAMPLES = REPO / "helm" / "examples"


def test_cluster_release_holds_rules_dashboards_and_one_podmonitor(chart, kval):
    docs = render_at(chart, yaml.safe_load((EXAMPLES / "cluster-values.yaml").read_text()), NEW_KUBE,
                     name="posttrain", namespace="monitoring")
    (pm,) = of_kind(docs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert len(of_kind(docs, "PrometheusRule")) == 1
    assert len([d for d in of_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]) == \
        len(list(GRAFANA_DIR.glob("*.json")))
    assert of_kind(docs, "Job") == []
    for doc in docs:
        if doc["kind"] in CRD_SCHEMAS:
            jsonschema.Draft7Validator(CRD_SCHEMAS[doc["kind"]]).validate(doc)
        else:
            kval.validate(doc, NEW_KUBE, strict=True)


# --- the examples: a Job, a PyTorchJob, a RayJob and a JobSet ------------------------------------------------------

OPERATOR_SCHEMAS = {kind: json.loads((REPO / "tests" / "schemas" / f"{kind.lower()}.schema.json").read_text())
                    for kind in ("PyTorchJob", "RayJob", "JobSet")}
# kind -> (run label, where the operator sets it). Checked against the operators' sources; see helm/examples/README.md.
RUN_LABELS = {
    # kubernetes/kubernetes staging/src/k8s.io/api/batch/v1/types.go (JobNameLabel; the legacy unprefixed one)
    "job": "job-name",
    # kubeflow/training-operator pkg/apis/kubeflow.org/v1/common_types.go (JobNameLabel)
    "pytorchjob": "training.kubeflow.org/job-name",
    # ray-project/kuberay ray-operator/controllers/ray/utils/constant.go (RayClusterLabelKey)
    "rayjob": "ray.io/cluster",
    # kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go (JobSetNameKey)
    "jobset": "jobset.sigs.k8s.io/jobset-name",
}


def example_chart(tmp_path: Path, name: str) -> Path:
    """The example as a user has it after `helm dependency update helm/examples/NAME`: Helm resolves its
    `file://../../posttrain-exporter` dependency and packages this chart into charts/ (in a copy of helm/, so that
    the repository stays clean)."""
    import helm_python

    helm_dir = tmp_path / "helm"
    shutil.copytree(CHART, helm_dir / "posttrain-exporter")
    shutil.copytree(EXAMPLES / name, helm_dir / "examples" / name)
    helm_python.dependency_update(helm_dir / "examples" / name, skip_refresh=True)
    assert [p.name for p in (helm_dir / "examples" / name / "charts").iterdir()] == ["posttrain-exporter-0.1.0.tgz"]
    return helm_dir / "examples" / name


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(role, PodTemplateSpec) of every pod a workload makes; role "rank0" for the pod that reads the log."""
    spec = doc["spec"]
    if doc["kind"] == "Job":
        return [("rank0", spec["template"])]
    if doc["kind"] == "PyTorchJob":
        return [("rank0" if role == "Master" else "worker", r["template"])
                for role, r in spec["pytorchReplicaSpecs"].items()]
    if doc["kind"] == "RayJob":
        cluster = spec["rayClusterSpec"]
        return [("rank0", cluster["headGroupSpec"]["template"])] + \
               [("worker", g["template"]) for g in cluster["workerGroupSpecs"]]
    if doc["kind"] == "JobSet":
        return [("rank0" if r["name"] == "leader" else "worker", r["template"]["spec"]["template"])
                for r in spec["replicatedJobs"]]
    raise AssertionError(doc["kind"])


def validate_workload(kval, doc: dict, version: str) -> None:
    """Core kinds against Kubernetes' schemas; an operator's kind against its schema in tests/schemas/, and the pod
    (or Job) templates inside it against Kubernetes' schemas."""
    if doc["kind"] not in OPERATOR_SCHEMAS:
        kval.validate(doc, version, strict=True)
        return
    jsonschema.Draft7Validator(OPERATOR_SCHEMAS[doc["kind"]]).validate(doc)
    if doc["kind"] == "JobSet":
        for r in doc["spec"]["replicatedJobs"]:
            kval.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": r["name"]},
                           "spec": r["template"]["spec"]}, version, strict=True)
    else:
        for role, template in pod_templates(doc):
            kval.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role},
                           "template": template}, version, strict=True)


@pytest.mark.parametrize("version", [OLD_KUBE, NEW_KUBE])
@pytest.mark.parametrize("name", list(RUN_LABELS))
def test_example_renders_lints_and_validates(helm, kval, tmp_path, name, version):
    path = example_chart(tmp_path, name)
    report = helm.lint(path, {}, strict=True, kube_version="v" + version)
    assert not report["errors"] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    with helm.Chart.load(path) as c:
        docs = render_at(c, None, version, name="grpo-7b", namespace="team-a")
    (workload,) = [d for d in docs if d["kind"] not in ("ConfigMap",)]
    for doc in docs:
        validate_workload(kval, doc, version)
    # per run: no rules, dashboards or PodMonitor (the cluster release has them), only the sidecar's config
    assert {d["kind"] for d in docs} == {"ConfigMap", workload["kind"]}
    cluster = render_at(helm.Chart.load(CHART), yaml.safe_load((EXAMPLES / "cluster-values.yaml").read_text()),
                        version)
    (pm,) = of_kind(cluster, "PodMonitor")
    templates = pod_templates(workload)
    assert [r for r, _ in templates].count("rank0") == 1
    native = version == NEW_KUBE
    for role, template in templates:
        spec = template["spec"]
        # the cluster's PodMonitor selects every pod of the run
        assert pm["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        side = sidecar_of(spec)
        assert (side in spec.get("initContainers", [])) == native
        assert (side.get("restartPolicy") == "Always") == native
        # every pod names the run from the operator's own label
        args = build_parser().parse_args(side["args"])
        assert args.run == "$(RUN_NAME)"
        (run_env,) = [e for e in side["env"] if e["name"] == "RUN_NAME"]
        assert run_env["valueFrom"] == {"fieldRef": {"fieldPath": f"metadata.labels['{RUN_LABELS[name]}']"}}
        # rank 0 reads the training log, the others serve their GPUs and the run's label only
        assert args.logs == (["/logs/train.log"] if role == "rank0" else [])
        assert not args.no_gpu
        if role == "rank0" and name != "rayjob":
            trainer = spec["containers"][0]
            assert "2>&1 | tee /logs/train.log" in trainer["args"][0]
            assert ("trap 'touch /logs/.training-done' EXIT" in trainer["args"][0]) == (not native)
    if name == "rayjob":  # the entrypoint runs on the head pod, whose sidecar follows the log it writes
        assert "| tee /logs/train.log" in workload["spec"]["entrypoint"]
        assert all(t["spec"]["containers"][0]["name"].startswith("ray-") for _, t in templates)  # Ray first
    if name == "pytorchjob":
        assert all(t["spec"]["containers"][0]["name"] == "pytorch" for _, t in templates)


@pytest.mark.parametrize(("kind", "path", "typo"), [
    ("PyTorchJob", ["spec"], "pytorchReplicaSpec"),
    ("PyTorchJob", ["spec", "pytorchReplicaSpecs"], "Launcher"),
    ("RayJob", ["spec", "rayClusterSpec"], "workerGroupSpec"),
    ("RayJob", ["spec", "rayClusterSpec", "workerGroupSpecs", 0], "replica"),
    ("JobSet", ["spec", "replicatedJobs", 0], "replica"),
    ("JobSet", ["spec"], "sucessPolicy"),
])
def test_operator_schemas_catch_typos(helm, tmp_path, kind, path, typo):
    """The CRD schemas refuse an unknown field where the operator's CRD would prune or refuse it."""
    with helm.Chart.load(example_chart(tmp_path, kind.lower())) as c:
        (doc,) = of_kind(render_at(c, None, NEW_KUBE, name="grpo-7b"), kind)
    validator = jsonschema.Draft7Validator(OPERATOR_SCHEMAS[kind])
    validator.validate(doc)
    node = doc
    for key in path:
        node = node[key]
    node[typo] = 1
    assert any(typo in e.message for e in validator.iter_errors(doc))


def test_gpu_only_worker_serves_the_run_label_for_real(helm, tmp_path):
    """A worker's rendered sidecar (logSource none) started with the real exporter: it serves the run's
    posttrain_run_finished (what the GPU board joins each pod's GPUs on) and no training record."""
    with helm.Chart.load(example_chart(tmp_path, "pytorchjob")) as c:
        (job,) = of_kind(render_at(c, None, NEW_KUBE, name="grpo-7b"), "PyTorchJob")
    side = sidecar_of(job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"])
    port = free_port()
    args = [a.replace("$(RUN_NAME)", "grpo-7b").replace("/etc/posttrain-exporter/config.yaml", os.devnull)
            .replace("0.0.0.0:9847", f"127.0.0.1:{port}") for a in side["args"]] + ["--no-gpu"]
    proc = subprocess.Popen([sys.executable, "-m", "exporter", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        body = scrape_until(port, lambda b: "posttrain_run_finished{" in b, proc, 20)
        assert 'posttrain_run_finished{run="grpo-7b"} 0.0' in body
        # no record: no step, and no last-record time, so PostTrainTrainerStalled never fires on a worker
        assert "posttrain_step{" not in body and "posttrain_exporter_last_record_timestamp_seconds{" not in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200
    finally:
        proc.terminate()
        assert proc.wait(10) == 0, proc.stderr.read().decode()


def test_kubernetes_docs_link_what_exists():
    """The Kubernetes walk-through (docs/kubernetes.md, linked from the README's section), the chart's README and the
    examples' README point at files that exist."""
    import re

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Kubernetes\n"):readme.index("\n## ", readme.index("## Kubernetes\n") + 1)]
    assert "docs/kubernetes.md" in section and "helm/examples/cluster-values.yaml" in section
    walk = (REPO / "docs" / "kubernetes.md").read_text()
    for needed in ("kubernetes-source.md", "alertmanager.example.yml", "../helm/examples/cluster-values.yaml",
                   "../helm/examples/pytorchjob", "severity", "training.kubeflow.org/job-name"):
        assert needed in walk, needed
    docs = [(REPO / "README.md", section), (REPO / "docs" / "kubernetes.md", walk), (CHART / "README.md", None),
            (EXAMPLES / "README.md", None)]
    for path, text in docs:
        text = text if text is not None else path.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), f"{path.relative_to(REPO)} links {target}, which is missing"


def test_notes_warn_when_the_podmonitor_has_no_release_label(chart) -> None:
    """kube-prometheus-stack selects PodMonitors by their `release` label: the install notes say so when it is
    missing, and stay quiet once it is set."""
    def notes(values: dict) -> str:
        out = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
        return next(text for path, text in out.items() if path.endswith("NOTES.txt"))

    assert "no `release` label" in notes({})
    assert "podMonitor.labels.release" in notes({})
    assert "no `release` label" not in notes({"podMonitor": {"labels": {"release": "kube-prometheus-stack"}}})
    assert "PodMonitor:" not in notes({"podMonitor": {"enabled": False}})


# --- earlyStop: the stop file, and the stop by signals (docs/early-stop.md) -----------------------------------------

SIGNAL_STOP = {"action": "signal", "process": "train.py", "graceSeconds": 600}


@pytest.mark.parametrize("version", [OLD_KUBE, NEW_KUBE])
def test_early_stop_by_signal_shares_the_process_namespace_and_configures_the_exporter(chart, kval, version):
    docs = render_at(chart, {"exampleJob": {"enabled": True}, "earlyStop": SIGNAL_STOP}, version)
    for doc in of_kind(docs, "Job") + of_kind(docs, "ConfigMap"):
        kval.validate(doc, version, strict=True)
    spec = pod_spec(docs)
    assert spec["shareProcessNamespace"] is True  # also with a native sidecar, which needs it for nothing else
    side = sidecar_of(spec)
    assert {"name": "posttrain-stop", "mountPath": "/posttrain-stop"} in side["volumeMounts"]  # written
    assert {"name": "posttrain-stop", "emptyDir": {}} in spec["volumes"]
    (trainer,) = [c for c in spec["containers"] if c["name"] == "trainer"]
    assert {"name": "posttrain-stop", "mountPath": "/posttrain-stop", "readOnly": True} in trainer["volumeMounts"]
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == FULLNAME]
    es = parse_config(yaml.safe_load(cm["data"]["config.yaml"])).early_stop
    assert (es.action, es.file, es.process, es.signal, es.grace_seconds) == (
        "signal", "/posttrain-stop/posttrain-stop.json", "train.py", "SIGINT", 600)
    # off by default: no volume, no early_stop in the config
    spec = pod_spec(render_at(chart, {"exampleJob": {"enabled": True}}, NEW_KUBE))
    assert "shareProcessNamespace" not in spec and all(v["name"] != "posttrain-stop" for v in spec["volumes"])


def test_early_stop_by_signal_without_a_shared_process_namespace_stops_the_render(helm, tmp_path):
    """The job example shares the pod's processes only for the fallback sidecar: with a native one and the stop by
    signals, the sidecar could never see the trainer, so the render says what to set."""
    with helm.Chart.load(example_chart(tmp_path, "job")) as c:
        with pytest.raises(helm.HelmRenderError, match=r"earlyStop.action=signal: .* the pod must share its process "
                                                       r"namespace: set shareProcessNamespace: true in the pod spec"):
            render_at(c, {"posttrain-exporter": {"earlyStop": SIGNAL_STOP}}, NEW_KUBE)
        render_at(c, {"posttrain-exporter": {"earlyStop": {"action": "file"}}}, NEW_KUBE)  # the file alone: fine


def test_early_stop_by_signal_needs_the_trainers_command(chart):
    import helm_python
    with pytest.raises(helm_python.HelmRenderError, match=r"set earlyStop.process to a piece of the trainer's command"):
        render_at(chart, {"exampleJob": {"enabled": True}, "earlyStop": {"action": "signal"}}, NEW_KUBE)


def test_rayjob_example_stops_the_driver_on_the_head_pod(helm, tmp_path):
    with helm.Chart.load(example_chart(tmp_path, "rayjob")) as c:
        docs = render_at(c, None, NEW_KUBE, name="grpo-7b", namespace="team-a")
    (rayjob,) = of_kind(docs, "RayJob")
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (worker,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert head["shareProcessNamespace"] is True and "shareProcessNamespace" not in worker["template"]["spec"]
    assert sidecar_of(head)["securityContext"]["runAsUser"] == 1000  # Ray's user: the driver's
    (cm,) = of_kind(docs, "ConfigMap")
    es = parse_config(yaml.safe_load(cm["data"]["config.yaml"])).early_stop
    assert es.signals and es.process == "train.py" and "python train.py" in rayjob["spec"]["entrypoint"]
