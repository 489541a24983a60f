"""HTTP basic auth against bcrypt hashes (the web config's `basic_auth_users`), as WSGI middleware.

bcrypt is slow on purpose (about 60 ms at cost 10 on this machine), so a verified user and password is
remembered, as the exporter-toolkit does: 50 scrapers with the right password cost one bcrypt, not 50.
Only successes are remembered; checks that miss run one at a time, so a storm of wrong passwords
costs one core at most, and never delays a scraper whose password was verified before."""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections.abc import Callable, Iterable

import bcrypt

CACHE_SIZE = 256


class BasicAuth:
    def __init__(self, app: Callable, users: dict[str, bytes], realm: str = "posttrain-exporter") -> None:
        self.app = app
        self.users = users
        self.realm = realm
        self._verified: set[bytes] = set()  # digests of (user, password) pairs bcrypt accepted
        self._lock = threading.Lock()
        # An unknown user is checked against a hash of the same cost, so that timing does not tell users apart.
        cost = int(next(iter(users.values()))[4:6]) if users else 10
        self._decoy = bcrypt.hashpw(b"decoy", bcrypt.gensalt(rounds=max(4, min(cost, 31))))

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if self.allowed(environ.get("HTTP_AUTHORIZATION", "")):
            return self.app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", f'Basic realm="{self.realm}"')])
        return [b"Unauthorized\n"]

    def allowed(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user_b, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        if not sep:
            return False
        user = user_b.decode("utf-8", "replace")
        digest = hashlib.sha256(user_b + b"\0" + password).digest()
        if digest in self._verified:
            return True
        with self._lock:
            if digest in self._verified:  # verified by the scraper this one waited for
                return True
            hashed = self.users.get(user)
            ok = bcrypt.checkpw(password, hashed if hashed is not None else self._decoy) and hashed is not None
            if ok:
                if len(self._verified) >= CACHE_SIZE:
                    self._verified.clear()
                self._verified.add(digest)
            return ok


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
