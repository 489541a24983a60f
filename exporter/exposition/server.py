"""The HTTP endpoint: /metrics for Prometheus, /healthz for the kubelet, /api/v1/verdict for the trainer's
callback and scripts (each run's verdict and active findings as JSON), / for a person.

A bounded server, as Prometheus exporters run theirs: a listen backlog of LISTEN_BACKLOG; at most
MAX_CONNECTIONS open (beyond, new ones wait in the kernel's backlog, never a thread each); a connection
waits at the gate (exposition/gate.py) until its request has arrived (over TLS, its handshake is done there
without blocking), so silent, trickling and stalled-handshake clients never occupy one of the WORKERS
threads; HTTP/1.1 with keep-alive, as Prometheus scrapes (a connection goes back to the gate between its
requests, where it may wait KEEPALIVE_IDLE_SECONDS for the next, so an idle scraper's connection holds no
worker either); an idle timeout on every read and write and a deadline on each request; IPv4 and IPv6
(`[::1]:9847`; `[::]:9847` takes both); TLS and basic auth from the web config (exposition/webconfig.py) on
every path, the bcrypt work of passwords not seen before limited per address (exposition/auth.py). Scrapes
that arrive while the exposition is being rendered share that rendering."""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
import queue
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from socketserver import TCPServer
from urllib.parse import parse_qs
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from exporter.exposition.auth import BasicAuth, with_headers
from exporter.exposition.gate import Gate, TlsAccept
from exporter.exposition.webconfig import ReloadingContext, WebConfig, san_allowed

log = logging.getLogger(__name__)

# The ingest loop beats at least every poll interval; this many seconds of silence means it is stuck.
HEALTH_STALE_SECONDS = 60.0
LISTEN_BACKLOG = 128
WORKERS = 16  # requests served at once (rendering is shared, so more would only contend for the GIL)
MAX_CONNECTIONS = 1024  # open at once, most of them waiting at the gate; beyond it the kernel's backlog holds them
IDLE_TIMEOUT_SECONDS = 10.0  # one read or write that waits longer ends the connection
CONNECTION_DEADLINE_SECONDS = 30.0  # so does a request taking longer (a client trickling it)
# A kept-alive connection waits at the gate this long for its next request: longer than the scrape intervals in use
# (the chart's 30 s, 60 s at most), so a scraper reuses its connection, as Prometheus' HTTP client does.
KEEPALIVE_IDLE_SECONDS = 90.0
SERVER = "posttrain-exporter"  # the Server header: no version of the exporter or of its runtime
VERDICT_PATH = "/api/v1/verdict"

Verdict = Callable[[str | None], dict]  # the runs' verdicts as a JSON document (or the one run named)


class SharedRender:
    """Renders the exposition for one content type; callers that arrive during a rendering wait for it and
    get its result (rendered at most one rendering's time before they asked), so a burst of scrapes costs
    one rendering, not one each."""

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render
        self._lock = threading.Lock()
        self._running: Future[tuple[bytes, bytes]] | None = None

    def __call__(self) -> tuple[bytes, bytes]:
        """(plain, gzipped)"""
        with self._lock:
            fut, owner = self._running, False
            if fut is None:
                fut = self._running = Future()
                owner = True
        if owner:
            try:
                raw = self._render()
                fut.set_result((raw, gzip.compress(raw, compresslevel=6)))
            except BaseException as e:
                fut.set_exception(e)
            finally:
                with self._lock:
                    self._running = None
        return fut.result()


def metrics_app(registry: CollectorRegistry) -> Callable:
    renders: dict[str, SharedRender] = {}
    lock = threading.Lock()

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        params = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        zipped = gzip_wanted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        if "name[]" in params:  # a filtered scrape is rendered for itself
            names = {n for n in params["name[]"] if n}
            bad = sorted(n for n in names if not METRIC_NAME.fullmatch(n))
            if not names or bad:
                start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
                shown = f"not a metric name: {bad[0][:100]!r}" if bad else "no metric name given"
                return [f"name[]: {shown} (e.g. /metrics?name[]=posttrain_step&name[]=posttrain_kl)\n".encode()]
            selected = NamedFamilies(registry, names)
            raw = encoder(selected)
            if selected.missing and content_type.startswith("text/plain"):  # OpenMetrics allows no comments
                raw += "".join(f"# no metric named {n} is exported now\n" for n in selected.missing).encode()
            body = gzip.compress(raw) if zipped else raw
        else:
            with lock:
                shared = renders.setdefault(content_type, SharedRender(lambda: encoder(registry)))
            raw, gz = shared()
            body = gz if zipped else raw
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Vary", "Accept-Encoding")]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app


METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class NamedFamilies:
    """The registry's metrics named in `?name[]=`: a family whole when its name is given (`posttrain_kl`,
    `posttrain_exporter_lines`), else only its samples of the names given (`posttrain_exporter_lines_total`, as
    prometheus_client filters). The names that matched nothing are in `missing` once collected."""

    def __init__(self, registry: CollectorRegistry, names: set[str]) -> None:
        self._registry, self._names = registry, names
        self.missing: list[str] = []

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for metric in self._registry.collect():
            if metric.name in self._names:
                seen.add(metric.name)
                yield metric
                continue
            samples = [s for s in metric.samples if s.name in self._names]
            if samples:
                seen.update(s.name for s in samples)
                part = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                part.samples = samples
                yield part
        self.missing = sorted(self._names - seen)


def gzip_wanted(header: str) -> bool:
    """Whether Accept-Encoding lets gzip be sent: named (or `*`) with a quality above 0 (`gzip;q=0` refuses it)."""
    qualities: dict[str, float] = {}
    for part in header.lower().split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding:
            qualities[coding] = q if math.isfinite(q) else 0.0
    for coding in ("gzip", "x-gzip", "*"):
        if coding in qualities:
            return qualities[coding] > 0
    return False


def verdict_app(verdict: Verdict) -> Callable:
    """/api/v1/verdict: each run's verdict and active findings as JSON (`?run=NAME`: that run only)."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        only = parse_qs(environ.get("QUERY_STRING", "")).get("run", [None])[0]
        body = json.dumps(verdict(only), allow_nan=False).encode() + b"\n"
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                  ("Cache-Control", "no-store")])
        return [body]

    return app


def without_body_for_head(app: Callable) -> Callable:
    """HEAD gets the headers a GET would get (its Content-Length too) and no body, whatever path answers it."""

    def wrapped(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        started: list = []

        def start(status: str, headers: list, exc_info=None) -> Callable[[bytes], None]:
            started[:] = [status, headers, exc_info]
            return lambda data: None

        body = app(dict(environ, REQUEST_METHOD="GET"), start)
        try:
            length = sum(len(chunk) for chunk in body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        status, headers, exc_info = started
        if not any(k.lower() == "content-length" for k, _ in headers):
            headers = [*headers, ("Content-Length", str(length))]
        start_response(status, headers, exc_info)
        return []

    return wrapped


def build_app(registry: CollectorRegistry, heartbeat: Callable[[], float],
              catching_up: Callable[[], bool] = lambda: False, verdict: Verdict | None = None) -> Callable:
    """/metrics, /healthz (200 while the ingest loop is alive, also while it catches up on a log's history:
    the body says so; 503 once it has been silent too long), /api/v1/verdict (with `verdict`) and an index page."""
    metrics = metrics_app(registry)
    verdicts = verdict_app(verdict) if verdict is not None else None

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed: use GET\n"]
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == VERDICT_PATH and verdicts is not None:
            return verdicts(environ, start_response)
        if path == "/healthz":
            age = time.monotonic() - heartbeat()
            ok = age < HEALTH_STALE_SECONDS
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            if not ok:
                return [f"ingest loop silent for {age:.0f}s\n".encode()]
            return [b"ok, catching up: reading a log's history\n" if catching_up() else b"ok\n"]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html")])
            links = b" <a href='/api/v1/verdict'>/api/v1/verdict</a>" if verdicts is not None else b""
            return [b"<html><body><h1>posttrain-exporter</h1><p><a href='/metrics'>/metrics</a> "
                    b"<a href='/healthz'>/healthz</a>" + links + b"</p></body></html>\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics\n"]

    return app


class _Response(ServerHandler):
    """wsgiref's response writer, speaking HTTP/1.1, naming no runtime; `Connection: close` on a last response."""

    http_version = "1.1"
    server_software = SERVER

    def cleanup_headers(self) -> None:
        super().cleanup_headers()  # sets Content-Length for a one-piece body
        handler = self.request_handler  # type: ignore[attr-defined]
        if "Content-Length" not in self.headers or not self.status or self.status[:1] == "5":
            handler.close_connection = True  # a body without a length ends with the connection
        if handler.close_connection:
            self.headers["Connection"] = "close"


