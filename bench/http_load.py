"""Scrape latency under 50 concurrent scrapers: `serve` of a real TRL GRPO log, p50/p99/max per scrape.

    python bench/http_load.py                                   # this checkout's exporter
    python bench/http_load.py --root /tmp/base --label before   # another copy of the code (e.g. `git archive HEAD`)

Starts `python -m exporter serve --no-gpu --listen-address 127.0.0.1:PORT --log LOG` with the `exporter`
package of `--root`, waits until the whole log is ingested, optionally opens `--slow` connections that
send half a request and hold it, then runs `--scrapers` scrapers at once (one asyncio client process,
so the client costs little of the machine's cores), each doing `--rounds` scrapes back to back: a new
connection each, `GET /metrics` with `Accept-Encoding: gzip` as Prometheus sends it, timed from connect to
the last byte of the body. Also counts the kernel's listen-queue overflows and drops during the run
(/proc/net/netstat TcpExt ListenOverflows/ListenDrops: SYNs dropped because the accept queue was full).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOG = REPO / "tests" / "fixtures" / "trl" / "grpo" / "combined.log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listen_drops() -> dict[str, int]:
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=True))
            return {k: table.get(k, 0) for k in ("ListenOverflows", "ListenDrops")}
    return {"ListenOverflows": 0, "ListenDrops": 0}


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpu = model or platform.processor() or "unknown CPU"
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


async def scrape(port: int, timeout: float) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)  # HTTP/1.0-style: the server closes after the body
        writer.close()
        status = data[9:12]
        err = None if status == b"200" and b"\r\n\r\n" in data else f"status {status!r}"
    except (TimeoutError, OSError) as e:
        err = repr(e)
    return time.perf_counter() - t0, err


async def load(port: int, scrapers: int, rounds: int, timeout: float) -> tuple[list[float], list[str]]:
    times: list[float] = []
    errors: list[str] = []
    start = asyncio.Event()

    async def scraper() -> None:
        await start.wait()
        for _ in range(rounds):
            t, err = await scrape(port, timeout)
            times.append(t)
            if err:
                errors.append(err)

    tasks = [asyncio.create_task(scraper()) for _ in range(scrapers)]
    await asyncio.sleep(0.1)
    start.set()
    await asyncio.gather(*tasks)
    return times, errors


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO, help="folder holding the `exporter` package to run")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--log", type=Path, default=LOG)
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=20, help="scrapes per scraper, back to back")
    ap.add_argument("--slow", type=int, default=0, help="connections that send half a request and hold it")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
    cmd = [sys.executable, "-m", "exporter", "serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}",
           "--log", str(args.log.resolve()), "--run", "bench"]
    proc = subprocess.Popen(cmd, cwd=args.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    slow: list[socket.socket] = []
    try:
        deadline, body = time.monotonic() + 60, ""
        while time.monotonic() < deadline and 'posttrain_run_finished{run="bench"} 1.0' not in body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.2)
        if 'posttrain_run_finished{run="bench"} 1.0' not in body:
            raise SystemExit(f"the exporter did not ingest {args.log} within 60 s")
        size = len(body.encode())
        for _ in range(args.slow):
            s = socket.create_connection(("127.0.0.1", port))
            s.send(b"GET /metrics HTTP/1.1\r\nHost: sl")
            slow.append(s)
        before = listen_drops()
        t0 = time.perf_counter()
        times, errors = asyncio.run(load(port, args.scrapers, args.rounds, args.timeout))
        wall = time.perf_counter() - t0
        after = listen_drops()
    finally:
        for s in slow:
            s.close()
        proc.terminate()
        proc.wait(10)
    result = {
        "label": args.label, "machine": machine(), "scrapers": args.scrapers, "rounds": args.rounds,
        "slow_connections": args.slow, "scrapes": len(times), "errors": len(errors),
        "exposition_bytes": size,
        "p50_ms": round(statistics.median(times) * 1000, 1), "p99_ms": round(percentile(times, 0.99) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1), "scrapes_per_s": round(len(times) / wall, 1),
        "listen_overflows": after["ListenOverflows"] - before["ListenOverflows"],
        "listen_drops": after["ListenDrops"] - before["ListenDrops"],
    }
    print(f"{result['label']}: {result['scrapers']} scrapers x {result['rounds']} scrapes "
          f"({result['slow_connections']} slow connections held) on {result['machine']}")
    print(f"  p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms, "
          f"{result['scrapes_per_s']} scrapes/s, {result['errors']} errors, "
          f"listen-queue overflows {result['listen_overflows']} (drops {result['listen_drops']})")
    if errors:
        print(f"  first errors: {errors[:3]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
