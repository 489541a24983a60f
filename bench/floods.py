"""Memory under every flood: each input dimension that could grow the exporter's memory, pushed far past its
bound, through `posttrain-exporter dump` in a child process; peak RSS, the series exported and the scrape size.

    .venv/bin/python bench/floods.py            # ~1 minute

Floods (each ~100k distinct things, far past limits.max_keys = 500 and the cache bounds):
- keys: JSON lines, each with a new key;
- components: TRL lines, each with new `rewards/<name>/mean` and `/std` keys (label values);
- long keys: keys of 10k characters;
- shapes: every line a new set of keys (the per-shape caches);
- one line: a single 100 MB line without a newline on standard input;
and, for comparison, the real 20 MB GRPO log (bench/make_log.py --size-mb 20)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N = 100_000


def keys() -> Iterator[str]:
    for i in range(N):
        yield json.dumps({"step": i + 1, "loss": 0.5, f"metric_{i}": 1.0})


def components() -> Iterator[str]:
    for i in range(N):
        yield f"{{'loss': '0.5', 'rewards/r{i}/mean': '0.5', 'rewards/r{i}/std': '0.1', 'epoch': '0.1'}}"


def long_keys() -> Iterator[str]:
    for i in range(N // 10):
        yield json.dumps({"step": i + 1, "loss": 0.5, f"k{i}" + "x" * 10_000: 1.0})


def shapes() -> Iterator[str]:
    for i in range(N):
        yield json.dumps({"step": i + 1, **{f"s{i}_{j}": float(j) for j in range(8)}})


FLOODS = {"keys": keys, "components": components, "long keys": long_keys, "shapes": shapes}


def _dump(args: list[str], stdin: Path | None = None) -> dict:
    """`dump` in a child under /usr/bin/time, which reports that child's own peak RSS."""
    t = time.perf_counter()
    with stdin.open("rb") if stdin else open(os.devnull, "rb") as inp:
        r = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "exporter", "dump", "--no-gpu", *args],
                           stdin=inp, capture_output=True, cwd=REPO, timeout=1800)
    took = time.perf_counter() - t
    rss_kib = int(r.stderr.decode().strip().splitlines()[-1])
    text = r.stdout.decode(errors="replace")
    series = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
    dropped = [ln for ln in text.splitlines() if ln.startswith(("posttrain_exporter_keys_dropped_total",
                                                                  "posttrain_exporter_lines_dropped_total"))
               and not ln.endswith(" 0.0")]
    return {"exit": r.returncode, "seconds": round(took, 1), "peak_rss_mib": round(rss_kib / 1024, 1),
            "series": series, "scrape_kib": round(len(r.stdout) / 1024, 1), "dropped": dropped[:4]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--line-mb", type=int, default=100)
    args = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "small.log"
        base.write_text("{'loss': '0.5', 'epoch': '0.1'}\n")
        out["(a 1-line log, for scale)"] = _dump([str(base)])
        for name, gen in FLOODS.items():
            path = Path(tmp) / f"{name.replace(' ', '_')}.log"
            with path.open("w") as f:
                for line in gen():
                    f.write(line + "\n")
            out[name] = _dump([str(path)])
        big = Path(tmp) / "line.txt"
        with big.open("wb") as f:
            chunk = b"x" * (1 << 20)
            for _ in range(args.line_mb):
                f.write(chunk)
        out[f"one {args.line_mb} MB line on stdin"] = _dump(["-"], stdin=big)
        real = REPO / "bench" / "out" / "trl_20mb.log"
        if not real.exists():
            subprocess.run([sys.executable, str(REPO / "bench" / "make_log.py"), "--size-mb", "20", "-o", str(real)],
                           check=True, capture_output=True)
        out["the real 20 MB GRPO log"] = _dump([str(real)])
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    print("| flood | exit | seconds | peak RSS (MiB) | series exported | scrape (KiB) | dropped, counted |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in out.items():
        print(f"| {name} | {r['exit']} | {r['seconds']} | {r['peak_rss_mib']} | {r['series']} | {r['scrape_kib']} | "
              f"{'; '.join(r['dropped']) or '-'} |")
    return 0 if all(r["exit"] == 0 for r in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
