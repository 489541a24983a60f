"""The sidecar's memory ceiling: each reader fed its worst ~100 MB, the exporter's peak RSS for each (issue 35).

    .venv/bin/python bench/memory_ceiling.py                       # every case, ~100 MB each
    .venv/bin/python bench/memory_ceiling.py --mb 20 --case wide_table
    .venv/bin/python bench/memory_ceiling.py --root /tmp/base --label before   # another copy of the code

Each case writes its input (tests/support/hostile_inputs.py: good data before and after the hostile part) to a
temporary folder, then runs `python -m exporter dump` on it as a process of its own (the `exporter` package of
`--root`) and reads that process's peak RSS from the kernel (wait4's ru_maxrss: the high-water mark of its resident
memory), its wall time, and whether the good data after the hostile part arrived (its last step in the exposition).
The chart's memory limit is 128 MiB: every case is to stay under it."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from support import hostile_inputs as hi  # noqa: E402

LIMIT_MIB = 128  # the chart's resources.limits.memory


def cases(folder: Path, size: int) -> dict[str, tuple[list[str], str]]:
    """name -> (dump's arguments, a line the exposition holds when the good data after the bad arrived)"""
    gpu_cfg = folder / "gpu.yml"
    gpu_cfg.write_text(json.dumps({"gpu": {"source": "feed", "feed_file": str(folder / "gpu.jsonl")}}))
    last = 'posttrain_step{run="r"} '
    return {
        "wide_table": (["--no-gpu", str(hi.wide_table(folder / "wide.log", size))], last + "10000.0"),
        "long_table": (["--no-gpu", str(hi.long_table(folder / "long.log", size))], last + "10000.0"),
        "verl_samples": (["--no-gpu", str(hi.verl_samples(folder / "verl.log", size))], last + "100000.0"),
        "postfix_bars": (["--no-gpu", str(hi.postfix_bars(folder / "bars.log", size))], 'posttrain_exporter_lines'),
        "trl_feed": (["--no-gpu", str(hi.trl_feed(folder / "feed.jsonl", size))], last + "100000.0"),
        "trainer_state": (["--no-gpu", str(hi.trainer_state(folder / "trainer_state.json", size))],
                          f"{last}1e+07"),
        "tensorboard": (["--no-gpu", str(hi.tensorboard(folder / "events.out.tfevents.1.host", size))],
                        f"{last}1e+07"),
        "gpu_feed": (["--config", str(gpu_cfg), str(_one_record(folder)), "--", str(hi.gpu_feed(
            folder / "gpu.jsonl", size))], 'UUID="GPU-good-0"'),
    }


def _one_record(folder: Path) -> Path:
    path = folder / "one.log"
    path.write_text(hi.record_line(1) + "\n")
    return path


def measure(root: Path, args: list[str], needle: str) -> dict:
    if "--" in args:  # the GPU feed case: the feed is named in the config; the file only had to be written
        args = args[: args.index("--")]
    env = {**os.environ, "PYTHONPATH": str(root.resolve())}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "dump", "--run", "r", *args], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    return {"peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "wall_s": round(wall, 1), "exit": rc,
            "good_data_after": needle in out, "under_limit": usage.ru_maxrss / 1024 < LIMIT_MIB}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO, help="folder holding the `exporter` package to run")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--mb", type=float, default=100.0, help="size of each hostile input")
    ap.add_argument("--case", action="append", help="only these cases (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, (dump_args, needle) in cases(folder, int(args.mb * 1e6)).items():
            if args.case and name not in args.case:
                continue
            size = sum(Path(a).stat().st_size for a in dump_args if Path(a).is_file() and a.startswith(tmp))
            results[name] = {"input_mb": round(size / 1e6, 1), **measure(args.root, dump_args, needle)}
            r = results[name]
            print(f"{name:14s} {r['input_mb']:6.1f} MB  peak RSS {r['peak_rss_mib']:7.1f} MiB  {r['wall_s']:6.1f} s  "
                  f"exit {r['exit']}  good data after: {'yes' if r['good_data_after'] else 'NO'}  "
                  f"{'under' if r['under_limit'] else 'OVER'} {LIMIT_MIB} MiB", flush=True)
    summary = {"label": args.label, "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
               "python": platform.python_version(), "cases": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if all(r["under_limit"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
