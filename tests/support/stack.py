"""A real monitoring stack on loopback: posttrain-exporter, Prometheus with the project's rules, Alertmanager
configured from docs/alertmanager.example.yml with its receivers pointed at a webhook in this process.

Used by the end-to-end test and by bench/detection.py, which shrinks every duration by a time scale."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from exporter.alerting.rules import RulesSettings, alert_groups, recording_groups, render

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Webhook:
    """Alertmanager's notifications, by receiver (pager, chat), each with the time it arrived."""

    port: int = 0
    received: dict[str, list[tuple[float, dict]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, receiver: str) -> list[dict]:
        with self.lock:
            return [a for _, body in self.received.get(receiver, []) for a in body["alerts"]]

    def notifications(self) -> list[tuple[float, str, dict]]:
        """(arrival time, receiver, alert) of every alert in every notification."""
        with self.lock:
            return [(t, r, a) for r, items in self.received.items() for t, body in items for a in body["alerts"]]


@contextmanager
def webhook() -> Iterator[Webhook]:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with hook.lock:
                hook.received.setdefault(self.path.strip("/"), []).append((time.time(), body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


def alertmanager_config(hook: Webhook, scale: float = 1 / 60) -> dict:
    """The example, verbatim except for its receivers (the local webhook) and its waits (scaled; the
    example's 30s / 5m / 4h become 0.5s / 5s / 4m at one minute per second)."""
    cfg = yaml.safe_load((REPO / "docs" / "alertmanager.example.yml").read_text())
    url = f"http://127.0.0.1:{hook.port}"
    cfg["receivers"] = [{"name": r["name"], "webhook_configs": [{"url": f"{url}/{r['name']}"}]}
                        for r in cfg["receivers"]]

    def scaled(route: dict) -> None:
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route:
                route[key] = _ms(_seconds(route[key]) * scale)
        for child in route.get("routes", []):
            scaled(child)

    scaled(cfg["route"])
    return cfg


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "").isdigit():
            return float(text[: -len(unit)]) * units[unit]
    raise ValueError(text)


def _ms(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 1)}ms"


@dataclass
class Stack:
    tmp: Path
    ports: dict[str, int]

    def prometheus(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.ports['prometheus']}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())["data"]

    def query(self, promql: str) -> list[dict]:
        return self.prometheus("/api/v1/query", query=promql)["result"]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        return self.prometheus("/api/v1/query_range", query=promql, start=f"{start:.3f}", end=f"{end:.3f}",
                               step=f"{step:.3f}")["result"]

    def post_alerts(self, alerts: list[dict]) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.ports['alertmanager']}/api/v2/alerts",
                                     data=json.dumps(alerts).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200


def write_configs(tmp: Path, ports: dict[str, int], hook: Webhook, scrape_seconds: float, scale: float = 1.0,
                  am_scale: float | None = None) -> None:
    """Prometheus and Alertmanager configs in `tmp`. The rules are the repository's (rules/) at scale 1, else
    generated with every duration scaled; Alertmanager's waits are scaled by `am_scale` (default: `scale`)."""
    rules = REPO / "rules"
    if scale != 1.0:
        rules = tmp / "rules"
        rules.mkdir(exist_ok=True)
        settings = RulesSettings(scale=scale)
        (rules / "posttrain.alerts.yml").write_text(render(alert_groups(settings)))
        (rules / "posttrain.recording.yml").write_text(render(recording_groups(settings)))
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(hook, am_scale or scale)))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": _ms(scrape_seconds), "evaluation_interval": _ms(scrape_seconds),
                   "scrape_timeout": _ms(scrape_seconds)},
        "rule_files": [str(rules / "*.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": [{"job_name": "posttrain",
                            "static_configs": [{"targets": [f"127.0.0.1:{ports['exporter']}"]}]}],
    }))


def server_commands(tmp: Path, ports: dict[str, int]) -> dict[str, list[str]]:
    prometheus, alertmanager = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if prometheus is None or alertmanager is None:
        raise FileNotFoundError("prometheus and prometheus-alertmanager (Debian packages) are needed")
    return {
        "alertmanager": [alertmanager, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am-data'}",
                         f"--web.listen-address=127.0.0.1:{ports['alertmanager']}", "--cluster.listen-address=",
                         "--log.level=warn"],
        "prometheus": [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                       f"--storage.tsdb.path={tmp / 'prom-data'}",
                       f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn"],
    }
