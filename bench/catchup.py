"""`serve` catching up on a large log (the whole history after a sidecar restart): how long it takes, how much
memory it holds, and how long scrapes and /healthz wait meanwhile.

    .venv/bin/python bench/make_log.py --size-mb 1000 -o bench/out/trl_1gb.log     # ~1 GB, once
    .venv/bin/python bench/catchup.py bench/out/trl_1gb.log

It starts `posttrain-exporter serve --no-gpu --log LOG`, scrapes /metrics and /healthz in a loop from another
thread until the exporter has read the log to its end (posttrain_step at the log's final step and /healthz no
longer saying "catching up"), and prints the catch-up time, the scrape and /healthz latencies (p50, p99, max)
during it, and the exporter's peak RSS."""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support.loopback import free_port  # noqa: E402


def _get(url: str) -> tuple[float, str]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read().decode(errors="replace")
    return time.perf_counter() - t, body


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    meta = json.loads(Path(str(args.log) + ".meta.json").read_text()) if Path(str(args.log) + ".meta.json").exists() \
        else {}
    final = meta.get("final_step")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--no-gpu", "--log", str(args.log),
                             "--web.listen-address", f"127.0.0.1:{port}"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    scrape, health, caught_up_said = [], [], 0
    t0 = time.perf_counter()
    try:
        while True:
            try:
                dt, body = _get(base + "/metrics")
            except OSError:
                time.sleep(0.05)
                continue
            scrape.append(dt)
            hdt, hbody = _get(base + "/healthz")
            health.append(hdt)
            caught_up_said += "catching up" in hbody
            m = re.search(r'^posttrain_step\{[^}]*\} (\S+)', body, re.M)
            step = float(m.group(1)) if m else -1
            if "catching up" not in hbody and step >= 0 and (final is None or step >= final):
                break
            if time.perf_counter() - t0 > 3600:
                raise SystemExit("no catch-up within an hour")
        took = time.perf_counter() - t0
        rss = _rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    size_mb = args.log.stat().st_size / 1e6
    out = {"log_mb": round(size_mb, 1), "final_step": final, "catch_up_seconds": round(took, 1),
           "mb_per_second": round(size_mb / took, 1), "scrapes": len(scrape),
           "scrape_p50_ms": round(1000 * _pct(scrape, 0.5), 1), "scrape_p99_ms": round(1000 * _pct(scrape, 0.99), 1),
           "scrape_max_ms": round(1000 * max(scrape), 1), "healthz_max_ms": round(1000 * max(health), 1),
           "healthz_said_catching_up": caught_up_said, "peak_rss_mib": round(rss / 1024, 1),
           "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}"}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
