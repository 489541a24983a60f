"""The kubernetes log source (exporter/sources/kubernetes.py) against a loopback server that speaks the API's pod
log endpoint: GET /api/v1/namespaces/{ns}/pods/{pod}/log?container=..&follow=true&timestamps=true&sinceSeconds=..,
answered with chunked transfer encoding, in chunks that split lines, timestamps and characters, dropping the
connection mid-stream. The source (its own standard-library client, exporter/sources/kubeapi.py) is pointed at it
through a kubeconfig written to tmp, or as a pod's service account over TLS: real client code against a real HTTP
server, nothing mocked. A real cluster was not used (docs/kubernetes-source.md)."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port, require_binary
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config, ConfigError, LogSpec, default_run_name
from exporter.exposition.collector import ExporterCollector
from exporter.parsers.chain import LineParserChain
from exporter.pipeline import ConsoleStream
from exporter.runstate import RunLimits
from exporter.sources.inputs.stream import StreamInput
from exporter.sources.kubernetes import (
    KubernetesLogReader,
    TimestampedLines,
    Timing,
    container_finished,
    parse_path,
    parse_stamp,
)

NS, POD, CONTAINER = "team-a", "grpo-7b-0", "trainer"
FAST = Timing(waiting=0.1, backoff_min=0.05, backoff_max=0.2, reconnect=0.05, connect_timeout=5, read_timeout=30)
FIXTURE = TRL / "grpo" / "combined.log"


def stamp(ts: int) -> bytes:
    """As the kubelet writes it: RFC 3339 with nine fraction digits, UTC."""
    secs, nanos = divmod(ts, 1_000_000_000)
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S").encode() + b".%09dZ" % nanos


def stamped(lines: list[bytes], start: float, seed: int = 0) -> list[tuple[int, bytes]]:
    """Timestamps for `lines` from `start` (seconds), 2-9 ms apart, as a runtime gives them: some lines share one
    exact timestamp, and stdout/stderr lines come slightly out of timestamp order now and then."""
    rng = random.Random(seed)
    ts = int(start * 1e9)
    out = []
    for i, line in enumerate(lines):
        if i % 4:  # every fourth line shares the timestamp of the one before
            ts += rng.randint(2, 9) * 1_000_000
        out.append([ts, line])
    for i in range(5, len(out) - 1, 37):  # a pair out of order by a millisecond
        out[i][0], out[i + 1][0] = out[i + 1][0] + 1_000_000, out[i][0]
    return [(t, line) for t, line in out]


def log_lines(data: bytes) -> list[bytes]:
    """Lines as a container runtime cuts them: at \n only (a progress bar's \r stays inside its line)."""
    parts = data.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def wire(entries: list[tuple[int, bytes]]) -> bytes:
    return b"".join(stamp(t) + b" " + line for t, line in entries)


# --- the loopback API server ----------------------------------------------------------------------------------


class FakeCluster:
    """One pod, one container whose log is `entries`. Each log request takes the next step of `plan`:
    'waiting' (HTTP 400, as for a container not started yet), ('drop', N) (send the log from sinceSeconds, but
    close the connection once N bytes of the whole log, counted from its start, are sent), or 'all' (send it to
    the end and finish the response, as when the container ended). The pod reads Running until the plan is used
    up, then Succeeded."""

    def __init__(self, entries: list[tuple[int, bytes]], plan: list, seed: int = 1,
                 tls: ssl.SSLContext | None = None) -> None:
        self.entries = entries
        self.plan = list(plan)
        self.rng = random.Random(seed)
        self.log_requests: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.auth: set[str] = set()
        self.lock = threading.Lock()
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                cluster.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, tmp: Path) -> Path:
        path = tmp / "kubeconfig"
        path.write_text(json.dumps({  # JSON is YAML
            "apiVersion": "v1", "kind": "Config", "current-context": "loop",
            "clusters": [{"name": "loop", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "sa", "user": {"token": "loopback-token"}}],
            "contexts": [{"name": "loop", "context": {"cluster": "loop", "user": "sa", "namespace": NS}}],
        }))
        return path

    @property
    def finished(self) -> bool:
        return not self.plan

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        self.paths.append(url.path)
        self.auth.add(h.headers.get("Authorization", ""))
        base = f"/api/v1/namespaces/{NS}/pods/{POD}"
        if url.path == base:
            phase = "Succeeded" if self.finished else "Running"
            state = {"terminated": {"exitCode": 0}} if self.finished else {"running": {}}
            self.json(h, 200, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NS},
                               "spec": {"restartPolicy": "Never", "containers": [{"name": CONTAINER}]},
                               "status": {"phase": phase, "containerStatuses": [{"name": CONTAINER, "state": state}]}})
            return
        if url.path != base + "/log":
            self.json(h, 404, {"kind": "Status", "code": 404, "message": f"{url.path} not found"})
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self.log_requests.append(query)
            step = self.plan.pop(0) if self.plan else "all"
        if isinstance(step, tuple) and step[0] == "status":  # another API error: ("status", code, message)
            self.json(h, step[1], {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": step[1],
                                   "message": step[2]})
            return
        if step == "waiting":
            self.json(h, 400, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "BadRequest",
                               "code": 400, "message": f'container "{CONTAINER}" in pod "{POD}" is waiting to start: '
                               "ContainerCreating"})
            return
        since = int(query["sinceSeconds"]) if "sinceSeconds" in query else None
        first = 0
        if since is not None:  # as the kubelet: lines stamped at or after now - sinceSeconds
            cut = int((time.time() - since) * 1e9)
            first = next((i for i, (t, _) in enumerate(self.entries) if t >= cut), len(self.entries))
        body = wire(self.entries[first:])
        limit = len(body)
        if isinstance(step, tuple):  # drop at an offset of the whole log: where this response has got to
            limit = max(0, step[1] - len(wire(self.entries[:first])))
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        pos = 0
        while pos < min(limit, len(body)):
            n = min(self.rng.randint(1, 900), limit - pos)
            h.wfile.write(b"%x\r\n%s\r\n" % (n, body[pos:pos + n]))
            h.wfile.flush()
            pos += n
        if isinstance(step, tuple):  # gone mid-stream: no last chunk
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    @staticmethod
    def json(h: BaseHTTPRequestHandler, code: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


@pytest.fixture
def k8s_env(monkeypatch, tmp_path) -> Iterator[None]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.delenv("POD_NAME", raising=False)
    yield


def families(ex: Exporter) -> dict[tuple[str, tuple], str]:
    """The exposition as {(sample, labels): value}, leaving out what names the source (its path) or the time."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(ex))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        if fam.name.startswith("posttrain_exporter_source_") or fam.name.endswith("last_record_timestamp_seconds"):
            continue
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = repr(s.value)
    return out


def dump_of(path: Path, run: str, cfg: Config | None = None) -> dict[tuple[str, tuple], str]:
    ex = Exporter(cfg or Config(), [LogSpec(str(path), run)])
    ex.read_to_end()
    return families(ex)


def follow_to_end(ex: Exporter, timeout: float = 60) -> StreamInput:
    inp = ex.inputs[0]
    assert isinstance(inp, StreamInput)
    inp.reader.timing = FAST
    deadline = time.monotonic() + timeout
    while not inp.drained:
        assert time.monotonic() < deadline, "the log was not read to its end"
        inp.poll(timeout=0.2)
    for run in ex.runs.values():
        run.refresh()
    return inp


# --- through the API ------------------------------------------------------------------------------------------


def test_follows_through_drops_and_equals_a_dump_of_the_file(k8s_env, monkeypatch, tmp_path) -> None:
    """A real GRPO console log, served after a 400 'waiting to start', in chunks that split lines, with the
    connection dropped mid-line, mid-timestamp and right after one: every reconnect asks with sinceSeconds
    reaching back before the last line read, and the exposition is that of `dump` on the file (no record twice,
    none lost)."""
    raw = FIXTURE.read_bytes()
    entries = stamped(log_lines(raw), time.time() - 90)
    total = len(wire(entries))
    starts = [len(wire(entries[:i])) for i in range(len(entries))]
    drops = [total // 5 + 7, starts[len(entries) // 2] + 12, starts[2 * len(entries) // 3], total - 40]
    cluster = FakeCluster(entries, ["waiting", *(("drop", d) for d in drops), "all"])
    try:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(tmp_path)))
        ex = Exporter(Config(), [LogSpec(f"k8s://{NS}/{POD}/{CONTAINER}", CONTAINER)])
        inp = follow_to_end(ex)
    finally:
        cluster.close()
    assert families(ex) == dump_of(FIXTURE, CONTAINER)
    assert ex.runs[CONTAINER].records["train"] > 0
    reqs = cluster.log_requests
    assert reqs[0] == {"container": CONTAINER, "follow": "true", "timestamps": "true"}  # from the start
    assert "sinceSeconds" not in reqs[1]  # after 'waiting to start', nothing was read: still from the start
    resumed = [r for r in reqs[2:] if r.get("follow") == "true"]
    assert len(resumed) >= len(drops) and all("sinceSeconds" in r for r in resumed)
    for r in resumed:  # reaching back before the log's lines, but not to the beginning of time
        assert 1 <= int(r["sinceSeconds"]) <= time.time() - entries[0][0] / 1e9 + 30
    assert cluster.auth == {"Bearer loopback-token"}  # the kubeconfig's credentials
    stats = inp.follow
    assert stats.read_errors == len(drops)  # the drops; the 400 'waiting to start' is no error
    assert stats.resumed >= len(drops) and not stats.up
    assert stats.bytes_read > len(raw)  # bytes as sent: each line's timestamp, and lines sent again after a drop


def test_a_long_line_obeys_the_line_limit(k8s_env, monkeypatch, tmp_path) -> None:
    """A line longer than limits.max_line_length is dropped and counted, as in a file, and a drop in its middle
    neither glues it to the next record nor loses that record."""
    record = b"{'loss': 0.5, 'grad_norm': 1.25, 'learning_rate': 1e-05, 'epoch': 0.01}\n"
    lines = [record, b"x" * 200_000 + b"\n", record.replace(b"0.01}", b"0.02}")]
    entries = stamped(lines, time.time() - 30)
    cluster = FakeCluster(entries, [("drop", len(wire(entries[:1])) + 90_000), "all"])
    cfg = Config(limits=RunLimits(max_line_length=4096))
    try:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(tmp_path)))
        ex = Exporter(cfg, [LogSpec(f"k8s://{NS}/{POD}/{CONTAINER}", CONTAINER)])
        follow_to_end(ex)
    finally:
        cluster.close()
    path = tmp_path / "trainer.log"
    path.write_bytes(b"".join(lines))
    assert families(ex) == dump_of(path, CONTAINER, cfg)
    assert ex.stats[CONTAINER].lines_dropped["too_long"] == 1
    assert ex.runs[CONTAINER].records["train"] == 2


def test_api_errors_are_counted_logged_once_and_retried(k8s_env, monkeypatch, tmp_path, caplog) -> None:
    """403 (RBAC missing) and 400 for a wrong container are errors, unlike 'waiting to start': counted in
    read_errors, logged once with what to check, retried with backoff; the log is then read whole."""
    lines = log_lines(FIXTURE.read_bytes())[:80]
    entries = stamped(lines, time.time() - 20)
    forbidden = ('pods "grpo-7b-0" is forbidden: User "system:serviceaccount:team-a:trainer" cannot get resource '
                 '"pods/log" in API group "" in the namespace "team-a"')
    cluster = FakeCluster(entries, [("status", 403, forbidden), ("status", 403, forbidden),
                                    ("status", 400, 'container "trainr" is not valid for pod "grpo-7b-0"'), "all"])
    try:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(tmp_path)))
        ex = Exporter(Config(), [LogSpec(f"k8s://{NS}/{POD}/{CONTAINER}", CONTAINER)])
        inp = follow_to_end(ex)
    finally:
        cluster.close()
    path = tmp_path / "trainer.log"
    path.write_bytes(b"".join(lines))
    assert families(ex) == dump_of(path, CONTAINER)
    assert inp.follow.read_errors == 3
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "exporter.sources.kubernetes" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "HTTP 403" in warnings[0] and "`get` on pods/log" in warnings[0], warnings


def test_env_shorthand_and_default_run_name(k8s_env, monkeypatch, tmp_path) -> None:
    """`k8s://CONTAINER` takes the namespace and pod from POD_NAMESPACE and POD_NAME; the run is the pod's, as the
    container's name (`trainer`) says nothing of the run."""
    entries = stamped(log_lines(FIXTURE.read_bytes())[:40], time.time() - 10)
    cluster = FakeCluster(entries, ["all"])
    try:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(tmp_path)))
        monkeypatch.setenv("POD_NAMESPACE", NS)
        monkeypatch.setenv("POD_NAME", POD)
        path = f"k8s://{CONTAINER}"
        assert default_run_name(path) == POD == default_run_name(f"k8s://{NS}/{POD}/{CONTAINER}")
        ex = Exporter(Config(), [LogSpec(path, default_run_name(path))])
        follow_to_end(ex)
    finally:
        cluster.close()
    assert f"/api/v1/namespaces/{NS}/pods/{POD}/log" in cluster.paths
    assert ex.stats[POD].lines["hf_console", "record"] + ex.runs[POD].records["train"] > 0


