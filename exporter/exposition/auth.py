"""HTTP basic auth against bcrypt hashes (the web config's `basic_auth_users`), as WSGI middleware.

bcrypt is slow on purpose (about 60 ms at cost 10, 1 s at cost 14), so a verified user and password is
remembered, as the exporter-toolkit does: 50 scrapers with the right password cost one bcrypt, not 50, and a
client whose password was verified before is answered without waiting for any check. A pair bcrypt refused is
remembered too (the same wrong password again costs no check), and a password longer than bcrypt reads (72
bytes) is refused without one.

A right password is never refused because wrong ones came from its address (a scraper behind NAT or a mesh
sidecar shares it with whoever is there): what is limited is the bcrypt work, not the address. Checks run one
at a time (a storm of them costs one core at most), in the order they were asked for, and cannot take the
server's workers from verified clients:
- at most CHECKS_AT_ONCE requests wait for or run a check, and at most PER_ADDRESS of them are one address's;
  one more is answered 429 at once (an IPv6 /64 is one address);
- a request waits at most WAIT_SECONDS for its turn, then is answered 429 with Retry-After;
- a wrong password is answered 401 once its check has run, a right one is served."""


from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import bcrypt

from exporter.exposition.gate import address_key

log = logging.getLogger(__name__)

CACHE_SIZE = 256  # verified (user, password) pairs remembered
REFUSED_SIZE = 4096  # refused (user, password) pairs remembered
CHECKS_AT_ONCE = 6  # requests waiting for or running a bcrypt check: the workers (of 16) unknown passwords may hold
PER_ADDRESS = 4  # of those, one address's
WAIT_SECONDS = 2.0  # a request waits this long for its check's turn, then is answered 429
BCRYPT_MAX_BYTES = 72  # bcrypt reads no further; the library refuses longer passwords
LOG_EVERY_SECONDS = 10.0


@dataclass(eq=False)
class _Ticket:
    address: str


class CheckQueue:
    """Whose bcrypt check runs next: requests in the order they asked, one check at a time, at most `at_once`
    waiting or running and `per_address` of one address, each waiting at most `wait` seconds for its turn."""

    def __init__(self, at_once: int = CHECKS_AT_ONCE, per_address: int = PER_ADDRESS,
                 wait: float = WAIT_SECONDS) -> None:
        self.at_once, self.per_address, self.wait = at_once, per_address, wait
        self._queue: deque[_Ticket] = deque()  # the first one's check is running
        self._by_address: Counter[str] = Counter()
        self._cond = threading.Condition()

    def enter(self, address: str) -> _Ticket | str:
        """Blocks until it is this request's turn: its ticket, or why it has none (to be answered 429)."""
        with self._cond:
            if len(self._queue) >= self.at_once:
                return "too many passwords being checked"
            if self._by_address[address] >= self.per_address:
                return "too many passwords from this address being checked"
            ticket = _Ticket(address)
            self._queue.append(ticket)
            self._by_address[address] += 1
            deadline = time.monotonic() + self.wait
            while self._queue[0] is not ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._remove(ticket)
                    return "waited too long for its password to be checked"
                self._cond.wait(left)
            return ticket

    def leave(self, ticket: _Ticket) -> None:
        with self._cond:
            self._remove(ticket)

    def _remove(self, ticket: _Ticket) -> None:
        self._queue.remove(ticket)
        self._by_address[ticket.address] -= 1
        if not self._by_address[ticket.address]:
            del self._by_address[ticket.address]
        self._cond.notify_all()


class BasicAuth:
    def __init__(self, app: Callable, users: dict[str, bytes], realm: str = "posttrain-exporter",
                 checks: CheckQueue | None = None) -> None:
        self.app = app
        self.users = users
        self.realm = realm
        self._verified: set[bytes] = set()  # digests of (user, password) pairs bcrypt accepted
        self._refused: dict[bytes, None] = {}  # ... and refused (insertion order: the oldest is forgotten first)
        self._checks = checks or CheckQueue()
        self.failures = 0  # wrong passwords (or unknown users, or passwords bcrypt cannot read)
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
        if digest in self._refused or len(credentials[1]) > BCRYPT_MAX_BYTES:
            return self._wrong(start_response, address)
        ticket = self._checks.enter(address)
        if isinstance(ticket, str):
            return self._throttled(start_response, ticket)
        try:
            ok = self._check(*credentials, digest)
        finally:
            self._checks.leave(ticket)
        if ok:
            return self.app(environ, start_response)
        return self._wrong(start_response, address)

    def _check(self, user: bytes, password: bytes, digest: bytes) -> bool:
        """bcrypt, run by one request at a time (CheckQueue's turn)."""
        if digest in self._verified:  # verified by a request this one waited behind
            return True
        hashed = self.users.get(user.decode("utf-8", "replace"))
        ok = bcrypt.checkpw(password, hashed if hashed is not None else self._decoy) and hashed is not None
        if ok:
            if len(self._verified) >= CACHE_SIZE:
                self._verified.clear()
            self._verified.add(digest)
        else:
            self._refused[digest] = None
            if len(self._refused) > REFUSED_SIZE:
                del self._refused[next(iter(self._refused))]
        return ok

    def _wrong(self, start_response: Callable, address: str) -> Iterable[bytes]:
        self.failures += 1
        self._log(address)
        return self._unauthorized(start_response)

    def _unauthorized(self, start_response: Callable) -> Iterable[bytes]:
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", f'Basic realm="{self.realm}"')])
        return [b"Unauthorized\n"]

    def _throttled(self, start_response: Callable, why: str) -> Iterable[bytes]:
        self.throttled += 1
        start_response("429 Too Many Requests", [("Content-Type", "text/plain; charset=utf-8"),
                                                 ("Retry-After", str(max(1, math.ceil(self._checks.wait))))])
        return [f"Too many requests: {why}; retry later\n".encode()]

    def _log(self, address: str) -> None:
        """One warning per LOG_EVERY_SECONDS at most, whatever the rate of wrong passwords."""
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_SECONDS:
            return
        failures, throttled = self.failures - self._logged[0], self.throttled - self._logged[1]
        self._logged_at, self._logged = now, (self.failures, self.throttled)
        log.warning("basic auth: %d wrong password(s) and %d request(s) answered 429 (checks busy) since the last "
                    "report; the latest wrong one from %s", failures, throttled, address)


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
