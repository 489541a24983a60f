"""The sidecar's footprint while it follows live logs: resident memory and CPU per 1,000 records, for the exporter
(`serve`) and for mtail (bench/trl_keys.mtail) side by side in one run, on the same files and the same lines.

For each case (records a second in all, runs): N log files `runs/run-I/train.log` (one run each), empty when both
tools start; a writer appends the GRPO fixture's training dict lines (transformers 5's quoted values, the keys
trl_keys.mtail extracts) at the rate, spread over the runs. After a warm-up, CPU time (utime + stime, the process
and its children: the exporter's copier, none here) is read from /proc over the measured window and divided by the
records written in it; RSS is VmRSS at the window's end and VmHWM (the peak). Both tools must have read every record
(the exporter's posttrain_exporter_records_total, mtail's trl_dict_lines_total), else the case fails.

usage: python bench/footprint.py [--seconds 40] [--warmup 10] [--json bench/out/footprint.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
FIXTURE = REPO / "tests" / "fixtures" / "trl" / "grpo" / "combined.log"
CASES = [(10, 1), (10, 20), (1000, 1), (1000, 20)]  # (records a second, in all; runs)
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def record_lines(count: int, folder: Path) -> list[bytes]:
    """`count` records as a trainer prints them with transformers 5 (one dict a line): the fixture's stdout
    repeated as one long run, its epochs going on (bench/make_log.py's trl-dict shape), eval records kept."""
    sys.path.insert(0, str(BENCH))
    import make_log

    out = folder / "trl-dict.log"
    make_log.make_trl_dict_only(FIXTURE, out, count)
    return [ln + b"\n" for ln in out.read_bytes().split(b"\n") if ln.startswith(b"{'")][:count]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICK  # utime stime cutime cstime


def memory_kib(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status)[1])
    peak = int(re.search(r"VmHWM:\s+(\d+)", status)[1])
    return rss, peak


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def total(text: str, name: str) -> float:
    return sum(float(m[1]) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def exporter_records(text: str) -> float:
    return total(text, "posttrain_exporter_records_total")  # training and evaluation records, every run


class Writer(threading.Thread):
    """Appends records to the logs at `rate` a second in all, round-robin, in ticks of 10 ms."""

    def __init__(self, paths: list[Path], lines: list[bytes], rate: float) -> None:
        super().__init__(daemon=True)
        self.files = [open(p, "ab", buffering=0) for p in paths]  # noqa: SIM115  # closed in run's end
        self.lines, self.rate = lines, rate
        self.written = 0
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.is_set():
            self.write_due(int((time.monotonic() - start) * self.rate))
            self.stop.wait(0.01)
        for f in self.files:
            f.close()

    def write_due(self, due: int) -> None:
        while self.written < min(due, len(self.lines)):
            self.files[self.written % len(self.files)].write(self.lines[self.written])
            self.written += 1


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"footprint: timed out waiting for {what}")


def run_case(rate: int, runs: int, seconds: float, warmup: float, mtail: str, lines: list[bytes]) -> dict:
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        paths = []
        for i in range(runs):
            folder = Path(tmp, "runs", f"run-{i}")
            folder.mkdir(parents=True)
            (folder / "train.log").touch()
            paths.append(folder / "train.log")
        ex_port, mt_port = free_port(), free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        ex_cmd = [sys.executable, "-m", "exporter", "serve", "--no-gpu", "--log.level", "warn",
                  "--web.listen-address", f"127.0.0.1:{ex_port}"]
        for p in paths:
            ex_cmd += ["--log", str(p)]
        mt_cmd = [mtail, "--progs", str(BENCH / "trl_keys.mtail"), "--logs", ",".join(map(str, paths)),
                  "--address", "127.0.0.1", "--port", str(mt_port), "--logtostderr", "--v=0"]
        procs = {"posttrain-exporter": subprocess.Popen(ex_cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                                                        stderr=subprocess.DEVNULL),
                 "mtail": subprocess.Popen(mt_cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)}
        ports = {"posttrain-exporter": ex_port, "mtail": mt_port}
        try:
            for name, port in ports.items():
                wait_for(lambda port=port: bool(scrape(port)), 30, f"{name} to serve")
            writer = Writer(paths, lines, rate)
            writer.start()
            time.sleep(warmup)
            n0 = writer.written
            cpu0 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
            time.sleep(seconds)
            n1 = writer.written
            cpu1 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
            mem = {n: memory_kib(p.pid) for n, p in procs.items()}
            writer.stop.set()
            writer.join()
            done = writer.written
            wait_for(lambda: exporter_records(scrape(ex_port)) >= done, 60, "the exporter to read every record")
            wait_for(lambda: total(scrape(mt_port), "trl_dict_lines_total") >= done, 60,
                     "mtail to read every record")
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        records = n1 - n0
        out = {"records_per_second": rate, "runs": runs, "records": records, "seconds": seconds, "tools": {}}
        for n in procs:
            out["tools"][n] = {"cpu_ms_per_1000_records": (cpu1[n] - cpu0[n]) * 1e6 / records,
                               "rss_mib": mem[n][0] / 1024, "peak_rss_mib": mem[n][1] / 1024}
        return out


def machine(mtail: str) -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    ver = subprocess.run([mtail, "--version"], capture_output=True, text=True, check=False)
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "mtail": ((ver.stdout or ver.stderr).strip().splitlines() or ["?"])[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="measured window per case")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--mtail", default=shutil.which("mtail") or "mtail")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if shutil.which(args.mtail) is None:
        ap.error("mtail is not installed (Debian: apt-get install mtail)")
    scratch = Path(tempfile.mkdtemp(prefix="footprint-lines-"))
    lines = record_lines(int(max(r for r, _ in CASES) * (args.seconds + args.warmup) * 1.2) + 1000, scratch)
    results = {"machine": machine(args.mtail), "cases": []}
    print(f"{'rec/s':>6} {'runs':>4}  {'tool':18} {'CPU ms/1k rec':>13} {'RSS MiB':>8} {'peak MiB':>8}")
    for rate, runs in CASES:
        case = run_case(rate, runs, args.seconds, args.warmup, args.mtail, lines)
        results["cases"].append(case)
        for tool, t in case["tools"].items():
            print(f"{rate:6d} {runs:4d}  {tool:18} {t['cpu_ms_per_1000_records']:13.1f} {t['rss_mib']:8.1f} "
                  f"{t['peak_rss_mib']:8.1f}", flush=True)
        ex, mt = case["tools"]["posttrain-exporter"], case["tools"]["mtail"]
        print(f"{'':12}  ratio exporter/mtail: CPU {ex['cpu_ms_per_1000_records'] / mt['cpu_ms_per_1000_records']:.2f}"
              f"x, RSS {ex['rss_mib'] / mt['rss_mib']:.2f}x", flush=True)
    shutil.rmtree(scratch)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
