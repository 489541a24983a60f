"""What the serving commands share (serve, run, demo): the registry a scrape renders, the HTTP side (bound at once,
or retried), the reading thread beside it and the signals that stop both, set-up retried while a trainer's output
passes through, the GPU service and the early-stop file."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from exporter.app import Exporter
from exporter.commands.base import UsageError, log
from exporter.config import Config, ConfigError, parse_listen_address
from exporter.exposition.collector import ExporterCollector
from exporter.gpu.service import GpuService
from exporter.sources.priority import lower_this_thread

if TYPE_CHECKING:  # the other commands' modules are imported by the commands that use them: `dump` starts faster
    from exporter.exposition.webconfig import WebConfig
    from exporter.stopsignal import StopSignal

def scrape_registry(exporter: Exporter, with_process: bool, gpu: GpuService | None = None) -> CollectorRegistry:
    from prometheus_client.process_collector import ProcessCollector
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(exporter))
    for collector in gpu.collectors() if gpu is not None else ():
        reg.register(collector)
    if with_process:
        ProcessCollector(registry=reg)  # CPU and memory of the sidecar itself, for sizing
    return reg


def gpu_service(cfg: Config, disabled: bool) -> GpuService | None:
    if disabled or not cfg.gpu.enabled:
        return None
    g = cfg.gpu
    return GpuService(g.source, g.sampler, g.expected, g.feed_file)


STOP_GRACE_SECONDS = 2.5  # after SIGTERM, the reading loop gets this long to end (a hung read is left behind)
LISTEN_RETRY_SECONDS = 5.0


class Listener:
    """The HTTP side. Bound at once; or, with `retry` (`run`, `serve --log -`: the trainer's output must pass
    whatever the port does), a failure is logged loudly and the bind retried in the background."""

    def __init__(self, exporter: Exporter, listen: str, gpu: GpuService | None, web: WebConfig | None,
                 retry: bool) -> None:
        self._listen, self._closed = listen, threading.Event()
        self._lock = threading.Lock()
        self.httpd = None
        from exporter.exposition.server import RefusalCollector, build_app
        registry = scrape_registry(exporter, True, gpu)
        self._refusals = RefusalCollector()
        registry.register(self._refusals)  # type: ignore[arg-type]
        self._app = build_app(registry, lambda: exporter.heartbeat, lambda: exporter.catching_up, exporter.verdict)
        self._web = web
        try:
            self._bind()
        except OSError as e:
            if not retry:
                raise UsageError(f"cannot listen on {listen}: {e.strerror or e}; pick another with "
                                 "--web.listen-address") from None
            log.error("cannot listen on %s: %s; the trainer's output passes through and is read meanwhile; "
                      "retrying every %.0fs", listen, e.strerror or e, LISTEN_RETRY_SECONDS)
            threading.Thread(target=self._retry, name="listen-retry", daemon=True).start()

    def _bind(self) -> None:
        from exporter.exposition.server import serve_http
        host, port, _ = parse_listen_address(self._listen)
        httpd = serve_http(host, port, self._app, self._web)
        with self._lock:
            if self._closed.is_set():
                httpd.shutdown()
            else:
                self.httpd = self._refusals.server = httpd

    def _retry(self) -> None:
        while not self._closed.wait(LISTEN_RETRY_SECONDS):
            try:
                self._bind()
                log.warning("listening on %s at last", self._listen)
                return
            except OSError as e:
                log.debug("still cannot listen on %s: %s", self._listen, e)

    def shutdown(self) -> None:
        with self._lock:
            self._closed.set()
            if self.httpd is not None:
                self.httpd.shutdown()


def serve(exporter: Exporter, listen: str, loop, gpu: GpuService | None = None, web: WebConfig | None = None,
           *, retry_listen: bool = False) -> int:
    """Serves while `loop(stop)` reads, in a thread of its own: a read that blocks (a FIFO, a hung mount) never
    holds the process past SIGTERM (STOP_GRACE_SECONDS), nor a scrape (the loop reads without the state lock)."""
    listener = Listener(exporter, listen, gpu, web, retry_listen)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if gpu is not None:
        gpu.start()
    outcome: dict[str, Any] = {}

    def reading() -> None:
        lower_this_thread()  # the trainer beside us (serve --log -) comes first
        try:
            outcome["code"] = loop(stop)
        except BaseException as e:  # handed to the main thread, which raises it
            outcome["error"] = e

    worker = threading.Thread(target=reading, name="ingest", daemon=True)
    worker.start()
    try:
        while worker.is_alive() and not stop.is_set():
            stop.wait(0.5)
        worker.join(STOP_GRACE_SECONDS)
        if worker.is_alive():
            log.warning("reading the logs did not end within %.0fs of the stop (a read that hangs?); exiting "
                        "without it", STOP_GRACE_SECONDS)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("code") or 0
    finally:
        listener.shutdown()
        if gpu is not None:
            gpu.stop()


def stop_signal(cfg: Config) -> StopSignal | None:
    """config early_stop: its folder must be there at start (the volume shared with the trainer)."""
    from exporter.stopsignal import StopSignal, check_stop_folder
    if not cfg.early_stop.enabled:
        return None
    check_stop_folder(cfg.early_stop)
    log.info("early stop: a %s finding writes %s", cfg.early_stop.severity, cfg.early_stop.file)
    return StopSignal(cfg.early_stop)


def web_config(args: argparse.Namespace) -> WebConfig | None:
    from exporter.exposition.webconfig import load_web_config
    return load_web_config(args.web_config_file)



def until_up(command: str, attempt, gone, first_wait: float = 5.0, max_wait: float = 60.0):
    """`attempt()` until it returns, while a trainer's output passes through: each failure is logged loudly and
    retried (a config fixed meanwhile is taken). Once `gone()` (nothing left to pass through), the last failure
    ends the command as it would have at start."""
    wait = first_wait
    while True:
        try:
            return attempt()
        except (UsageError, ConfigError) as e:
            error: Exception = e
        except Exception as e:  # an exporter bug: still never the trainer's output
            log.exception("%s: the exporter failed to start", command)
            error = e
        if gone():
            raise error
        log.error("%s: the exporter cannot start: %s; the trainer's output passes through unchanged meanwhile; "
                  "retrying in %.0fs", command, error, wait)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not gone():
            time.sleep(0.2)
        wait = min(wait * 2, max_wait)


def resilient(follow):
    """An ingest bug must not end the sidecar (and with `--log -`, break the trainer's pipe): it is logged once
    and the loop starts again; standard input keeps being read and copied meanwhile (its own thread)."""

    def loop(stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                follow(stop)
            except Exception:
                failures += 1
                if failures == 1:
                    log.exception("ingest failed; going on (further failures are only counted)")
                stop.wait(1.0)

    return loop


