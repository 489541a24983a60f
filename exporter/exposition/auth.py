"""HTTP basic auth against bcrypt hashes (the web config's `basic_auth_users`), as WSGI middleware.

bcrypt is slow on purpose (about 75 ms at cost 10, 1 s at cost 14), so a verified user and password is
remembered, as the exporter-toolkit does: 50 scrapers with the right password cost one bcrypt, not 50, and a
client whose password was verified before is answered without waiting for any check.

Passwords not seen before are checked one at a time (a storm of them costs one core at most), and cannot take
the server's workers from verified clients:
- at most CHECKS_AT_ONCE requests wait for or run a check; one more is answered 429 at once;
- one address has one check at a time, and after a wrong password its next one waits BACKOFF_FIRST_SECONDS,
  doubling with each wrong password in a row up to BACKOFF_MAX_SECONDS; its requests meanwhile are answered
  429 with Retry-After, without a check. A right password ends the backoff."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import bcrypt

from exporter.exposition.gate import address_key

log = logging.getLogger(__name__)

CACHE_SIZE = 256  # verified (user, password) pairs remembered
CHECKS_AT_ONCE = 4  # requests waiting for or running a bcrypt check: the workers that unknown passwords may hold
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
FORGET_SECONDS = 600.0  # an address's wrong passwords are forgotten this long after its last one
TRACKED_ADDRESSES = 4096  # addresses in backoff remembered at once (the oldest is forgotten first)
LOG_EVERY_SECONDS = 10.0


@dataclass
class _Failures:
    count: int
    retry_at: float  # monotonic time of the next check allowed
    last: float


class FailureBackoff:
    """Wrong passwords per address: how long an address must wait before its password is checked again."""

    def __init__(self, first: float = BACKOFF_FIRST_SECONDS, cap: float = BACKOFF_MAX_SECONDS,
                 forget: float = FORGET_SECONDS, size: int = TRACKED_ADDRESSES) -> None:
        self.first, self.cap, self.forget, self.size = first, cap, forget, size
        self._by_address: OrderedDict[str, _Failures] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, address: str, now: float) -> float:
        """Seconds until `address` may be checked again; 0: now."""
        with self._lock:
            f = self._by_address.get(address)
            if f is None:
                return 0.0
            if now - f.last > self.forget:
                del self._by_address[address]
                return 0.0
            return max(0.0, f.retry_at - now)

    def failed(self, address: str, now: float) -> float:
        """Records a wrong password; returns the backoff it starts."""
        with self._lock:
            f = self._by_address.pop(address, None)
            count = 1 if f is None or now - f.last > self.forget else f.count + 1
            delay = min(self.first * 2 ** min(count - 1, 32), self.cap)
            self._by_address[address] = _Failures(count, now + delay, now)
            while len(self._by_address) > self.size:
                self._by_address.popitem(last=False)
            return delay

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._by_address.pop(address, None)


class BasicAuth:
    def __init__(self, app: Callable, users: dict[str, bytes], realm: str = "posttrain-exporter",
                 checks_at_once: int = CHECKS_AT_ONCE, backoff: FailureBackoff | None = None) -> None:
        self.app = app
        self.users = users
        self.realm = realm
        self._verified: set[bytes] = set()  # digests of (user, password) pairs bcrypt accepted
        self._lock = threading.Lock()  # one bcrypt at a time
        self._slots = threading.BoundedSemaphore(checks_at_once)
        self._checking: set[str] = set()  # addresses with a check waiting or running
        self._checking_lock = threading.Lock()
        self.backoff = backoff or FailureBackoff()
        self.failures = 0  # wrong passwords (or unknown users)
        self.throttled = 0  # requests answered 429 without a check
        self._logged_at = 0.0
        self._logged = (0, 0)
        # An unknown user is checked against a hash of the same cost, so that timing does not tell users apart.
        cost = int(next(iter(users.values()))[4:6]) if users else 10
        self._decoy = bcrypt.hashpw(b"decoy", bcrypt.gensalt(rounds=max(4, min(cost, 31))))

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        credentials = _credentials(environ.get("HTTP_AUTHORIZATION", ""))
        if credentials is None:
            return self._unauthorized(start_response)
        digest = hashlib.sha256(credentials[0] + b"\0" + credentials[1]).digest()
        if digest in self._verified:  # verified before: never waits behind anyone
            return self.app(environ, start_response)
        address = address_key(environ.get("REMOTE_ADDR", ""))
        now = time.monotonic()
        wait = self.backoff.wait(address, now)
        if wait > 0:
            return self._throttled(start_response, wait, "wrong passwords from this address")
        if not self._slots.acquire(blocking=False):
            return self._throttled(start_response, 1.0, "too many passwords being checked")
        try:
            with self._checking_lock:
                mine = address not in self._checking
                self._checking.add(address)
            if not mine:
                return self._throttled(start_response, 1.0, "a password from this address is being checked")
            try:
                ok = self._check(*credentials, digest)
            finally:
                with self._checking_lock:
                    self._checking.discard(address)
        finally:
            self._slots.release()
        if ok:
            self.backoff.succeeded(address)
            return self.app(environ, start_response)
        self.failures += 1
        delay = self.backoff.failed(address, time.monotonic())
        self._log(address, delay)
        return self._unauthorized(start_response)

    def _check(self, user: bytes, password: bytes, digest: bytes) -> bool:
        with self._lock:
            if digest in self._verified:  # verified by the request this one waited for
                return True
            hashed = self.users.get(user.decode("utf-8", "replace"))
            ok = bcrypt.checkpw(password, hashed if hashed is not None else self._decoy) and hashed is not None
            if ok:
                if len(self._verified) >= CACHE_SIZE:
                    self._verified.clear()
                self._verified.add(digest)
            return ok

    def _unauthorized(self, start_response: Callable) -> Iterable[bytes]:
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", f'Basic realm="{self.realm}"')])
        return [b"Unauthorized\n"]

    def _throttled(self, start_response: Callable, wait: float, why: str) -> Iterable[bytes]:
        self.throttled += 1
        start_response("429 Too Many Requests", [("Content-Type", "text/plain; charset=utf-8"),
                                                 ("Retry-After", str(max(1, math.ceil(wait))))])
        return [f"Too many requests: {why}; retry later\n".encode()]

    def _log(self, address: str, delay: float) -> None:
        """One warning per LOG_EVERY_SECONDS at most, whatever the rate of wrong passwords."""
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_SECONDS:
            return
        failures, throttled = self.failures - self._logged[0], self.throttled - self._logged[1]
        self._logged_at, self._logged = now, (self.failures, self.throttled)
        log.warning("basic auth: %d wrong password(s) and %d request(s) answered 429 since the last report; the "
                    "latest from %s, whose next try waits %.0f s", failures, throttled, address, delay)


def _credentials(header: str) -> tuple[bytes, bytes] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        return None
    return (user, password) if sep else None


def with_headers(app: Callable, headers: dict[str, str]) -> Callable:
    """The web config's `http_server_config.headers`, added to every response."""
    if not headers:
        return app
    extra = list(headers.items())

    def wrapped(environ: dict, start_response: Callable) -> Iterable[bytes]:
        def start(status: str, response_headers: list, exc_info=None):
            return start_response(status, response_headers + extra, exc_info)

        return app(environ, start)

    return wrapped
