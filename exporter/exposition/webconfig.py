"""`--web.config.file`: TLS and basic auth in the Prometheus exporter-toolkit format, the file node_exporter reads.

    tls_server_config:
      cert_file: server.crt               # relative paths are read from the file's folder
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...              # bcrypt, e.g. `htpasswd -nBC 10 "" | tr -d ':\\n'`

Validated whole at start: every error names the field to fix. What the toolkit knows but this exporter
cannot honour (inline PEM keys, Go cipher-suite names, rate limits, client auth without verification) is
refused, never silently ignored: a security setting that is ignored would be worse than an error."""

from __future__ import annotations

import os
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from exporter.config import ConfigError

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# Go's tls.ClientAuthType names. Python's TLS verifies every client certificate it asks for, so the two
# policies that ask without verifying (insecure, says the toolkit) have no equivalent here.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_CLIENT_AUTH = {"RequestClientCert", "RequireAnyClientCert", "RequireClientCert"}
RESPONSE_HEADERS = {"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
                    "Strict-Transport-Security"}
_BCRYPT = re.compile(r"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")
TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version",
            "client_allowed_sans", "prefer_server_cipher_suites", "cert", "key", "client_ca", "cipher_suites",
            "curve_preferences"}
UNSUPPORTED = {
    "rate_limit": "not supported (wrong passwords are limited per address and the server's workers bound its load; "
                  "see the README's Security section); remove it",
    "tls_server_config.cert": "inline PEM is not supported; put the certificate in a file and name it in cert_file",
    "tls_server_config.key": "inline PEM is not supported; put the key in a file and name it in key_file",
    "tls_server_config.cipher_suites": "Go cipher-suite names are not supported; remove it (OpenSSL's defaults "
                                       "apply, and min_version: TLS13 leaves only TLS 1.3 suites)",
    "tls_server_config.curve_preferences": "not supported; remove it (OpenSSL's defaults apply)",
}


@dataclass(frozen=True)
class TLSSettings:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_ca: str | None = None  # inline PEM
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    client_allowed_sans: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    def files(self) -> list[str]:
        return [f for f in (self.cert_file, self.key_file, self.client_ca_file) if f]


@dataclass(frozen=True)
class WebConfig:
    tls: TLSSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)  # added to every response


def load_web_config(path: str | None) -> WebConfig | None:
    """The validated web config at `path` (None without one). Raises ConfigError naming the field to fix."""
    if path is None:
        return None
    from exporter.yamlfile import YamlFileError, read_yaml

    try:
        raw = read_yaml(path, "web config")
    except YamlFileError as e:
        raise ConfigError(str(e)) from None
    where = f"web config {path}"
    return parse_web_config(raw if raw is not None else {}, os.path.dirname(os.path.abspath(path)), where)


