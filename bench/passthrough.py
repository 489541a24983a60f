"""The trainer's output through `run -- CMD` and `serve --log -`: the trainer's own time next to the same trainer run
alone, and the sidecar's peak memory (the exporter and its copier process), on a stream of mixed binary and text.

    python bench/passthrough.py [--mb 200] [--repeat 3] [--write-size B] [--scrape-every S]
                                [--exporter PATH_TO_A_CHECKOUT] [--json OUT]

The stream: real TRL console text (the GRPO fixture: records, tqdm redraws with \\r, ANSI) alternating with random
binary blocks (no newline for up to 1 MiB: "lines" of any length), written by the trainer in 64 KiB writes
(--write-size), three quarters to stdout and a quarter to stderr. Every way writes into pipes drained by `cat`, as
a container runtime reads a pod's output, the trainer alone included. The trainer sleeps a second first (a trainer
loads before it prints: the copier started beside it is up by then), then times its own writes, first to last; the
bench reports the median of --repeat runs of each way, the ways interleaved, its ratio to the trainer alone with a
bootstrap 90% interval of that ratio (times at this scale vary from one repeat to the next), and the 99th
percentile of scrapes of /metrics made every 50 ms (--scrape-every; 0: none) while each way ran (the parser yields
the CPU to the trainer, not to the scrapes; the scrapes themselves compete with it). Peak
RSS is the kernel's high-water mark (VmHWM) of the exporter and of its copier, sampled every 20 ms until they exit;
their sum is compared with the chart's memory request (helm values: 100Mi). `--exporter` runs another checkout
(e.g. the code before issue 23) as a peer in the same run."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.loopback import free_port  # noqa: E402

TEXT = (REPO / "tests" / "fixtures" / "trl" / "grpo" / "combined_unbuffered.log").read_bytes()
CHART_REQUEST_MIB = 100

TRAINER = """
import os, sys, time
data, size = open(sys.argv[1], "rb").read(), int(sys.argv[3])
time.sleep(1.0)  # a trainer loads before it prints: what starts beside it (the copier) is up by then
start = time.perf_counter()
for i in range(0, len(data), size):
    os.write(2 if (i // size) % 4 == 3 else 1, data[i:i + size])
took = time.perf_counter() - start
open(sys.argv[2], "w").write(repr(took))
"""


def make_stream(path: Path, mb: int, seed: int = 23) -> None:
    rng = random.Random(seed)
    with path.open("wb") as f:
        while f.tell() < mb << 20:
            f.write(TEXT[: rng.randrange(len(TEXT) // 4, len(TEXT))])
            f.write(rng.randbytes(rng.choice((4096, 65536, 1 << 20))).replace(b"\n", b"\x00"))


def hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            out += [int(k) for k in kids]
    except OSError:
        pass
    return out


def cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def watch_memory(proc: subprocess.Popen, peaks: dict[int, int], done: threading.Event,
                 cpu: dict[int, float] | None = None) -> None:
    """The high-water mark (and the CPU time) of the exporter and every process it started but the trainer."""
    while not done.is_set():
        for pid in [proc.pid, *descendants(proc.pid)]:
            kib = hwm_kib(pid)
            if kib is None:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            # the trainer is not the sidecar's memory; nor is a child between its fork and its exec (its pages are
            # the exporter's, shared, and its high-water mark is the exporter's)
            if pid != proc.pid and b"exporter.sources.copier" not in cmd:
                continue
            peaks[pid] = max(peaks.get(pid, 0), kib)
            used = cpu_s(pid)
            if cpu is not None and used is not None:
                cpu[pid] = used
        time.sleep(0.02)


def scrape_while(port: int, done: threading.Event, took: list[float], every: float) -> None:
    """Scrapes /metrics every `every` seconds while the way runs: what a burst costs the scrapes (the parser yields
    the CPU), and what the scrapes cost the trainer."""
    while not done.is_set():
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
            took.append(time.perf_counter() - start)
        except OSError:  # not listening yet
            pass
        done.wait(every)


def sink() -> subprocess.Popen:
    """What reads a container's output (the runtime's log reader): a pipe, drained by `cat` into /dev/null."""
    return subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)


def wait_copier(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """`serve --log -` is up when its copier reads standard input (a trainer loads for minutes before it prints)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants(proc.pid):
            with contextlib.suppress(OSError):
                if b"copier" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return
        time.sleep(0.02)


def one(mode: str, stream: Path, exporter_root: Path, port: int, write_size: int, scrape_every: float = 0.05) -> dict:
    took_file = Path(tempfile.mktemp(prefix="took-"))
    trainer = [sys.executable, "-c", TRAINER, str(stream), str(took_file), str(write_size)]
    env = dict(os.environ, PYTHONPATH=str(exporter_root), OMP_NUM_THREADS="1")
    exporter = [sys.executable, "-m", "exporter", "--log-level", "error"]
    listen = ["--web.listen-address", f"127.0.0.1:{port}", "--no-gpu"]
    peaks: dict[int, int] = {}
    cpu: dict[int, float] = {}
    scrapes: list[float] = []
    out, err = sink(), sink()
    done = threading.Event()
    if mode != "alone" and scrape_every > 0:
        threading.Thread(target=scrape_while, args=(port, done, scrapes, scrape_every), daemon=True).start()
    start = time.perf_counter()
    if mode == "alone":
        subprocess.run(trainer, stdout=out.stdin, stderr=err.stdin, check=True)
    elif mode == "run":
        p = subprocess.Popen([*exporter, "run", *listen, "--", *trainer], stdout=out.stdin, stderr=err.stdin,
                             env=env, cwd=exporter_root)
        w = threading.Thread(target=watch_memory, args=(p, peaks, done, cpu), daemon=True)
        w.start()
        p.wait()
    else:  # trainer 2>&1 | serve --log -: serve runs on after its input ends; stopped once the trainer finished
        p = subprocess.Popen([*exporter, "serve", *listen, "--log", "-"], stdin=subprocess.PIPE, stdout=out.stdin,
                             stderr=err.stdin, env=env, cwd=exporter_root)
        w = threading.Thread(target=watch_memory, args=(p, peaks, done, cpu), daemon=True)
        w.start()
        wait_copier(p)
        t = subprocess.Popen(trainer, stdout=p.stdin, stderr=subprocess.STDOUT)
        p.stdin.close()
        t.wait()
        time.sleep(1.0)  # what it holds after its input ended counts too
        p.terminate()
        p.wait()
    done.set()
    for s in (out, err):
        s.stdin.close()
        s.wait()
    wall = time.perf_counter() - start
    took = float(took_file.read_text())
    took_file.unlink()
    copier_cpu = sum(v for pid, v in cpu.items() if pid != getattr(p, "pid", None)) if mode != "alone" else 0.0
    return {"mode": mode, "trainer_s": took, "wall_s": wall, "peak_rss_mib": sum(peaks.values()) / 1024,
            "copier_cpu_s": copier_cpu, "scrapes_s": scrapes,
            "peaks_mib": sorted(round(v / 1024, 1) for v in peaks.values())}


def ratio_ci(ways: list[float], alone: list[float], level: float = 0.9, draws: int = 2000) -> tuple[float, float]:
    """A bootstrap interval of median(ways) / median(alone): how far the ratio of one invocation can be trusted on a
    machine whose times vary from one repeat to the next (each side resampled with replacement; seeded)."""
    rng = random.Random(23)
    got = sorted(statistics.median(rng.choices(ways, k=len(ways))) / statistics.median(rng.choices(alone, k=len(alone)))
                 for _ in range(draws))
    cut = int((1 - level) / 2 * draws)
    return got[cut], got[draws - 1 - cut]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write-size", type=int, default=65536, help="bytes per write of the trainer (default 64 KiB)")
    ap.add_argument("--exporter", type=Path, action="append", default=[], help="another checkout, run as a peer")
    ap.add_argument("--scrape-every", type=float, default=0.05,
                    help="seconds between scrapes of /metrics while a way runs (default 0.05; 0: none)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp) / "stream.bin"
        make_stream(stream, args.mb)
        size = stream.stat().st_size
        rows = []
        roots = [("this", REPO)] + [(str(p), p) for p in args.exporter]
        for _ in range(args.repeat):  # interleaved: a busy moment of the machine falls on every way alike
            rows.append({"root": "-", **one("alone", stream, REPO, 0, args.write_size)})
            for name, root in roots:
                for mode in ("run", "stdin"):
                    rows.append({"root": name, **one(mode, stream, root, free_port(), args.write_size,
                                                     args.scrape_every)})
    alones = [r["trainer_s"] for r in rows if r["mode"] == "alone"]
    alone = statistics.median(alones)
    print(f"stream: {size / 1e6:.0f} MB (text and binary) in writes of {args.write_size} bytes; trainer alone: "
          f"{alone:.3f} s (median of {args.repeat})")
    print(f"{'exporter':<28} {'way':<6} {'trainer s':>9} {'x alone':>8} {'90% CI':>11} {'wall s':>7} "
          f"{'copier CPU s':>12} {'scrape p99 s':>12} {'peak RSS MiB':>13}  (each)")
    summary = []
    for name, _ in roots:
        for mode in ("run", "stdin"):
            sel = [r for r in rows if r["root"] == name and r["mode"] == mode]
            t = statistics.median(r["trainer_s"] for r in sel)
            low, high = ratio_ci([r["trainer_s"] for r in sel], alones)
            ci = f"{low:.2f}-{high:.2f}"
            rss = max(r["peak_rss_mib"] for r in sel)
            each = max(sel, key=lambda r: r["peak_rss_mib"])["peaks_mib"]
            wall = statistics.median(r["wall_s"] for r in sel)
            copier = statistics.median(r["copier_cpu_s"] for r in sel)
            scrapes = sorted(x for r in sel for x in r["scrapes_s"])
            p99 = scrapes[int(0.99 * (len(scrapes) - 1))] if scrapes else float("nan")
            print(f"{name[-28:]:<28} {mode:<6} {t:>9.3f} {t / alone:>8.2f} {ci:>11} {wall:>7.2f} {copier:>12.2f} "
                  f"{p99:>12.3f} {rss:>13.1f}  {each}")
            summary.append({"exporter": name, "way": mode, "trainer_s": t, "ratio": t / alone,
                            "ratio_ci90": [low, high], "wall_s": wall, "copier_cpu_s": copier,
                            "scrape_p99_s": p99, "scrapes": len(scrapes),
                            "peak_rss_mib": rss, "under_request": rss < CHART_REQUEST_MIB})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bytes": size, "alone_s": alone, "rows": rows, "summary": summary},
                                        indent=1))


if __name__ == "__main__":
    main()
