"""The HTTP endpoint: /metrics for Prometheus, /healthz for the kubelet, / for a person."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)

# The ingest loop beats at least every poll interval; this many seconds of silence means it is stuck.
HEALTH_STALE_SECONDS = 60.0


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_app(registry: CollectorRegistry, heartbeat: Callable[[], float]) -> Callable:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            age = time.monotonic() - heartbeat()
            ok = age < HEALTH_STALE_SECONDS
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else f"ingest loop silent for {age:.0f}s\n".encode()]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html")])
            return [b"<html><body><h1>posttrain-exporter</h1><p><a href='/metrics'>/metrics</a> "
                    b"<a href='/healthz'>/healthz</a></p></body></html>\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics\n"]

    return app


def serve_http(host: str, port: int, app: Callable) -> _ThreadingServer:
    """Binds (raising OSError if the address is taken) and serves in a daemon thread."""
    httpd = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log.info("serving /metrics on http://%s:%d", host, httpd.server_port)
    return httpd