def parse_web_config(raw: Any, folder: str, where: str = "web config") -> WebConfig:
    def fail(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{where}: {key}: {msg}")

    _mapping(raw, fail, "(top level)", TOP_KEYS)
    tls = _tls(raw["tls_server_config"], folder, fail) if raw.get("tls_server_config") is not None else None
    http = raw.get("http_server_config") or {}
    _mapping(http, fail, "http_server_config", {"http2", "headers"})
    if "http2" in http and not isinstance(http["http2"], bool):
        raise fail("http_server_config.http2", f"must be true or false, got {http['http2']!r}")
    headers = http.get("headers") or {}
    _mapping(headers, fail, "http_server_config.headers", RESPONSE_HEADERS)
    for name, value in headers.items():
        if not isinstance(value, str) or any(c in value for c in "\r\n"):
            raise fail(f"http_server_config.headers.{name}", "must be a one-line string")
    users = raw.get("basic_auth_users") or {}
    _mapping(users, fail, "basic_auth_users", None)
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        key = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise fail(key, "a user name must be a non-empty string without ':'")
        if not isinstance(hashed, str) or not _is_bcrypt(hashed):
            raise fail(key, "not a bcrypt hash (like $2y$10$ followed by 53 characters; make one with "
                       "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
        hashes[user] = hashed.encode()
    return WebConfig(tls, hashes, dict(headers))


def _mapping(raw: Any, fail, key: str, known: set[str] | None) -> None:
    if not isinstance(raw, dict):
        raise fail(key, "must be a mapping")
    if known is None:
        return
    def full(k: object) -> str:
        return str(k) if key == "(top level)" else f"{key}.{k}"

    for k in raw:
        if full(k) in UNSUPPORTED:
            raise fail(full(k), UNSUPPORTED[full(k)])
        if k not in known:
            usable = sorted(n for n in known if full(n) not in UNSUPPORTED)
            raise fail(full(k), f"unknown setting (known: {', '.join(usable)})")


def _is_bcrypt(hashed: str) -> bool:
    import bcrypt

    if not _BCRYPT.match(hashed):
        return False
    try:
        bcrypt.checkpw(b"", hashed.encode())
    except ValueError:
        return False
    return True


def _tls(raw: Any, folder: str, fail) -> TLSSettings:
    _mapping(raw, fail, "tls_server_config", TLS_KEYS)

    def text(key: str) -> str | None:
        v = raw.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            raise fail(f"tls_server_config.{key}", "must be a non-empty string")
        return v

    def file(key: str) -> str | None:
        v = text(key)
        if v is None:
            return None
        path = os.path.join(folder, v)  # an absolute v stays as it is
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise fail(f"tls_server_config.{key}", f"cannot read {path}")
        return path

    cert, key = file("cert_file"), file("key_file")
    if cert is None or key is None:
        raise fail("tls_server_config.cert_file" if cert is None else "tls_server_config.key_file",
                   "required (the server's certificate and its key, PEM files)")
    auth = text("client_auth_type") or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise fail("tls_server_config.client_auth_type", f"{auth} accepts certificates it does not verify and is not "
                   "supported; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven)")
    if auth not in CLIENT_AUTH:
        raise fail("tls_server_config.client_auth_type", f"unknown policy {auth!r} (known: "
                   f"{', '.join(CLIENT_AUTH)})")
    ca_file, ca = file("client_ca_file"), text("client_ca")
    if ca_file and ca:
        raise fail("tls_server_config.client_ca", "give client_ca_file or client_ca, not both")
    if auth == "NoClientCert" and (ca_file or ca):
        raise fail("tls_server_config.client_auth_type", "client_ca_file is set but no client is asked for a "
                   "certificate; set client_auth_type: RequireAndVerifyClientCert")
    if auth != "NoClientCert" and not (ca_file or ca):
        raise fail("tls_server_config.client_ca_file", f"required with client_auth_type: {auth} (the CA that "
                   "signs the clients' certificates)")
    versions = {}
    for k, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = text(k) or default
        if v not in TLS_VERSIONS:
            raise fail(f"tls_server_config.{k}", f"unknown version {v!r} (known: {', '.join(TLS_VERSIONS)})")
        versions[k] = v
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise fail("tls_server_config.min_version", "is above max_version")
    sans = raw.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) and s for s in sans):
        raise fail("tls_server_config.client_allowed_sans", "must be a list of names")
    if sans and auth != "RequireAndVerifyClientCert":
        raise fail("tls_server_config.client_allowed_sans", "needs client_auth_type: RequireAndVerifyClientCert")
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise fail("tls_server_config.prefer_server_cipher_suites", f"must be true or false, got {prefer!r}")
    tls = TLSSettings(cert, key, ca_file, ca, auth, versions["min_version"], versions["max_version"], tuple(sans),
                      prefer)
    try:
        ssl_context(tls)
    except ssl.SSLError as e:
        raise fail("tls_server_config", f"cannot load the certificate, key or CA: {e.reason or e}") from None
    return tls


def ssl_context(tls: TLSSettings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    ctx.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file or tls.client_ca:
        ctx.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca)
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


class ReloadingContext:
    """The SSL context, built again when a certificate, key or CA file changes (cert-manager renews them in
    place), as the toolkit does. A file that cannot be loaded leaves the last good context in use."""

    CHECK_SECONDS = 1.0

    def __init__(self, tls: TLSSettings, on_error=None) -> None:
        self.tls = tls
        self._on_error = on_error
        self._lock = threading.Lock()
        self._stamp = self._stamps()
        self._ctx = ssl_context(tls)
        self._checked = time.monotonic()

    def _stamps(self) -> tuple:
        out = []
        for f in self.tls.files():
            try:
                st = os.stat(f)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.CHECK_SECONDS:
                return self._ctx
            self._checked = now
            stamp = self._stamps()
            if stamp != self._stamp:
                try:
                    self._ctx = ssl_context(self.tls)
                    self._stamp = stamp
                except (OSError, ssl.SSLError) as e:
                    if self._on_error is not None:
                        self._on_error(e)
            return self._ctx


def san_allowed(cert: dict | None, allowed: tuple[str, ...]) -> bool:
    """Whether a verified client certificate (ssl's getpeercert()) has a subjectAltName in `allowed`."""
    if not allowed:
        return True
    names = {value for _, value in (cert or {}).get("subjectAltName", ())}
    return bool(names & set(allowed))
