"""The two Kubernetes API calls the `k8s://` source makes (a pod, and its container's log as a stream), with the
standard library: http.client over TLS, no client package.

Credentials as kubectl finds them: in a pod (KUBERNETES_SERVICE_HOST set) its service account's token and CA
(the token file is read again before every request, since the kubelet rotates bound tokens in place); elsewhere
the kubeconfig (KUBECONFIG, a list of files joined with ':' where the first to set a name wins, else
~/.kube/config) and its current context: the server, its CA (a file or inline data) or
insecure-skip-tls-verify, and a token, a token file or a client certificate and key. An exec or auth-provider
user (cloud login plugins) is refused at start with what to use instead: a sidecar has no interactive login."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import socket
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(Exception):
    """The API's address or credentials cannot be loaded: the caller stops at start with this message."""


class ApiError(Exception):
    """The API answered with an error status: `status`, `reason` and `body` (a Status object's JSON, usually)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason, self.body = status, reason, body


@dataclass
class Endpoint:
    """Where the API is and how to prove who we are."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None
    token: str | None = None
    token_file: Path | None = None  # read before every request (a rotated token replaces it in place)

    def authorization(self) -> str | None:
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as e:  # kept as it was: the request then fails with 401, counted and retried
                raise ApiError(401, "Unauthorized", f"cannot read the token {self.token_file}: {e}") from None
        return f"Bearer {token}" if token else None


def endpoint(environ: Mapping[str, str] | None = None, service_account: Path | None = None) -> Endpoint:
    """The pod's service account when KUBERNETES_SERVICE_HOST is set, else the kubeconfig's current context."""
    env = os.environ if environ is None else environ
    if env.get("KUBERNETES_SERVICE_HOST"):
        return _in_cluster(env, service_account or SERVICE_ACCOUNT)
    files = env.get("KUBECONFIG") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".kube", "config")
    return _from_kubeconfig([f for f in files.split(os.pathsep) if f])


def _in_cluster(env: Mapping[str, str], folder: Path) -> Endpoint:
    token, ca = folder / "token", folder / "ca.crt"
    for f in (token, ca):
        if not f.is_file():
            raise CredentialsError(f"{f} does not exist: mount the pod's service account token "
                                   "(automountServiceAccountToken must not be false)")
    host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT") or "443"
    try:
        tls = ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as e:
        raise CredentialsError(f"cannot read the service account's CA {ca}: {e}") from None
    return Endpoint("https", host, _port(port, "KUBERNETES_SERVICE_PORT"), tls, token_file=token)


def _port(raw: str, what: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise CredentialsError(f"{what}: {raw!r} is not a port")
    return port


def _from_kubeconfig(files: list[str]) -> Endpoint:
    from exporter.yamlfile import YamlFileError, read_yaml

    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}}
    current = None
    read = []
    for f in files:
        if not os.path.exists(f):
            continue
        try:
            doc = read_yaml(f, "kubeconfig") or {}
        except YamlFileError as e:
            raise CredentialsError(str(e)) from None
        if not isinstance(doc, dict):
            raise CredentialsError(f"{f}: not a kubeconfig (a mapping)")
        read.append(f)
        current = current or doc.get("current-context")
        for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in doc.get(kind) or []:
                if isinstance(entry, dict) and "name" in entry:
                    merged[kind].setdefault(entry["name"], dict(entry.get(key) or {}, _file=f))
    if not read:
        raise CredentialsError(f"no kubeconfig: {os.pathsep.join(files)} does not exist (set KUBECONFIG)")
    if not current or current not in merged["contexts"]:
        raise CredentialsError(f"kubeconfig {', '.join(read)}: no current-context, or it names no context")
    ctx = merged["contexts"][current]
    cluster = merged["clusters"].get(ctx.get("cluster"))
    if cluster is None or not cluster.get("server"):
        raise CredentialsError(f"kubeconfig: context {current!r} names no cluster with a server")
    user = merged["users"].get(ctx.get("user"), {})
    if "exec" in user or "auth-provider" in user:
        raise CredentialsError(f"kubeconfig: user {ctx.get('user')!r} logs in through a plugin (exec or "
                               "auth-provider), which the sidecar does not run: give it a token, a token file or "
                               "a client certificate (in a pod, the service account is used)")
    url = urlsplit(cluster["server"])
    if url.scheme not in ("http", "https") or not url.hostname:
        raise CredentialsError(f"kubeconfig: cluster server {cluster['server']!r} is not an http(s) URL")
    tls = None
    if url.scheme == "https":
        tls = _tls_context(cluster, user)
    token_file = user.get("tokenFile")
    return Endpoint(url.scheme, url.hostname, url.port or (443 if url.scheme == "https" else 80), tls,
                    token=user.get("token"), token_file=_relative(user, token_file) if token_file else None)


