"""A verified scraper's latency while hostile clients flood a TLS and basic-auth `serve` (issue 23, item 1).

    .venv/bin/python bench/web_floods.py                                   # this checkout
    .venv/bin/python bench/web_floods.py --root /tmp/base --label before   # another copy of the code

Starts `python -m exporter serve --no-gpu` of a one-line log with the `exporter` package of `--root` and a web
config with TLS (a throwaway P-256 PKI made with `openssl`) and one bcrypt password at `--cost`. One scraper,
whose password is verified once first, scrapes /metrics back to back over a new TLS connection each (as
Prometheus does with keep-alive off), for `--seconds`, twice: alone ("quiet"), then while
tests/support/webflood.py (a process of its own) holds `--stalled` connections stalled in their handshake and
runs `--wrong` clients sending a wrong password, each from a loopback address of its own, as fast as they are
answered (`--distinct`: a new wrong password each time, so that each costs a bcrypt check). A scrape that fails
or takes over `--timeout` counts as `--timeout`, and its error (SSLEOFError, a status) is counted. Prints
p50/p99/max of each phase, their ratio, the failed scrapes, and what the flood's clients got."""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_load import free_port, machine, percentile  # noqa: E402
from support import webflood  # noqa: E402
from support.certs import make_pki  # noqa: E402

PASSWORD = "bench-password"


def scrape_for(port: int, ctx: ssl.SSLContext, seconds: float, timeout: float,
               errors: Counter | None = None) -> list[float]:
    """Scrape times; a failed scrape counts as `timeout`, and its error (exception name or status) in `errors`."""
    auth = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
    times: list[float] = []
    errors = Counter() if errors is None else errors
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPSConnection("localhost", port, timeout=timeout, context=ctx)
            conn.request("GET", "/metrics", headers=auth)
            r = conn.getresponse()
            r.read()
            conn.close()
            ok = r.status == 200
            if not ok:
                errors[str(r.status)] += 1
        except (OSError, http.client.HTTPException) as e:
            ok = False
            errors[type(e).__name__] += 1
        times.append(time.monotonic() - t0 if ok else timeout)
    return times


def figures(times: list[float], errors: Counter) -> dict:
    return {"scrapes": len(times), "failed": dict(errors), "p50_ms": round(percentile(times, 0.5) * 1000, 1),
            "p99_ms": round(percentile(times, 0.99) * 1000, 1), "max_ms": round(max(times) * 1000, 1)}


def main() -> int:
    import bcrypt

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO, help="folder holding the `exporter` package to run")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--cost", type=int, default=10, help="bcrypt cost of the password (htpasswd -B's default: 5)")
    ap.add_argument("--stalled", type=int, default=32)
    ap.add_argument("--wrong", type=int, default=150)
    ap.add_argument("--distinct", action="store_true", help="each wrong password a new one (each costs a bcrypt "
                    "check), not the same one every time")
    ap.add_argument("--seconds", type=float, default=10.0, help="of each phase")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pki = make_pki(folder / "pki")
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=args.cost)).decode()
        (folder / "web.yml").write_text(json.dumps({
            "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
            "basic_auth_users": {"prometheus": hashed}}))
        (folder / "train.log").write_text('{"step": 1, "loss": 0.5}\n')
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--no-gpu", "--listen-address",
                                 f"127.0.0.1:{port}", "--log", str(folder / "train.log"), "--web.config.file",
                                 str(folder / "web.yml")], cwd=args.root, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        flood = None
        try:
            deadline = time.monotonic() + 30
            while not any(t < args.timeout for t in scrape_for(port, ctx, 0.01, args.timeout)):
                if time.monotonic() > deadline:
                    raise SystemExit("the exporter did not answer within 30 s")
                time.sleep(0.2)
            quiet_errors: Counter[str] = Counter()
            quiet = scrape_for(port, ctx, args.seconds, args.timeout, quiet_errors)
            flood = subprocess.Popen([sys.executable, webflood.__file__, "--port", str(port), "--ca", str(pki.ca),
                                      "--stalled", str(args.stalled), "--wrong", str(args.wrong),
                                      "--seconds", str(args.seconds + 2), *(["--distinct"] if args.distinct else [])],
                                     stdout=subprocess.PIPE)
            assert flood.stdout is not None and flood.stdout.readline() == b"ready\n"
            time.sleep(1.0)
            flood_errors: Counter[str] = Counter()
            flooded = scrape_for(port, ctx, args.seconds, args.timeout, flood_errors)
            clients = json.loads(flood.communicate(timeout=60)[0].decode().splitlines()[-1])
        finally:
            if flood is not None and flood.poll() is None:
                flood.kill()
            proc.terminate()
            proc.wait(10)
    result = {"label": args.label, "machine": machine(), "bcrypt_cost": args.cost, "stalled": args.stalled,
              "wrong_password_clients": args.wrong, "distinct_passwords": args.distinct,
              "quiet": figures(quiet, quiet_errors), "flood": figures(flooded, flood_errors),
              "flood_clients": clients}
    result["p99_ratio_flood_to_quiet"] = round(result["flood"]["p99_ms"] / max(result["quiet"]["p99_ms"], 0.1), 1)
    print(f"{args.label}: bcrypt cost {args.cost}, {args.stalled} stalled handshakes + {args.wrong} wrong-password "
          f"clients, on {result['machine']}")
    for phase in ("quiet", "flood"):
        f = result[phase]
        print(f"  {phase:5s}: {f['scrapes']} scrapes, p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms, "
              f"max {f['max_ms']} ms, failed {f['failed'] or 0}")
    print(f"  p99 flood/quiet {result['p99_ratio_flood_to_quiet']}x; flood clients got {clients}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