class _Handler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"  # parse_request keeps an HTTP/1.1 connection open unless it says close

    def __init__(self, request, client_address, server, head: bytes = b"") -> None:
        self._head = head  # the request bytes the gate already read (TLS: decrypted there)
        self.leftover: bytes | None = None  # after a request: the connection stays open, these bytes read ahead
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout  # type: ignore[attr-defined]  # set on the connection by setup
        super().setup()
        self.rfile.close()  # reads go through _Input: it can say what it read past this request
        self._input = _Input(self._head, self.connection)
        self.rfile = io.BufferedReader(self._input)

    def version_string(self) -> str:
        return SERVER  # the Server header of errors answered before the app (400, 414)

    def handle(self) -> None:
        """One request (as wsgiref's handler), then whether the connection stays open for the next."""
        self.close_connection = True
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        if self.command not in ("GET", "HEAD") or self.headers.get("Content-Length", "0").strip() not in ("", "0") \
                or "Transfer-Encoding" in self.headers or self.server.stopping:  # type: ignore[attr-defined]
            self.close_connection = True  # a request body is never read: the connection ends after the answer
        handler = _Response(self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=False)
        handler.request_handler = self  # type: ignore[attr-defined]
        handler.run(self.server.get_app())
        if not self.close_connection:
            self._input.ended = True  # no more reads from the socket: what is buffered is the next request's
            self.leftover = self.rfile.peek(HEAD_BYTES)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def get_environ(self) -> dict:
        env = super().get_environ()
        env["SERVER_SOFTWARE"] = SERVER
        if isinstance(self.connection, ssl.SSLSocket):
            env["HTTPS"] = "on"
            env["wsgi.url_scheme"] = "https"
        return env


HEAD_BYTES = 65536


class _Input(io.RawIOBase):
    """The request's bytes: `head` (what the gate read) first, then the connection, one read of it at a time
    (never waiting for more than is there); once `ended`, nothing more from the connection."""

    def __init__(self, head: bytes, conn: socket.socket) -> None:
        self._head = memoryview(head)
        self._conn = conn
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int | None:  # type: ignore[override]
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        if self.ended:
            return None  # as a non-blocking socket with nothing there: the buffer keeps what it has
        return self._conn.recv_into(b)