def _relative(entry: dict, path: str) -> Path:
    """A kubeconfig's relative paths are relative to the file that holds them."""
    return Path(os.path.dirname(entry["_file"]), os.path.expanduser(path))


def _tls_context(cluster: dict, user: dict) -> ssl.SSLContext:
    try:
        if cluster.get("insecure-skip-tls-verify"):
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            ctx = ssl.create_default_context(cadata=_pem(cluster["certificate-authority-data"]).decode())
        elif cluster.get("certificate-authority"):
            ctx = ssl.create_default_context(cafile=str(_relative(cluster, cluster["certificate-authority"])))
        else:
            ctx = ssl.create_default_context()
        cert, key = _client_pair(user)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise CredentialsError(f"kubeconfig: cannot load its CA or client certificate: {e}") from None
    return ctx


def _pem(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        raise CredentialsError("kubeconfig: inline certificate data is not base64") from None


def _client_pair(user: dict) -> tuple[str | None, str | None]:
    """The client certificate and key as files (inline data is written to private temporary files, as
    ssl can load a chain only from files)."""
    paths = []
    for key in ("client-certificate", "client-key"):
        if user.get(f"{key}-data"):
            fd, name = tempfile.mkstemp(prefix="posttrain-kube-", suffix=".pem")
            with os.fdopen(fd, "wb") as f:
                f.write(_pem(user[f"{key}-data"]))
            paths.append(name)
        elif user.get(key):
            paths.append(str(_relative(user, user[key])))
        else:
            paths.append(None)
    return paths[0], paths[1]


class Stream:
    """An open response: its body as it comes (`chunks`), `shutdown` from another thread to end a blocked read."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp

    def chunks(self, size: int) -> Iterator[bytes]:
        while data := self._resp.read1(size):  # the chunked framing is undone by http.client
            yield data

    def read(self) -> bytes:
        return self._resp.read()

    def shutdown(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._conn.close()


class CoreApi:
    """GET on the core group's pod paths: a pod, and its log."""

    def __init__(self, ep: Endpoint) -> None:
        self.endpoint = ep

    def _get(self, path: str, query: dict[str, str], timeout: tuple[float, float]) -> Stream:
        ep = self.endpoint
        headers = {"Accept": "application/json, */*", "User-Agent": "posttrain-exporter"}
        auth = ep.authorization()
        if auth:
            headers["Authorization"] = auth
        if ep.tls is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout[0],
                                                                          context=ep.tls)
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout[0])
        try:
            conn.request("GET", path + ("?" + urlencode(query) if query else ""), headers=headers)
            if conn.sock is not None:
                conn.sock.settimeout(timeout[1])  # connected: from now on, the wait for each byte
            resp = conn.getresponse()
            if resp.status >= 300:
                body = resp.read(65536).decode("utf-8", "replace")
                raise ApiError(resp.status, resp.reason, body)
        except BaseException:
            conn.close()
            raise
        return Stream(conn, resp)

    def pod(self, namespace: str, pod: str, timeout: tuple[float, float]) -> dict:
        stream = self._get(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}", {}, timeout)
        try:
            return json.loads(stream.read())
        finally:
            stream.close()

    def pod_log(self, namespace: str, pod: str, container: str, *, follow: bool, timestamps: bool,
                since_seconds: int | None, timeout: tuple[float, float]) -> Stream:
        query = {"container": container, "follow": str(follow).lower(), "timestamps": str(timestamps).lower()}
        if since_seconds is not None:
            query["sinceSeconds"] = str(since_seconds)
        return self._get(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/log", query, timeout)
