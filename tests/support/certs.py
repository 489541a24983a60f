"""Self-signed test PKI made with the `openssl` command: a CA, a server certificate for localhost/127.0.0.1/::1,
a client certificate signed by the CA (SAN `prometheus`), and a client certificate the CA never signed."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PKI:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # self-signed, not from the CA
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(folder: Path) -> PKI:
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=folder)
    for name, san, usage in (("server", "DNS:localhost,IP:127.0.0.1,IP:::1", "serverAuth"),
                             ("client", "DNS:prometheus", "clientAuth")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
        (folder / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)
    _openssl("req", "-x509", *ec, "-keyout", "stranger.key", "-out", "stranger.crt", "-days", "2",
             "-subj", "/CN=stranger", "-addext", "subjectAltName=DNS:prometheus", cwd=folder)
    return PKI(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "client.crt",
                   folder / "client.key", folder / "stranger.crt", folder / "stranger.key")