def test_serve_follows_a_container_and_serves_its_records(k8s_env, tmp_path) -> None:
    """The sidecar as the chart starts it: `serve --log k8s://trainer` with POD_NAMESPACE/POD_NAME set."""
    raw = FIXTURE.read_bytes()
    entries = stamped(log_lines(raw), time.time() - 60)
    cluster = FakeCluster(entries, [("drop", len(wire(entries)) // 2), "all"])
    want = dump_of(FIXTURE, CONTAINER)["posttrain_step", (("run", CONTAINER),)]
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig(tmp_path)), "POD_NAMESPACE": NS, "POD_NAME": POD}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen(exporter_cmd("serve", "--log", f"k8s://{CONTAINER}", "--no-gpu",
                                         "--web.listen-address", f"127.0.0.1:{port}"),
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "posttrain_step" or s.name.startswith("posttrain_exporter_source_")}
            if repr(got.get("posttrain_step")) == want and f"/api/v1/namespaces/{NS}/pods/{POD}" in cluster.paths:
                break
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(10)
        cluster.close()
    assert repr(got.get("posttrain_step")) == want, got
    assert got["posttrain_exporter_source_read_errors_total"] == 1
    assert got["posttrain_exporter_source_resumed_total"] >= 1
    assert proc.returncode in (0, -15), proc.stderr.read().decode()  # stopped by our SIGTERM, never crashed


# --- refused at start -----------------------------------------------------------------------------------------


def test_shorthand_without_downward_api_env_stops_at_start(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("POD_NAMESPACE", "POD_NAME")}
    res = subprocess.run(exporter_cmd("serve", "--log", "k8s://trainer"), env=env, cwd=REPO, capture_output=True,
                         timeout=60)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert "POD_NAMESPACE and POD_NAME are not set" in err and "downward API" in err
    with pytest.raises(ConfigError, match="POD_NAME is not set"):
        parse_path("k8s://trainer", {"POD_NAMESPACE": NS})
    assert parse_path("k8s://trainer", {"POD_NAMESPACE": NS, "POD_NAME": POD}) == parse_path(
        f"k8s://{NS}/{POD}/trainer", {})
    for bad in ("k8s://a/b", "k8s://ns/pod/Trainer", "k8s://ns/pod/", "k8s://a/b/c/d"):
        with pytest.raises(ConfigError, match="k8s://"):
            parse_path(bad, {"POD_NAMESPACE": NS, "POD_NAME": POD})


def test_no_client_package_is_needed(tmp_path) -> None:
    """The source speaks to the API with the standard library: with the kubernetes client, urllib3 and requests
    unimportable, a log is followed to its end (and none of them was imported on the way)."""
    entries = stamped(log_lines(FIXTURE.read_bytes())[:60], time.time() - 10)
    cluster = FakeCluster(entries, [("drop", len(wire(entries)) // 2), "all"])
    code = (f"import sys\nfor m in ('kubernetes', 'urllib3', 'requests'): sys.modules[m] = None\n"
            f"from exporter.sources.kubernetes import KubernetesLogReader, Timing\n"
            f"r = KubernetesLogReader.from_path('k8s://{NS}/{POD}/{CONTAINER}')\n"
            f"r.timing = Timing(backoff_min=0.05, reconnect=0.05)\n"
            f"text = ''\nwhile not r.closed: text += ''.join(r.poll(0.2))\n"
            f"print(text.count(chr(10)), r.stats.resumed)")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig(tmp_path))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    try:
        res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, timeout=60)
    finally:
        cluster.close()
    assert res.returncode == 0, res.stderr.decode()
    lines, resumed = map(int, res.stdout.split())
    assert lines == len(entries) and resumed >= 1, res.stdout


@pytest.fixture
def pki(tmp_path):
    require_binary("openssl")
    from support.certs import make_pki

    return make_pki(tmp_path / "pki")


def _server_tls(pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    return ctx


def test_in_a_pod_the_service_account_token_and_ca_are_used_and_a_rotated_token_is_read_again(
        k8s_env, monkeypatch, tmp_path, pki) -> None:
    """KUBERNETES_SERVICE_HOST set: HTTPS to it, verified with the service account's CA, with its token; the
    kubelet rotates the token file in place, and the next request carries the new token."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(pki.ca.read_bytes())
    (sa / "token").write_text("first-token\n")
    lines = log_lines(FIXTURE.read_bytes())[:80]
    entries = stamped(lines, time.time() - 20)
    cluster = FakeCluster(entries, [("drop", len(wire(entries)) // 3), ("drop", 2 * len(wire(entries)) // 3),
                                    "all"], tls=_server_tls(pki))
    rotated = threading.Event()

    def rotate_after_the_first_request() -> None:
        while not cluster.log_requests:
            time.sleep(0.01)
        (sa / "token.new").write_text("second-token\n")
        os.replace(sa / "token.new", sa / "token")  # as the kubelet does: an atomic swap
        rotated.set()

    threading.Thread(target=rotate_after_the_first_request, daemon=True).start()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")  # the certificate's IP SAN: verified, not skipped
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(cluster.port))
    monkeypatch.setattr("exporter.sources.kubeapi.SERVICE_ACCOUNT", sa)
    try:
        ex = Exporter(Config(), [LogSpec(f"k8s://{NS}/{POD}/{CONTAINER}", CONTAINER)])
        follow_to_end(ex)
    finally:
        cluster.close()
    path = tmp_path / "trainer.log"
    path.write_bytes(b"".join(lines))
    assert families(ex) == dump_of(path, CONTAINER)
    assert rotated.is_set() and cluster.auth == {"Bearer first-token", "Bearer second-token"}


def test_a_server_whose_certificate_the_ca_did_not_sign_is_refused(k8s_env, monkeypatch, tmp_path, pki) -> None:
    """The kubeconfig's CA (inline data) is the only one trusted: a server with another CA's certificate is a
    failed request, counted and retried, never read."""
    import base64

    other = make_other_pki(tmp_path)
    entries = stamped(log_lines(FIXTURE.read_bytes())[:10], time.time() - 5)
    cluster = FakeCluster(entries, ["all"], tls=_server_tls(other))
    cfg = json.loads(cluster.kubeconfig(tmp_path).read_text())
    cfg["clusters"][0]["cluster"] = {"server": f"https://127.0.0.1:{cluster.port}",
                                     "certificate-authority-data": base64.b64encode(pki.ca.read_bytes()).decode()}
    (tmp_path / "kubeconfig").write_text(json.dumps(cfg))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    try:
        reader = KubernetesLogReader.from_path(f"k8s://{NS}/{POD}/{CONTAINER}")
        reader.timing = FAST
        deadline = time.monotonic() + 10
        while reader.stats.read_errors < 2 and time.monotonic() < deadline:
            assert reader.poll(0.1) == []
        reader.close()
    finally:
        cluster.close()
    assert reader.stats.read_errors >= 2 and reader.lines.lines == 0 and not cluster.log_requests


def make_other_pki(tmp_path):
    from support.certs import make_pki

    return make_pki(tmp_path / "other-pki")


def test_a_plugin_login_or_a_missing_service_account_stops_at_start(k8s_env, monkeypatch, tmp_path) -> None:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1"}}],
           "users": [{"name": "u", "user": {"exec": {"command": "gke-gcloud-auth-plugin"}}}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(cfg))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    with pytest.raises(ConfigError, match="logs in through a plugin"):
        KubernetesLogReader.from_path(f"k8s://{NS}/{POD}/{CONTAINER}")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr("exporter.sources.kubeapi.SERVICE_ACCOUNT", tmp_path / "none")
    with pytest.raises(ConfigError, match=r"service account.*automountServiceAccountToken"):
        KubernetesLogReader.from_path(f"k8s://{NS}/{POD}/{CONTAINER}")


def test_missing_kubeconfig_stops_at_start(k8s_env, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nowhere"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="cannot load Kubernetes credentials from the kubeconfig"):
        KubernetesLogReader.from_path(f"k8s://{NS}/{POD}/{CONTAINER}")


# --- the timestamped lines, every drop position ---------------------------------------------------------------


SAMPLE = [
    (b"{'loss': 0.1}\n", 0), (b"same ts \xe2\x96\x88\xe2\x96\x88 bar\n", 0), (b"same ts again\n", 0),
    (b"\r 1/9 [\xe2\x96\x88   ]\r{'loss': 0.2}\n", 3_000_000), (b"stderr, out of order\n", 2_000_000),
    (b"\n", 999_000_000), (b"next second\n", 1_000_000_000), (b"x" * 50 + b"\n", 1_000_000_000),
    (b"last, unfinished", 2_500_000_000),
]


def sample_entries(base_s: int = 1_700_000_000) -> list[tuple[int, bytes]]:
    return [(base_s * 1_000_000_000 + dt, line) for line, dt in SAMPLE]


def resend(entries: list[tuple[int, bytes]], since_second: int, slack: int) -> bytes:
    return wire([(t, line) for t, line in entries if t >= (since_second - slack) * 1_000_000_000])


@pytest.mark.parametrize("slack", [0, 1, 5])
def test_a_drop_at_any_byte_loses_nothing_and_repeats_nothing(slack: int) -> None:
    entries = sample_entries()
    full = wire(entries)
    want = b"".join(line for _, line in entries).decode()
    for p in range(len(full) + 1):
        lines = TimestampedLines()
        got = lines.feed(full[:p])
        since = lines.resume()
        got += lines.feed(full if since is None else resend(entries, since, slack))
        got += lines.end()
        assert got == want, (p, got)


def test_two_drops_in_a_row_and_a_longer_unfinished_line() -> None:
    """Dropped again while skipping what was sent again; and the unfinished line has grown meanwhile."""
    entries = sample_entries()
    grown = [*entries[:-1], (entries[-1][0], entries[-1][1] + b" and finished\n")]
    full, full2 = wire(entries), wire(grown)
    want = b"".join(line for _, line in grown).decode()
    rng = random.Random(3)
    for _ in range(300):
        p = rng.randrange(len(full) + 1)
        lines = TimestampedLines()
        got = lines.feed(full[:p])
        since = lines.resume()
        again = full2 if since is None else resend(grown, since, 1)
        got += lines.feed(again[:rng.randrange(len(again) + 1)])
        since = lines.resume()
        got += lines.feed(full2 if since is None else resend(grown, since, 2))
        assert got + lines.end() == want, p


def test_timestamps_and_lines_without_one() -> None:
    assert parse_stamp(b"2026-11-23T20:37:53.000000001Z") == 1795466273_000000001
    assert parse_stamp(b"2026-11-23T21:37:53.5+01:00") == 1795466273_500000000
    assert parse_stamp(b"2026-11-23T20:37:53Z") == 1795466273_000000000
    assert parse_stamp(b"yesterday") is None and parse_stamp(b"2026-13-45T99:00:00Z") is None
    lines = TimestampedLines()
    text = lines.feed(b"no timestamp here\n" + stamp(10**18) + b" stamped\n")
    assert text == "no timestamp here\nstamped\n" and lines.unstamped == 1 and lines.lines == 2


def test_when_a_container_is_finished() -> None:
    def pod(phase: str, policy: str, state: dict) -> dict:
        return {"spec": {"restartPolicy": policy},
                "status": {"phase": phase, "containerStatuses": [{"name": "t", "state": state}]}}

    assert container_finished(pod("Succeeded", "Always", {}), "t")
    assert container_finished(pod("Running", "Never", {"terminated": {"exitCode": 1}}), "t")
    assert container_finished(pod("Running", "OnFailure", {"terminated": {"exitCode": 0}}), "t")
    assert not container_finished(pod("Running", "OnFailure", {"terminated": {"exitCode": 1}}), "t")
    assert not container_finished(pod("Running", "Always", {"terminated": {"exitCode": 0}}), "t")
    assert not container_finished(pod("Running", "Never", {"running": {}}), "t")
    assert not container_finished(pod("Pending", "Never", {"waiting": {}}), "other")


def test_a_container_restarted_during_a_drop_is_read_from_its_new_start() -> None:
    """The API serves the restarted container's log: its lines are all later than any read, so none is skipped,
    and an unfinished line of the old one is ended rather than glued to the new one's first."""
    old = sample_entries()
    new = [(t + 60_000_000_000, b"new " + line) for t, line in old]
    new_text = b"".join(line for _, line in new).decode()
    full = wire(old)
    for p in range(len(full) + 1):
        lines = TimestampedLines()
        got = lines.feed(full[:p])
        lines.resume()
        after = lines.feed(wire(new))
        assert after.endswith(new_text), p
        ended = after[:-len(new_text)]  # a character cut in two ends as U+FFFD, as at a file's rotation
        assert ended in ("", "\n", "\ufffd\n") and (ended != "" or not got or got.endswith("\n")), (p, ended)


@pytest.mark.parametrize("run", ["grpo", "sft"])
def test_progress_bar_redraws_that_come_late_give_steps_at_most_one_ahead(run: str) -> None:
    """What docs/kubernetes-source.md says of HF console logs through the API, where a record's redraw comes after
    the 2 s wait (a runtime holds the bar's \\r redraws): each record takes its fallback step, at most one ahead."""
    path = TRL / run / "combined.log"
    ex = Exporter(Config(), [])
    stream = ConsoleStream(ex.run_state("t"), ex.stats["t"], LineParserChain())
    for line in log_lines(path.read_bytes()):
        stream.feed(line.decode())
        stream.settle(0)  # every record whose redraw is not already there takes its fallback
    stream.finish()
    for r in ex.runs.values():
        r.refresh()
    got, want = families(ex), dump_of(path, "t")
    ahead = {float(got[k]) - float(v) for k, v in want.items() if k[0] == "posttrain_instrument_last_step"}
    assert ahead <= {0.0, 1.0}, ahead  # block-buffered: exact since a quiet poll keeps a clear (issue 24)
