"""The exporter's parsing at nice 10 on a machine the trainer keeps busy: does it keep pace with the records, and do
scrapes still answer?

    python bench/parse_under_load.py [--seconds 20] [--spinners N] [--rate 10]

The trainer (`posttrain-exporter run -- python -c ...`) starts N processes that spin (default: one more than the
machine has cores, so every core is taken), then prints a TRL record and a tqdm bar draw `--rate` times a second,
and the step it printed last into a file. /metrics is scraped every half second: the bench reports the largest lag
of `posttrain_step` behind the trainer's last printed step, in steps, and the scrapes' p50 and p99. The parsing
thread yields the CPU to the trainer (exporter/sources/priority.py): this is what that costs it when the trainer
takes every core."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.loopback import free_port  # noqa: E402

TRAINER = """
import multiprocessing as mp, sys, time
def spin():
    while True:
        pass
if __name__ == "__main__":
    spinners, rate, seconds, said = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    for _ in range(spinners):
        mp.Process(target=spin, daemon=True).start()
    steps = int(seconds * rate)
    for i in range(1, steps + 1):
        print("{'loss': %f, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'reward': 0.5, 'epoch': %f}" % (1 / i, i / steps),
              flush=True)
        print(f"\\r {100 * i // steps}%|#   | {i}/{steps} [00:01<00:10, 10it/s]", end="", file=sys.stderr, flush=True)
        open(said, "w").write(str(i))
        time.sleep(1 / rate)
"""
STEP = re.compile(r'^posttrain_step\{[^}]*\} (\S+)$', re.M)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--spinners", type=int, default=(os.cpu_count() or 1) + 1)
    ap.add_argument("--rate", type=float, default=10.0, help="records a second")
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        said = Path(tmp) / "step"
        said.write_text("0")
        p = subprocess.Popen([sys.executable, "-m", "exporter", "--log-level", "error", "run", "--no-gpu",
                              "--web.listen-address", f"127.0.0.1:{port}", "--", sys.executable, "-c", TRAINER,
                              str(args.spinners), str(args.rate), str(args.seconds), str(said)],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lags, took = [], []
        try:
            while p.poll() is None:
                printed = int(said.read_text() or 0)
                start = time.perf_counter()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                        body = r.read().decode()
                except OSError:  # not listening yet, or gone
                    time.sleep(0.5)
                    continue
                took.append(time.perf_counter() - start)
                m = STEP.search(body)
                if m and printed > 0:
                    lags.append(printed - float(m.group(1)))
                time.sleep(0.5)
        finally:
            p.kill()
            p.wait()
    took.sort()
    print(f"{os.cpu_count()} cores, {args.spinners} spinning processes, {args.rate:g} records/s for {args.seconds:g} s")
    p50, p99 = took[len(took) // 2], took[int(0.99 * (len(took) - 1))]
    print(f"scrapes: {len(took)}, p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms")
    print(f"lag of posttrain_step behind the trainer: max {max(lags):.0f} steps, last {lags[-1]:.0f} "
          f"({len(lags)} samples; a record a step, so 1 or 2 is the scrape's own timing)")


if __name__ == "__main__":
    main()
