"""A container's log followed through the Kubernetes API: `--log k8s://NAMESPACE/POD/CONTAINER`, or
`k8s://CONTAINER` with the namespace and pod from POD_NAMESPACE and POD_NAME (the downward API), so the
trainer needs no `| tee` to a file.

The log is read as `kubectl logs -f --timestamps` reads it (GET .../pods/POD/log?follow=true&timestamps=true),
in chunks, with the standard library (exporter/sources/kubeapi.py: no client package). Every line the API
sends starts with its RFC 3339 timestamp and a space: it is cut off here, and the rest of the line goes to the
same console pipeline as a file's or standard input's text (the framer caps a long line there, so nothing
here holds more than a timestamp's bytes of a line).

A stream that ends or fails while the container runs is opened again, with sinceSeconds reaching back before
the last line read; lines already read are skipped by position (see `TimestampedLines`), so a record is
neither counted twice nor lost. The API server forwards sinceTime to the kubelet in whole seconds, so
sinceSeconds is as exact: positions are kept per second for that reason. On start
(the sidecar restarted) the log is read again from the container's start, as a file is (docs/kubernetes-source.md).

Health, in the exporter's own source families: `source_up` (streaming), `source_resumed` (reconnects that
read on after the last line read), `source_read_errors` (requests or streams that failed)."""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import math
import os
import queue
import re
import threading
import time
from calendar import timegm
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.config import ConfigError
from exporter.sources.base import FollowStats, drain
from exporter.sources.kubeapi import ApiError, CoreApi, CredentialsError, Stream, endpoint

log = logging.getLogger(__name__)

PREFIX = "k8s://"
READ_SIZE = 1 << 16
MAX_STAMP_BYTES = 64  # a timestamp prefix is 30 bytes (RFC 3339, nanoseconds); more is a line without one
QUEUED_CHUNKS = 256  # text waiting for the parser (<= 256 x READ_SIZE): past it the reader waits, never drops
SINCE_SLACK_SECONDS = 5  # sinceSeconds reaches this much further back than needed (clocks, rounding)
# HTTP 400 messages of a container that has not started: pending, scheduling, pulling, init containers running
WAITING = ("waiting to start", "ContainerCreating", "PodInitializing", "does not have a host assigned")
KEPT_SECONDS = 3  # seconds of line counts kept for resuming (lines out of order by more are not expected)


class KubernetesSourceError(ConfigError):
    """A k8s:// log that cannot be followed at all (bad path, environment, credentials): stops at start."""


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.namespace}/{self.pod}/{self.container}"


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # DNS names: namespaces, pods and containers


def is_kubernetes_path(path: str) -> bool:
    return path.startswith(PREFIX)


def parse_path(path: str, environ: Mapping[str, str] | None = None) -> ContainerRef:
    """`k8s://NAMESPACE/POD/CONTAINER`, or `k8s://CONTAINER` with POD_NAMESPACE and POD_NAME from `environ`."""
    env = os.environ if environ is None else environ
    parts = path[len(PREFIX):].split("/")
    if len(parts) == 1:
        missing = [v for v in ("POD_NAMESPACE", "POD_NAME") if not env.get(v)]
        if missing:
            raise KubernetesSourceError(
                f"{path}: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: set POD_NAMESPACE "
                "and POD_NAME from the downward API (env valueFrom fieldRef metadata.namespace and metadata.name), "
                f"or give the full path {PREFIX}NAMESPACE/POD/{parts[0] or 'CONTAINER'}")
        parts = [env["POD_NAMESPACE"], env["POD_NAME"], parts[0]]
    if len(parts) != 3:
        raise KubernetesSourceError(f"{path}: expected {PREFIX}NAMESPACE/POD/CONTAINER or {PREFIX}CONTAINER")
    for what, name in zip(("namespace", "pod", "container"), parts, strict=True):
        if not _NAME.match(name):
            raise KubernetesSourceError(f"{path}: {what} {name!r} is not a Kubernetes name")
    return ContainerRef(*parts)


def core_api(environ: Mapping[str, str] | None = None) -> CoreApi:
    """The API as the pod's service account sees it when KUBERNETES_SERVICE_HOST is set (in a cluster), else as
    the kubeconfig's current context (KUBECONFIG, or ~/.kube/config)."""
    env = os.environ if environ is None else environ
    try:
        return CoreApi(endpoint(env))
    except CredentialsError as e:
        where = "the pod's service account" if env.get("KUBERNETES_SERVICE_HOST") else "the kubeconfig"
        raise KubernetesSourceError(f"cannot load Kubernetes credentials from {where}: {e}") from None


# --- the API's timestamped lines -----------------------------------------------------------------------------

