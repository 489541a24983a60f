"""Profile `posttrain-exporter dump LOG` with cProfile and print where the time goes.

cProfile adds a per-call cost (a profiled run takes about 3x an unprofiled one here), so use a
smaller log than the benchmark's; the shares are what matters:

    .venv/bin/python bench/make_log.py --size-mb 20 -o bench/out/trl_20mb.log
    .venv/bin/python bench/profile_exporter.py bench/out/trl_20mb.log

Prints the top functions by cumulative time (share of the whole `dump` command) and the own
(exclusive) time summed per source file. Writes the raw profile to --out for pstats/snakeviz.
"""

from __future__ import annotations

import argparse
import pstats
import subprocess
import sys
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

FuncKey = tuple[str, int, str]


def short(f: FuncKey) -> str:
    path, line, name = f
    if path == "~":
        return name
    p = Path(path)
    try:
        path = str(p.relative_to(ROOT))
    except ValueError:
        path = p.name
    return f"{path}:{line} {name}"


def report(prof: Path, top: int) -> None:
    st = pstats.Stats(str(prof))
    stats: dict[FuncKey, tuple[int, int, float, float, dict]] = st.stats  # type: ignore[attr-defined]
    dump = [v[3] for k, v in stats.items() if k[2] == "cmd_dump"]
    whole = dump[0] if dump else st.total_tt  # type: ignore[attr-defined]
    print(f"profiled `dump`: {whole:.2f}s (under cProfile)\n")
    print(f"top {top} by cumulative time (share of `dump`):")
    print(f"{'cum s':>8} {'share':>6} {'own s':>7} {'calls':>10}  function")
    rows = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)
    shown = 0
    for key, (_, ncalls, tt, ct, _) in rows:
        if ct >= whole * 0.99:
            continue  # the command's wrappers (main, cmd_dump, read_to_end, poll, feed): ~100% by construction
        print(f"{ct:8.2f} {100 * ct / whole:5.1f}% {tt:7.2f} {ncalls:10d}  {short(key)}")
        shown += 1
        if shown >= top:
            break
    by_file: Counter[str] = Counter()
    for key, (_, _, tt, _, _) in stats.items():
        path = key[0]
        by_file[str(Path(path).relative_to(ROOT)) if path.startswith(str(ROOT)) else "(stdlib, builtins)"] += tt
    print("\nown time by file:")
    for name, tt in by_file.most_common(12):
        print(f"{tt:8.2f} {100 * tt / whole:5.1f}%  {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="cProfile `posttrain-exporter dump LOG` and print the hotspots")
    p.add_argument("log", type=Path)
    p.add_argument("--out", type=Path, default=BENCH / "out" / "exporter_dump.prof", help="raw profile")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "cProfile", "-o", str(args.out), "-m", "exporter", "dump", str(args.log)]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    report(args.out, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