class MetricsServer(WSGIServer):
    """Binds and listens at construction (raising OSError if it cannot); `start` serves in a thread."""

    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True

    def __init__(self, host: str, port: int, app: Callable, web: WebConfig | None = None, workers: int = WORKERS,
                 idle_timeout: float = IDLE_TIMEOUT_SECONDS, deadline: float = CONNECTION_DEADLINE_SECONDS,
                 keepalive: float = KEEPALIVE_IDLE_SECONDS) -> None:
        self.idle_timeout, self.deadline = idle_timeout, deadline
        family, _, _, _, sockaddr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        self._dual_stack = family == socket.AF_INET6 and host in ("::", "")
        self._tls = ReloadingContext(web.tls, _tls_reload_failed) if web is not None and web.tls else None
        self._allowed_sans = web.tls.client_allowed_sans if web is not None and web.tls else ()
        self._auth = BasicAuth(app, web.users) if web is not None and web.users else None
        if web is not None:
            app = with_headers(self._auth or app, web.headers)
        super().__init__(sockaddr, _Handler)
        self.set_app(without_body_for_head(app))
        self._connections = threading.Semaphore(MAX_CONNECTIONS)  # open connections, waiting or served
        self._ready: queue.SimpleQueue[tuple[socket.socket, object, bytes] | None] = queue.SimpleQueue()
        tls = None
        if self._tls is not None:
            tls = TlsAccept(self._tls.current, lambda conn: san_allowed(conn.getpeercert(), self._allowed_sans),
                            self._tls_refused)
        self._gate = Gate(lambda conn, addr, head: self._ready.put((conn, addr, head)), self._close_waiting,
                          idle_timeout, tls, keepalive=keepalive)
        self._workers = [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                         for i in range(workers)]
        self._stopping = threading.Event()
        self._open: dict[int, float] = {}  # connection fd -> its request's deadline
        self._open_lock = threading.Lock()
        self.tls_failures = 0  # handshakes refused (no or bad client certificate, a client speaking plain HTTP)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self._tls else 'http'}://{shown}:{port}"

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        TCPServer.server_bind(self)  # not HTTPServer's: its reverse DNS lookup of the host can hang at start
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()

    def start(self) -> MetricsServer:
        self._gate.start()
        for w in self._workers:
            w.start()
        threading.Thread(target=self.serve_forever, name="http", daemon=True).start()
        threading.Thread(target=self._reap, name="http-deadlines", daemon=True).start()
        return self

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def shutdown(self) -> None:
        self._stopping.set()
        super().shutdown()
        self._gate.stop()
        for _ in self._workers:
            self._ready.put(None)
        self.server_close()

    # --- accepted, waiting at the gate, served by a worker ------------------------------------------

    def process_request(self, request: socket.socket, client_address) -> None:
        # MAX_CONNECTIONS open: stop accepting, so that new connections wait in the kernel's backlog.
        while not self._connections.acquire(timeout=0.5):
            if self._stopping.is_set():
                TCPServer.shutdown_request(self, request)
                return
        self._gate.add(request, client_address)

    def _close_waiting(self, conn: socket.socket) -> None:
        TCPServer.shutdown_request(self, conn)
        self._connections.release()

    def _work(self) -> None:
        while (item := self._ready.get()) is not None:
            self._serve_one(*item)

    def _serve_one(self, conn: socket.socket, client_address, head: bytes) -> None:
        fd = conn.fileno()
        with self._open_lock:
            self._open[fd] = time.monotonic() + self.deadline
        kept = False
        try:
            conn.settimeout(self.idle_timeout)
            handler = _Handler(conn, client_address, self, head)
            kept = handler.leftover is not None and not self._stopping.is_set()
            if kept:  # back to the gate to wait for the next request, holding no worker meanwhile
                with self._open_lock:
                    kept = self._open.pop(fd, None) is not None  # else the deadline's reaper shut it down
                if kept:
                    self._gate.add(conn, client_address, kept=handler.leftover or b"")
        except (OSError, ValueError):
            kept = False  # a timeout, a reset, a connection past its deadline: the client's loss only
        except Exception:  # pragma: no cover - a bug in a handler must cost one request, not the server
            kept = False
            log.exception("HTTP request from %s failed", client_address)
        finally:
            if not kept:
                with self._open_lock:
                    self._open.pop(fd, None)
                    self.shutdown_request(conn)
                self._connections.release()

    def refusals(self) -> dict[str, int]:
        """Clients turned away, by reason (posttrain_exporter_http_refused_total): read without a lock, as the
        counters are ints that one thread each increments."""
        out = {"tls_handshake": self.tls_failures, "evicted": self._gate.evicted}
        if self._auth is not None:
            out |= {"wrong_password": self._auth.failures, "throttled": self._auth.throttled}
        return out

    def _tls_refused(self, why: str) -> None:
        self.tls_failures += 1  # only the gate's thread counts
        log.debug("TLS handshake refused: %s", why)

    def _reap(self) -> None:
        """Ends the connections past their deadline: shutting the socket down wakes the worker blocked on it."""
        while not self._stopping.wait(min(1.0, self.deadline / 4)):
            now = time.monotonic()
            with self._open_lock:  # held while the worker closes its fd, so the fd cannot be another's yet
                for fd, deadline in list(self._open.items()):
                    if deadline < now:
                        self._open.pop(fd)
                        try:
                            s = socket.socket(fileno=os.dup(fd))
                            s.shutdown(socket.SHUT_RDWR)
                            s.close()
                        except OSError:
                            pass


def _tls_reload_failed(e: Exception) -> None:
    log.warning("cannot reload the TLS certificate, key or CA (%s); serving with the previous ones", e)


def serve_http(host: str, port: int, app: Callable, web: WebConfig | None = None) -> MetricsServer:
    """Binds (raising OSError if the address is taken) and serves in a daemon thread."""
    httpd = MetricsServer(host, port, app, web).start()
    log.info("serving /metrics on %s/metrics", httpd.url)
    return httpd


class RefusalCollector:
    """posttrain_exporter_http_refused_total{reason}: the clients the server turned away. Registered before the
    server binds (`run` and `serve --log -` retry a taken port), so it says nothing until `server` is set."""

    def __init__(self) -> None:
        self.server: MetricsServer | None = None

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        fam = CounterMetricFamily("posttrain_exporter_http_refused", "HTTP clients turned away before a worker "
                                  "served them, by reason: tls_handshake (failed or refused handshakes), evicted "
                                  "(waiting connections closed to make room, per-address and half-done handshake "
                                  "limits), wrong_password (failed basic auth), throttled (answered 429 "
                                  "without a check: too many passwords being checked, from all or from its address, "
                                  "or its turn not come within the wait).", labels=["reason"])
        server = self.server
        if server is not None:
            for reason, n in server.refusals().items():
                fam.add_metric([reason], n)
        yield fam
