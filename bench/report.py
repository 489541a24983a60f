"""`report` against `dump` on one long run: time, CPU, peak RSS and the size of what report writes.

The log is the GRPO fixture's stdout repeated as one run (make_log.py --shape trl-dict, the ingest benchmark's
`trl-dict` workload): 200,000 records by default, about 198,000 steps. Both commands read the whole file; `dump`
prints the exposition, `report` judges the run and prints the text report (and, with --html, writes the HTML
page too). They run alternately, --repeat times each; wall and CPU are the best run, RSS the largest. The target
(issue 28) is report within 1.5x of dump's wall time and peak RSS, its text under 20 KB.

    python bench/report.py                   # bench/out/report_200k.log, 3 rounds
    python bench/report.py --records 50000 --repeat 1 --html
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from ingest import GNU_TIME, RunResult, _git_revision, default_exporter, run_child  # noqa: E402

TIME_TARGET = RSS_TARGET = 1.5
TEXT_TARGET = 20_000


def machine() -> dict[str, str | int]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown")
    return {"nproc_available": len(os.sched_getaffinity(0)), "cpu_model": cpu, "loadavg_1m": os.getloadavg()[0],
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "exporter_revision": _git_revision()}


def ensure_log(records: int, regenerate: bool) -> Path:
    log = BENCH / "out" / f"report_{records // 1000}k.log"
    if regenerate or not log.exists():
        subprocess.run([sys.executable, str(BENCH / "make_log.py"), "--shape", "trl-dict", "--lines", str(records),
                        "-o", str(log)], check=True)
    return log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="records in the log (default 200,000)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of both commands (default 3)")
    p.add_argument("--html", action="store_true", help="also time report --format html")
    p.add_argument("--exporter", default=default_exporter(), help="the posttrain-exporter command")
    p.add_argument("--regenerate", action="store_true", help="make the log again")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    log = ensure_log(args.records, args.regenerate)
    work = BENCH / "out" / "report_bench"
    work.mkdir(parents=True, exist_ok=True)
    cmds = {"dump": [args.exporter, "dump", "--no-gpu", str(log)],
            "report": [args.exporter, "report", str(log)]}
    if args.html:
        cmds["report_html"] = [args.exporter, "report", "--format", "html", str(log)]
    runs: dict[str, list[RunResult]] = {k: [] for k in cmds}
    for _ in range(args.repeat):
        for name, cmd in cmds.items():
            runs[name].append(run_child(cmd, work, name, GNU_TIME if Path(GNU_TIME).exists() else None))
    best = {k: min(r.wall_s for r in v) for k, v in runs.items()}
    cpu = {k: min(r.cpu_s for r in v) for k, v in runs.items()}
    rss = {k: max(r.peak_rss_kib for r in v) / 1024 for k, v in runs.items()}
    sizes = {k: len(v[-1].stdout.encode()) for k, v in runs.items() if k != "dump"}
    m = machine()
    print(f"machine: {m['cpu_model']}, {m['nproc_available']} CPUs available, load {m['loadavg_1m']:.1f}, "
          f"{m['python']}, exporter {m['exporter_revision']}")
    print(f"log: {log} ({log.stat().st_size / 1e6:.0f} MB, {args.records:,} records), best of {args.repeat}")
    print(f"{'command':12s} {'wall s':>8s} {'cpu s':>8s} {'peak RSS MiB':>13s} {'output KB':>10s}")
    for k in cmds:
        out = f"{sizes[k] / 1000:10.1f}" if k in sizes else f"{'':10s}"
        print(f"{k:12s} {best[k]:8.2f} {cpu[k]:8.2f} {rss[k]:13.1f} {out}")
    ratios = {k: {"wall": round(best[k] / best["dump"], 2), "rss": round(rss[k] / rss["dump"], 2)}
              for k in cmds if k != "dump"}
    for k, r in ratios.items():
        print(f"{k} / dump: wall {r['wall']:.2f}x, peak RSS {r['rss']:.2f}x (target <= {TIME_TARGET}x both)")
    ok = (ratios["report"]["wall"] <= TIME_TARGET and ratios["report"]["rss"] <= RSS_TARGET
          and sizes["report"] < TEXT_TARGET)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "records": args.records, "repeat": args.repeat,
                                         "wall_s_best": best, "cpu_s_best": cpu, "peak_rss_mib": rss,
                                         "output_bytes": sizes, "ratios": ratios}, indent=2) + "\n")
    print("within target" if ok else "OUTSIDE TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
