"""The HTTP endpoint: /metrics for Prometheus, /healthz for the kubelet, /api/v1/verdict for the trainer's
callback and scripts (each run's verdict and active findings as JSON), / for a person.

A bounded server, as Prometheus exporters run theirs: a listen backlog of LISTEN_BACKLOG; at most
MAX_CONNECTIONS open (beyond, new ones wait in the kernel's backlog, never a thread each); a connection
waits at the gate (exposition/gate.py) until its request has arrived, so silent and trickling clients never
occupy one of the WORKERS threads; an idle timeout on every read and write and a deadline on the whole
connection; IPv4 and IPv6 (`[::1]:9847`; `[::]:9847` takes both); TLS and basic auth from the web config
(exposition/webconfig.py) on every path. Scrapes that arrive while the exposition is being rendered share
that rendering."""

from __future__ import annotations

import gzip
import json
import logging
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from socketserver import TCPServer
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from exporter.exposition.auth import BasicAuth, with_headers
from exporter.exposition.gate import Gate
from exporter.exposition.webconfig import ReloadingContext, WebConfig, san_allowed

log = logging.getLogger(__name__)

# The ingest loop beats at least every poll interval; this many seconds of silence means it is stuck.
HEALTH_STALE_SECONDS = 60.0
LISTEN_BACKLOG = 128
WORKERS = 16  # requests served at once (rendering is shared, so more would only contend for the GIL)
MAX_CONNECTIONS = 1024  # open at once, most of them waiting at the gate; beyond it the kernel's backlog holds them
IDLE_TIMEOUT_SECONDS = 10.0  # one read or write that waits longer ends the connection
CONNECTION_DEADLINE_SECONDS = 30.0  # so does a connection open longer (a client trickling its request)
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
        params = parse_qs(environ.get("QUERY_STRING", ""))
        zipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        if "name[]" in params:  # a filtered scrape is rendered for itself
            raw = encoder(registry.restricted_registry(params["name[]"]))
            body = gzip.compress(raw) if zipped else raw
        else:
            with lock:
                shared = renders.setdefault(content_type, SharedRender(lambda: encoder(registry)))
            raw, gz = shared()
            body = gz if zipped else raw
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app


def verdict_app(verdict: Verdict) -> Callable:
    """/api/v1/verdict: each run's verdict and active findings as JSON (`?run=NAME`: that run only)."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        only = parse_qs(environ.get("QUERY_STRING", "")).get("run", [None])[0]
        body = json.dumps(verdict(only), allow_nan=False).encode() + b"\n"
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                  ("Cache-Control", "no-store")])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app


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


class _Handler(WSGIRequestHandler):
    def setup(self) -> None:
        self.timeout = self.server.idle_timeout  # type: ignore[attr-defined]  # set on the connection by setup
        super().setup()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def get_environ(self) -> dict:
        env = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            env["HTTPS"] = "on"
            env["wsgi.url_scheme"] = "https"
        return env


class MetricsServer(WSGIServer):
    """Binds and listens at construction (raising OSError if it cannot); `start` serves in a thread."""

    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True

    def __init__(self, host: str, port: int, app: Callable, web: WebConfig | None = None, workers: int = WORKERS,
                 idle_timeout: float = IDLE_TIMEOUT_SECONDS, deadline: float = CONNECTION_DEADLINE_SECONDS) -> None:
        self.idle_timeout, self.deadline = idle_timeout, deadline
        family, _, _, _, sockaddr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        self._dual_stack = family == socket.AF_INET6 and host in ("::", "")
        self._tls = ReloadingContext(web.tls, _tls_reload_failed) if web is not None and web.tls else None
        self._allowed_sans = web.tls.client_allowed_sans if web is not None and web.tls else ()
        if web is not None:
            app = with_headers(BasicAuth(app, web.users) if web.users else app, web.headers)
        super().__init__(sockaddr, _Handler)
        self.set_app(app)
        self._connections = threading.Semaphore(MAX_CONNECTIONS)  # open connections, waiting or served
        self._ready: queue.SimpleQueue[tuple[socket.socket, object] | None] = queue.SimpleQueue()
        self._gate = Gate(lambda conn, addr: self._ready.put((conn, addr)), self._close_waiting, idle_timeout,
                          tls=self._tls is not None)
        self._workers = [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                         for i in range(workers)]
        self._stopping = threading.Event()
        self._open: dict[int, float] = {}  # connection fd -> its deadline
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

    def _serve_one(self, conn: socket.socket, client_address) -> None:
        fd = conn.fileno()
        with self._open_lock:
            self._open[fd] = time.monotonic() + self.deadline
        try:
            conn.settimeout(self.idle_timeout)
            if self._tls is not None:
                conn = self._handshake(conn)
            if conn is not None:
                self.finish_request(conn, client_address)
        except (OSError, ValueError):
            pass  # a timeout, a reset, a connection past its deadline: the client's loss only
        except Exception:  # pragma: no cover - a bug in a handler must cost one request, not the server
            log.exception("HTTP request from %s failed", client_address)
        finally:
            with self._open_lock:
                self._open.pop(fd, None)
                if conn is not None:
                    self.shutdown_request(conn)
            self._connections.release()

    def _handshake(self, conn: socket.socket) -> ssl.SSLSocket | None:
        assert self._tls is not None
        try:
            tls = self._tls.current().wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.tls_failures += 1
            log.debug("TLS handshake failed: %s", e)
            conn.close()
            return None
        if not san_allowed(tls.getpeercert(), self._allowed_sans):
            self.tls_failures += 1
            tls.close()
            return None
        return tls

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