_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def parse_stamp(raw: bytes) -> int | None:
    """An RFC 3339 timestamp as integer nanoseconds since the epoch (exact, unlike a float), or None."""
    m = _STAMP.match(raw)
    if m is None:
        return None
    try:
        secs = timegm(time.strptime(m.group(1).decode(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    zone = m.group(3)
    if zone != b"Z":
        sign = 1 if zone[:1] == b"+" else -1
        secs -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return secs * 1_000_000_000 + int((m.group(2) or b"0").ljust(9, b"0"))


class TimestampedLines:
    """The bytes of `GET .../log?timestamps=true` in, the container's own text out (timestamps cut off), across
    reconnects without a line twice or lost.

    Position: the number of lines read in each of the last seconds (by their timestamps), and how much of an
    unfinished line was handed out. On a reconnect the stream starts again at some earlier time (sinceSeconds);
    `resume()` names the second S to reach back to. The lines sent again are then skipped: those before S
    (all read: lines come in order to within a second), then the first N of S and later, N being how many of
    them were read, in the order the API sent them (it sends a log in the same order every time), then the
    part of the unfinished line already handed out. Lines sharing a timestamp, and the stdout and stderr
    lines a runtime wrote slightly out of timestamp order, are counted right this way. A line later than every
    line read is never skipped: after a container restart the API serves the new container's log instead."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stamp = bytearray()  # the current line's timestamp, until the space that ends it
        self._in_body = False
        self._ts: int | None = None  # the current line's timestamp (ns)
        self._skip_line = False  # the current line was read before: drop it
        self._skip_bytes = 0  # bytes of the current line handed out before the connection dropped
        self._partial = 0  # bytes of the current, unfinished line handed out
        self._partial_ts: int | None = None
        self._per_second: dict[int, int] = {}  # lines read, by the second of their timestamp (the last few)
        self._last_second: int | None = None
        self._max_ts = -1  # the latest timestamp of a line handed out
        self._resume: tuple[int, int, tuple[int, int] | None] | None = None  # (S, lines to skip, partial)
        self._held_newline = False  # an unfinished line that never came again: end it before the next text
        self.lines = 0  # lines read (not counting those sent again)
        self.unstamped = 0  # lines without a timestamp (not expected): passed on, never skipped

    def feed(self, data: bytes) -> str:
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if not self._in_body:
                space, newline = data.find(b" ", i), data.find(b"\n", i)
                end = min(x for x in (space, newline, n) if x >= 0)
                self._stamp += data[i:end]
                i = end
                if end == n and len(self._stamp) <= MAX_STAMP_BYTES:
                    break  # the timestamp goes on in the next chunk
                ts = parse_stamp(bytes(self._stamp)) if end == space else None
                if ts is None:  # no timestamp: the bytes so far are the line's own
                    self.unstamped += 1
                    if self.unstamped == 1:
                        log.warning("a Kubernetes log line without a timestamp; passed on as it is")
                    body = bytes(self._stamp)
                    self._start_line(None)
                    self._body(body, out)
                else:
                    i += 1  # the space after the timestamp
                    self._start_line(ts)
            else:
                newline = data.find(b"\n", i)
                end = n if newline < 0 else newline + 1
                self._body(data[i:end], out)
                i = end
                if newline >= 0:
                    self._end_line()
        return self._decoder.decode(bytes(out))

    def _start_line(self, ts: int | None) -> None:
        self._in_body, self._ts, self._stamp = True, ts, bytearray()
        self._skip_line, self._skip_bytes = False, 0
        if self._resume is not None and ts is not None:
            since, skip, partial = self._resume
            if partial is not None and ts == partial[0] and not skip:
                self._skip_bytes = self._partial = partial[1]  # the unfinished line again: on after its handed-out part
                self._partial_ts, self._resume = ts, None
                return
            # A line read before is no later than the latest line read: anything later is new (also when the
            # container was restarted meanwhile and its new log is served instead of the old one).
            if ts <= self._max_ts and (ts // 1_000_000_000 < since or skip):
                self._skip_line = True
                if ts // 1_000_000_000 >= since:
                    self._resume = (since, skip - 1, partial)
                return
            self._resume = None  # the first line not read yet
            if partial is not None:  # the unfinished line did not come again: end it, so as not to glue the two
                self._held_newline = True
        self._partial, self._partial_ts = 0, ts
        if ts is not None and ts > self._max_ts:
            self._max_ts = ts

    def _body(self, piece: bytes, out: bytearray) -> None:
        if self._held_newline:
            out += b"\n"
            self._held_newline = False
        if self._skip_line:
            return
        if self._skip_bytes:
            cut = min(self._skip_bytes, len(piece))
            piece, self._skip_bytes = piece[cut:], self._skip_bytes - cut
        out += piece
        self._partial += len(piece)

    def _end_line(self) -> None:
        if not self._skip_line:
            self.lines += 1
            if self._ts is not None:
                sec = self._ts // 1_000_000_000
                self._per_second[sec] = self._per_second.get(sec, 0) + 1
                if self._last_second is None or sec > self._last_second:
                    self._last_second = sec
                    for old in [s for s in self._per_second if s < sec - KEPT_SECONDS]:
                        del self._per_second[old]
        self._in_body, self._ts, self._skip_line, self._skip_bytes = False, None, False, 0
        self._partial, self._partial_ts = 0, None

    def resume(self) -> int | None:
        """The connection ended: the second from which the next one must send the log again (None: from the
        start, nothing was read). Lines sent again from there are skipped as they come."""
        # whatever line was under way comes again whole (or is skipped again)
        self._stamp, self._in_body, self._ts, self._skip_line, self._skip_bytes = bytearray(), False, None, False, 0
        if self._resume is not None:  # dropped again while skipping: the same position still holds
            since = self._resume[0]
        else:
            if self._last_second is None and self._partial_ts is None:
                return None
            seconds = [s for s in (self._last_second, self._partial_ts and self._partial_ts // 1_000_000_000)
                       if s is not None]
            since = min(seconds) - 1 if self._last_second is not None else min(seconds)
        skip = sum(n for s, n in self._per_second.items() if s >= since)
        partial = (self._partial_ts, self._partial) if self._partial and self._partial_ts is not None else None
        if self._resume is not None and self._resume[2] is not None and partial is None:
            partial = self._resume[2]
        self._resume = (since, skip, partial)
        return since

    def end(self) -> str:
        """The log ended for good: what an unfinished last line still holds."""
        return self._decoder.decode(b"", final=True)  # the console stream's finish() ends the line itself


# --- following ------------------------------------------------------------------------------------------------


@dataclass
class Timing:
    """How long to wait between requests (tests shorten it)."""

    waiting: float = 2.0  # the container has not started yet
    backoff_min: float = 0.5  # after a failure, doubling up to backoff_max
    backoff_max: float = 30.0
    reconnect: float = 0.2  # the stream ended while the container runs
    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # no byte for this long: open the stream again (a dead connection never says so)


class KubernetesLogReader:
    """A ChunkReader (exporter/sources/base.py): a thread follows the container's log and queues its text; `poll` hands
    it to the ingest loop; `closed` once the container terminated for good and its log was read to the end."""

    def __init__(self, ref: ContainerRef, api: CoreApi, timing: Timing | None = None) -> None:
        self.ref = ref
        self.api = api
        self.timing = timing or Timing()
        self.stats = FollowStats()
        self.lines = TimestampedLines()
        self.requests = 0
        self.closed = False
        self._q: queue.Queue[str | None] = queue.Queue(QUEUED_CHUNKS)
        self._stop = threading.Event()
        self._resp: Stream | None = None
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    @classmethod
    def from_path(cls, path: str, environ: Mapping[str, str] | None = None) -> KubernetesLogReader:
        ref = parse_path(path, environ)
        return cls(ref, core_api(environ))

    def start(self) -> KubernetesLogReader:
        if self._thread is None:
            self._thread = threading.Thread(target=self._follow, name=f"k8s-log-{self.ref.container}", daemon=True)
            self._thread.start()
        return self

    def poll(self, timeout: float = 0.0) -> list[str]:
        self.start()
        out, ended = drain(self._q, timeout)
        self.closed = self.closed or ended
        return out

    def close(self) -> None:
        """Stops following (tests, shutdown): the thread ends at its next read."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()
        if self._thread is not None:
            self._thread.join(5)

    # --- the thread -------------------------------------------------------------------------------------------

    def _put(self, text: str) -> None:
        """Waits while the parser is QUEUED_CHUNKS behind: the API stream can wait, unlike a trainer's pipe."""
        while text and not self._stop.is_set():
            try:
                self._q.put(text, timeout=0.5)
                return
            except queue.Full:
                continue

    def _follow(self) -> None:
        backoff = self.timing.backoff_min
        try:
            while not self._stop.is_set():
                outcome = self._stream(follow=True)
                if self._stop.is_set():
                    break
                if outcome == "waiting":
                    self.stats.up = False
                    self._stop.wait(self.timing.waiting)
                    continue
                if outcome == "failed":
                    self.stats.up = False
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.timing.backoff_max)
                    continue
                if outcome == "ended" and self._finished():
                    self._stream(follow=False)  # whatever came after the follow ended, once
                    self._put(self.lines.end())
                    log.info("%s: the container terminated; its log was read to the end", self.ref)
                    break
                # ended with the container running (an API server restart, a timeout): read on at once; an end
                # that brought nothing new (a terminated container we may not look at) backs off instead
                if outcome == "read":
                    backoff = self.timing.backoff_min
                    self._stop.wait(self.timing.reconnect)
                else:
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.timing.backoff_max)
        except Exception:  # a bug here costs this log's metrics, never the sidecar or the trainer
            self.stats.read_errors += 1
            log.exception("%s: following the log failed; no more records from it", self.ref)
        finally:
            self.stats.up = False
            self._q.put(None)

    def _stream(self, follow: bool) -> str:
        """One request: 'read' (it ended after new lines), 'ended' (it ended, nothing new), 'waiting' (the
        container has not started), or 'failed' (counted)."""
        since = self.lines.resume() if self.requests else None
        resuming = since is not None
        since_seconds = max(1, math.ceil(time.time() - since) + SINCE_SLACK_SECONDS) if resuming else None
        self.requests += 1
        before = self.lines.lines
        try:
            self._resp = self.api.pod_log(self.ref.namespace, self.ref.pod, self.ref.container, follow=follow,
                                          timestamps=True, since_seconds=since_seconds,
                                          timeout=(self.timing.connect_timeout, self.timing.read_timeout))
        except Exception as e:
            return self._request_failed(e)
        if resuming:
            self.stats.resumed += 1
        self.stats.up = True
        self._warned.discard("failed")
        try:
            for data in self._resp.chunks(READ_SIZE):
                if self._stop.is_set():
                    break
                self.stats.bytes_read += len(data)  # as sent, timestamps and re-sent lines included
                self._put(self.lines.feed(data))
        except Exception as e:
            if _is_read_timeout(e):
                log.debug("%s: nothing for %.0f s; opening the stream again", self.ref, self.timing.read_timeout)
                return "read"
            self.stats.read_errors += 1
            self._warn("broken", "%s: the log stream broke (%s); reading on from the last line read", self.ref,
                       _short(e))
            return "failed" if self.lines.lines == before else "read"
        finally:
            with contextlib.suppress(Exception):
                self._resp.close()
            self._resp = None
        return "read" if self.lines.lines > before else "ended"

    def _request_failed(self, e: Exception) -> str:
        status = e.status if isinstance(e, ApiError) else None
        body = e.body if isinstance(e, ApiError) else ""
        if status == 400 and any(w in body for w in WAITING):
            if "waiting" not in self._warned:
                self._warned.add("waiting")
                log.info("%s: the container has not started yet; waiting for it", self.ref)
            return "waiting"
        self.stats.read_errors += 1
        hint = ""
        if status in (401, 403):
            hint = (f" (the pod's service account needs `get` on pods/log in namespace {self.ref.namespace}: see "
                    "docs/kubernetes-source.md)")
        elif status == 400:
            hint = f" (does pod {self.ref.pod} have a container named {self.ref.container}?)"
        elif status == 404:
            hint = " (is the namespace/pod right? POD_NAMESPACE and POD_NAME come from the downward API)"
        self._warn("failed", "%s: cannot read the log: %s%s; retrying (further failures are only counted in "
                   "posttrain_exporter_source_read_errors_total)", self.ref, _short(e), hint)
        return "failed"

    def _finished(self) -> bool:
        """The container terminated and will not run again (needs `get` on pods; without it, never: the log is
        then asked for again, backing off)."""
        try:
            pod = self.api.pod(self.ref.namespace, self.ref.pod, timeout=(self.timing.connect_timeout, 30))
        except Exception as e:
            self._warn("pod", "%s: cannot read the pod's status (%s): it is followed until the exporter stops (give "
                       "the service account `get` on pods to stop at the container's end)", self.ref, _short(e))
            return False
        return container_finished(pod, self.ref.container)

    def _warn(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)


def container_finished(pod: dict, container: str) -> bool:
    """From a Pod object: the pod has ended, or the container terminated and its restart policy will not start
    it again (Never; OnFailure after a success)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        done = ((cs.get("state") or {}).get("terminated"))
        if not done:
            return False
        return policy == "Never" or (policy == "OnFailure" and done.get("exitCode") == 0)
    return False


def _is_read_timeout(e: BaseException | None) -> bool:
    for _ in range(8):  # the socket's timeout, as it is or wrapped (TLS)
        if e is None:
            return False
        if type(e).__name__ in ("ReadTimeoutError", "TimeoutError", "timeout"):
            return True
        e = e.__cause__ or e.__context__
    return False


def _short(e: BaseException) -> str:
    if isinstance(e, ApiError):
        body = e.body
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            body = json.loads(body).get("message", body)
        return f"HTTP {e.status} {e.reason}: {body[:200]}".strip()
    return f"{type(e).__name__}: {str(e)[:200]}"
