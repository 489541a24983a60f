"""Ingest benchmark: posttrain-exporter against mtail on the same large TRL console log.

Both tools read the same file, in the same run, to its end, as child processes:

- exporter: `posttrain-exporter dump LOG` (reads the file to its end, prints the exposition);
- mtail:    `mtail --one_shot --one_shot_format prometheus --progs bench/trl_keys.mtail --logs LOG`
            (reads the file from its start to EOF, prints its metric store, exits).

For each: wall time of the whole process (start to exit), user+sys CPU time from the child's own
rusage (os.wait4 on that child; getrusage(RUSAGE_CHILDREN) would sum every child so far), and
peak RSS from GNU time's %M (/usr/bin/time launches the tool; see run_child for why the rusage
figure taken straight from this Python process is not used when GNU time is there).

Lines: the number of non-empty segments of the file when it is split on '\\r\\n', '\\r' and
'\\n'. A tqdm bar redraw, a clear, a warning line and a metric dict each count as one. It is a
property of the file, the same count for both tools: lines/s = segments / wall seconds. mtail
itself splits on '\\n' only (a '\\n' line holds many '\\r' redraws); that count is reported too.

The run fails (exit 1) unless both tools extracted every key of the GRPO training lines, with the
same last values, and saw every dict line; the exporter must also show one run that reached the
final step with no history reset.

    .venv/bin/python bench/ingest.py                # one run each; makes bench/out/trl_big.log if missing
    .venv/bin/python bench/ingest.py --repeat 3 --json bench/out/ingest.json   # medians of 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_log

BENCH = Path(__file__).resolve().parent
DEFAULT_LOG = BENCH / "out" / "trl_big.log"
DEFAULT_PROG = BENCH / "trl_keys.mtail"
TARGET_RATIO = 2.0

# Every numeric key of the GRPO fixture's training dict lines (what both tools must extract).
TRL_KEYS: tuple[str, ...] = (
    "loss", "grad_norm", "learning_rate", "num_tokens",
    "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
    "completions/mean_terminated_length", "completions/min_terminated_length",
    "completions/max_terminated_length",
    "rewards/format_reward/mean", "rewards/format_reward/std",
    "rewards/length_reward/mean", "rewards/length_reward/std",
    "rewards/correctness_reward/mean", "rewards/correctness_reward/std",
    "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
    "clip_ratio/high_max", "step_time", "epoch",
)  # fmt: skip


def mtail_name(key: str) -> str:
    """The gauge trl_keys.mtail declares for a key: '/' is not allowed in metric names."""
    return "trl_" + key.replace("/", "_")


@dataclass(frozen=True)
class Workload:
    """One log shape: its log (made by make_log.py --shape), its mtail program and the keys both extract."""

    name: str
    shape: str  # make_log.py --shape
    prog: str  # file name under bench/
    prefix: str  # the mtail program's gauge prefix
    keys: tuple[str, ...]
    fmt: str  # the exporter's format label on posttrain_exporter_lines_total
    mtail_lines: str  # the mtail counter of record lines
    what: str

    def mtail_name(self, key: str) -> str:
        return f"{self.prefix}_" + re.sub(r"[^A-Za-z0-9_]", "_", key)

    def log(self, lines: int) -> Path:
        lines *= OPENRLHF_SCALE if self.shape == "openrlhf" else 1
        return BENCH / "out" / f"ingest_{self.name}_{lines // 1000}k.log"


_VERL = tuple(make_log.VERL_KEYS + make_log.VERL_VAL_KEYS)
WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("trl", "trl", "trl_keys.mtail", "trl", TRL_KEYS, "hf_dict", "trl_dict_lines_total",
             "combined TRL GRPO log (stdout+stderr: tqdm redraws, ANSI, dict lines)"),
    Workload("trl-dict", "trl-dict", "trl_keys.mtail", "trl", TRL_KEYS, "hf_dict", "trl_dict_lines_total",
             "TRL GRPO dict lines only (stdout apart from stderr)"),
    Workload("verl-console", "verl-console", "verl_console.mtail", "verl", _VERL, "verl_console",
             "verl_lines_total", "verl console `(TaskRunner pid=...) step:N - key:value - ...`"),
    Workload("verl-jsonl", "verl-jsonl", "verl_jsonl.mtail", "verl", _VERL, "verl_jsonl", "verl_lines_total",
             'verl file logger `{"step": N, "data": {...}}`'),
    Workload("jsonl", "jsonl", "jsonl.mtail", "jsonl", tuple(k.replace("actor/", "train/") for k in _VERL), "jsonl",
             "jsonl_lines_total", 'flat JSON lines `{"step": N, "key": value, ...}`'),
    Workload("openrlhf", "openrlhf", "openrlhf.mtail", "openrlhf", tuple(make_log.OPENRLHF_KEYS), "openrlhf",
             "openrlhf_lines_total", "OpenRLHF v0.11.0 PPO console (Ray prefixes, bars, `✨ Global step N: {...}`)"),
)}


OPENRLHF_SCALE = 5  # the openrlhf workload's log holds this many times --lines (ensure_log)


class BenchError(Exception):
    pass


# --- the file -------------------------------------------------------------------------------------

_TERM = b"\r\n"
# Every byte that is not a terminator becomes 'x', terminators become '\n': a non-empty segment
# then starts exactly where b"\nx" occurs (or at the file's first byte).
_SEGMENT_TABLE = bytes(0x0A if b in _TERM else 0x78 for b in range(256))


@dataclass
class LogCounts:
    bytes: int
    segments: int  # non-empty pieces between \r\n, \r and \n
    newline_lines: int  # pieces between \n (mtail's lines)


def count_lines(path: Path, chunk: int = 16 << 20) -> LogCounts:
    """One pass over the file (which also brings it into the page cache for both tools)."""
    size = segments = newlines = 0
    prev = b"\n"
    last = b"\n"
    with open(path, "rb") as f:
        while data := f.read(chunk):
            size += len(data)
            newlines += data.count(b"\n")
            t = data.translate(_SEGMENT_TABLE)
            segments += (prev + t).count(b"\nx")
            prev = t[-1:]
            last = data[-1:]
    if last != b"\n":
        newlines += 1  # an unterminated last line is still a line
    return LogCounts(size, segments, newlines)


def training_keys_in_log(path: Path, limit: int = 4 << 20) -> set[str]:
    """Keys of the training dict lines (those with 'loss') in the first `limit` bytes of the log."""
    with open(path, "rb") as f:
        head = f.read(limit).decode("utf-8", "replace")
    keys: set[str] = set()
    for line in re.split(r"\r\n|\r|\n", head):
        i = line.find("{'loss': ")
        if i >= 0:
            keys.update(re.findall(r"'([^']+)': '", line[i:]))
    return keys


# --- running one tool -----------------------------------------------------------------------------


@dataclass
class RunResult:
    wall_s: float
    cpu_s: float  # user + sys
    peak_rss_kib: int
    stdout: str = field(repr=False, default="")


GNU_TIME = "/usr/bin/time"


def run_child(cmd: list[str], workdir: Path, name: str, gnu_time: str | None) -> RunResult:
    """Run `cmd` to its end; wall time from here, CPU and peak RSS from the child's rusage.

    Peak RSS: a forked child's ru_maxrss starts from its parent's high-water mark at the fork (the
    kernel carries the old address space's peak over at exec), so measured straight from this
    Python process it can never read below this process's own RSS. With GNU time as the launcher
    the floor is time's own ~1 MiB: its %M is the tool's own peak. Without it, the wait4 figure
    is reported and `rss_floor_kib` says how much of it may be this process."""
    out_path, err_path, rss_path = (workdir / f"{name}.{x}" for x in ("out", "err", "rss"))
    full = [gnu_time, "-f", "%M", "-o", str(rss_path), *cmd] if gnu_time else cmd
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if proc.returncode != 0:
        tail = err_path.read_text(errors="replace")[-2000:]
        raise BenchError(f"{name} exited with {proc.returncode}: {' '.join(cmd)}\n{tail}")
    rss = ru.ru_maxrss
    if gnu_time:
        lines = rss_path.read_text().split()
        if not lines or not lines[-1].isdigit():
            raise BenchError(f"{gnu_time} wrote no peak RSS for {name}: {rss_path.read_text()!r}")
        rss = int(lines[-1])
    return RunResult(wall, ru.ru_utime + ru.ru_stime, rss, out_path.read_text(errors="replace"))


def samples(exposition: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(exposition) for s in fam.samples]


@dataclass
class Extracted:
    values: dict[str, float]  # key -> last value
    dict_lines: float  # record lines the tool counted as read
    extra: dict[str, float] = field(default_factory=dict)


def exporter_extracted(exposition: str, fmt: str = "hf_dict") -> Extracted:
    values: dict[str, float] = {}
    extra: dict[str, float] = {}
    dict_lines = 0.0
    for name, labels, value in samples(exposition):
        if name == "posttrain_metric":
            values[labels["key"]] = value
        elif name == "posttrain_exporter_lines_total" and labels.get("format") == fmt:
            if labels.get("outcome") == "record":
                dict_lines = value
            else:
                extra[f"{fmt}_{labels.get('outcome')}"] = value
        elif name in ("posttrain_step", "posttrain_loss", "posttrain_exporter_history_resets_total"):
            extra[name] = value
    return Extracted(values, dict_lines, extra)


def mtail_extracted(exposition: str, w: Workload | None = None) -> Extracted:
    w = w or WORKLOADS["trl"]
    by_name = {name: value for name, _, value in samples(exposition)}
    values = {k: by_name[w.mtail_name(k)] for k in w.keys if w.mtail_name(k) in by_name}
    return Extracted(values, by_name.get(w.mtail_lines, 0.0))


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def verify(exp: Extracted, mt: Extracted, final_step: int | None, w: Workload | None = None) -> list[str]:
    """Problems found; empty when both tools extracted every key, with the same last values."""
    w = w or WORKLOADS["trl"]
    problems: list[str] = []
    if not exp.values or exp.dict_lines == 0:
        problems.append(f"exporter extracted nothing (no posttrain_metric samples, no {w.fmt} records)")
    if not mt.values or mt.dict_lines == 0:
        problems.append(f"mtail extracted nothing (no {w.prefix}_* gauges set, {w.mtail_lines} is 0)")
    for k in w.keys:
        a, b = exp.values.get(k), mt.values.get(k)
        if a is None:
            problems.append(f"exporter: key {k!r} missing (posttrain_metric{{key={k!r}}})")
        if b is None:
            problems.append(f"mtail: key {k!r} missing ({w.mtail_name(k)})")
        if a is not None and b is not None and not same(a, b):
            problems.append(f"key {k!r}: exporter last value {a!r} != mtail {b!r}")
    if exp.dict_lines != mt.dict_lines:
        problems.append(f"record lines read: exporter {exp.dict_lines:.0f} != mtail {mt.dict_lines:.0f}")
    if "loss" in w.keys:
        loss = exp.extra.get("posttrain_loss")
        if loss is None or "loss" not in mt.values or not same(loss, mt.values["loss"]):
            problems.append(f"posttrain_loss {loss!r} != mtail trl_loss {mt.values.get('loss')!r}")
    if final_step is not None and exp.extra.get("posttrain_step") != final_step:
        problems.append(f"exporter posttrain_step {exp.extra.get('posttrain_step')!r} != final step {final_step}")
    if exp.extra.get("posttrain_exporter_history_resets_total", 0.0) != 0:
        problems.append("exporter saw the step go backwards (history reset): the log is not one run")
    return problems


# --- the machine ----------------------------------------------------------------------------------


def machine(mtail: str) -> dict[str, str | int]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ver = subprocess.run([mtail, "--version"], capture_output=True, text=True, check=False)
    mtail_version = (ver.stdout or ver.stderr).strip().splitlines()[0] if (ver.stdout or ver.stderr) else "?"
    return {
        "nproc": os.cpu_count() or 0,
        "nproc_available": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "mtail": mtail_version,
        "kernel": platform.release(),
        "exporter_revision": _git_revision(),
    }


def _git_revision() -> str:
    """The commit the exporter was measured at, `+dirty` when its sources had local changes."""
    root = BENCH.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "exporter"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


# --- main -----------------------------------------------------------------------------------------


@dataclass
class Side:
    name: str
    runs: list[RunResult] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        """Best of the runs: the machine is shared, and other work only ever adds time."""
        return min(r.wall_s for r in self.runs)

    @property
    def cpu_s(self) -> float:
        return min(r.cpu_s for r in self.runs)

    @property
    def peak_rss_mib(self) -> float:
        return max(r.peak_rss_kib for r in self.runs) / 1024

    def summary(self, counts: LogCounts, keys: int) -> dict[str, float | int | list[float]]:
        return {
            "wall_s_best": round(self.wall_s, 3),
            "wall_s_median": round(statistics.median(r.wall_s for r in self.runs), 3),
            "wall_s_runs": [round(r.wall_s, 3) for r in self.runs],
            "cpu_s_best": round(self.cpu_s, 3),
            "cpu_s_runs": [round(r.cpu_s, 3) for r in self.runs],
            "lines_per_s": round(counts.segments / self.wall_s),
            "newline_lines_per_s": round(counts.newline_lines / self.wall_s),
            "mb_per_s": round(counts.bytes / 1e6 / self.wall_s, 2),
            "lines_per_cpu_s": round(counts.segments / self.cpu_s),
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "keys_extracted": keys,
        }


def ensure_log(w: Workload, log: Path, lines: int, regenerate: bool) -> None:
    if log.exists() and Path(str(log) + ".meta.json").exists() and not regenerate:
        return
    cmd = [sys.executable, str(BENCH / "make_log.py"), "--shape", w.shape, "-o", str(log)]
    # the combined log: ~4.9 lines (\r/\n segments) per 1,000 bytes; the others: a line each
    if w.shape == "trl":
        cmd += ["--size-mb", f"{lines / 4835:.1f}"]
    elif w.shape == "openrlhf":
        # OpenRLHF's console: ~70 lines a step, most of them bar draws. At --lines it would hold 2,857 steps (15 MB),
        # where the exporter's start-up (0.14 s of CPU) is a third of its time; 5x (76 MB, 14,285 steps, half the
        # bytes of the step-lines-only log it replaces) measures the reading.
        cmd += ["--lines", str(lines * OPENRLHF_SCALE)]
    else:
        cmd += ["--lines", str(lines)]
    subprocess.run(cmd, check=True)


def default_exporter() -> str:
    beside = Path(sys.executable).parent / "posttrain-exporter"
    return str(beside) if beside.exists() else (shutil.which("posttrain-exporter") or "posttrain-exporter")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="posttrain-exporter vs mtail: ingest speed and memory, one log per "
                                "trainer's log shape, both tools in the same run")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all)")
    p.add_argument("--lines", type=int, default=200_000, help="lines per workload's log (default 200,000)")
    p.add_argument("--log", type=Path, default=None, help="the log of the single workload given (default: made "
                   "by make_log.py under bench/out/)")
    p.add_argument("--regenerate", action="store_true", help="make the logs again even if they exist")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each tool per workload, exporter and mtail alternating; best of N (default 3)")
    p.add_argument("--exporter", default=default_exporter(), help="posttrain-exporter executable")
    p.add_argument("--mtail", default=shutil.which("mtail") or "/usr/bin/mtail", help="mtail executable")
    p.add_argument("--time", dest="gnu_time", default=GNU_TIME if os.access(GNU_TIME, os.X_OK) else None,
                   help=f"GNU time, to launch the tools and read their peak RSS (default {GNU_TIME} when "
                   "installed; '' measures with wait4 alone)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="do not compile the exporter's bytecode first (compileall, as pip does for the image; an "
                   "editable install with PYTHONDONTWRITEBYTECODE set compiles every module at each start otherwise)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        p.error(f"--workloads: unknown {unknown} (known: {', '.join(WORKLOADS)})")
    if args.log is not None and len(names) != 1:
        p.error("--log goes with one workload (--workloads NAME)")
    try:
        return run(args, [WORKLOADS[n] for n in names])
    except BenchError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1


@dataclass
class Prepared:
    w: Workload
    log: Path
    meta: dict
    counts: LogCounts
    exp_cmd: list[str]
    mt_cmd: list[str]
    exporter: Side = field(default_factory=lambda: Side("exporter"))
    mtail: Side = field(default_factory=lambda: Side("mtail"))
    checks: dict = field(default_factory=dict)


def prepare(args: argparse.Namespace, w: Workload) -> Prepared:
    log = (args.log or w.log(args.lines)).resolve()
    ensure_log(w, log, args.lines, args.regenerate)
    meta_path = Path(str(log) + ".meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    prog = BENCH / w.prog
    check = subprocess.run([args.mtail, "--compile_only", "--logtostderr", "--progs", str(prog)],
                           capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise BenchError(f"mtail program {prog} does not compile:\n{check.stderr[-2000:]}")
    declared = set(re.findall(r"^gauge (\w+)", prog.read_text(), re.M))
    missing = [k for k in w.keys if w.mtail_name(k) not in declared]
    if missing:
        raise BenchError(f"{prog} declares no gauge for {missing}")
    if w.prefix == "trl":
        in_log = training_keys_in_log(log)
        if in_log != set(TRL_KEYS):
            raise BenchError(f"the log's training keys differ from the benchmark's: only in the log "
                             f"{sorted(in_log - set(TRL_KEYS))}, missing {sorted(set(TRL_KEYS) - in_log)}")
    exp_cmd = [args.exporter, "dump", "--no-gpu", str(log)]
    mt_cmd = [args.mtail, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(prog),
              "--logs", str(log), "--logtostderr", "--address", "127.0.0.1", "--port", "0"]
    return Prepared(w, log, meta, count_lines(log), exp_cmd, mt_cmd)


STARTUP_RUNS = 7


def startup(args: argparse.Namespace, prog: Path, workdir: Path) -> dict[str, float]:
    """Each tool's wall time on an empty log (start-up and exit), best of STARTUP_RUNS, alternating."""
    empty = workdir / "empty.log"
    empty.write_bytes(b"")
    cmds = {"exporter": [args.exporter, "dump", "--no-gpu", str(empty)],
            "mtail": [args.mtail, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(prog), "--logs",
                      str(empty), "--logtostderr", "--address", "127.0.0.1", "--port", "0"]}
    best = dict.fromkeys(cmds, math.inf)
    for _ in range(STARTUP_RUNS):
        for name, cmd in cmds.items():
            best[name] = min(best[name], run_child(cmd, workdir, f"startup-{name}", None).wall_s)
    return {name: round(v, 3) for name, v in best.items()}


def run(args: argparse.Namespace, workloads: list[Workload]) -> int:
    info = machine(args.mtail)
    if args.compile:  # what the image holds (pip compiles what it installs)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(BENCH.parent / "exporter")], check=True)
    preps = [prepare(args, w) for w in workloads]
    for pr in preps:
        print(f"{pr.w.name}: {pr.log} ({pr.counts.bytes / 1e6:.1f} MB, {pr.counts.segments:,} lines)", file=sys.stderr)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        start = startup(args, BENCH / preps[0].w.prog, Path(tmp))
        print(f"  start-up (empty log, best of {STARTUP_RUNS}): exporter {start['exporter']:.3f}s, "
              f"mtail {start['mtail']:.3f}s", file=sys.stderr)
        for i in range(args.repeat):  # every workload once per round, exporter and mtail back to back
            for pr in preps:
                for side, cmd in ((pr.exporter, pr.exp_cmd), (pr.mtail, pr.mt_cmd)):
                    r = run_child(cmd, Path(tmp), side.name, args.gnu_time or None)
                    side.runs.append(r)
                    print(f"  round {i + 1}/{args.repeat} {pr.w.name:13s} {side.name:8s} {r.wall_s:7.2f}s wall "
                          f"{r.cpu_s:7.2f}s cpu {r.peak_rss_kib / 1024:8.1f} MiB", file=sys.stderr)
                er, mr = pr.exporter.runs[-1], pr.mtail.runs[-1]
                exp_x, mt_x = exporter_extracted(er.stdout, pr.w.fmt), mtail_extracted(mr.stdout, pr.w)
                problems += [f"{pr.w.name} round {i + 1}: {msg}"
                             for msg in verify(exp_x, mt_x, pr.meta.get("final_step"), pr.w)]
                er.stdout = mr.stdout = ""  # checked: not kept
                pr.checks = {"keys": len(pr.w.keys),
                             "keys_exporter": sum(k in exp_x.values for k in pr.w.keys),
                             "keys_mtail": sum(k in mt_x.values for k in pr.w.keys),
                             "record_lines_exporter": exp_x.dict_lines, "record_lines_mtail": mt_x.dict_lines,
                             "posttrain_step": exp_x.extra.get("posttrain_step"),
                             "final_step": pr.meta.get("final_step")}
    rows = []
    for pr in preps:
        ratio = pr.mtail.wall_s / pr.exporter.wall_s  # same lines on both sides
        rows.append({
            "workload": pr.w.name, "what": pr.w.what,
            "log": {"path": str(pr.log), **asdict(pr.counts), "meta": pr.meta},
            "commands": {"exporter": pr.exp_cmd, "mtail": pr.mt_cmd},
            "exporter": pr.exporter.summary(pr.counts, pr.checks["keys_exporter"]),
            "mtail": pr.mtail.summary(pr.counts, pr.checks["keys_mtail"]),
            "ratio_lines_per_s": round(ratio, 3),
            "ratio_cpu": round(pr.mtail.cpu_s / pr.exporter.cpu_s, 3),
            "target_met": ratio >= TARGET_RATIO,
            "checks": pr.checks,
        })
    results = {
        "machine": info,
        "line_definition": "non-empty segments of the file split on \\r\\n, \\r and \\n",
        "repeat": args.repeat,
        "bytecode_compiled_first": args.compile,
        "startup_s": start,
        "timing": "best of the runs (minimum wall and CPU), exporter and mtail alternating per workload",
        "rss_method": f"GNU time %M ({args.gnu_time})" if args.gnu_time else "os.wait4 ru_maxrss",
        "rss_floor_kib": 0 if args.gnu_time else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "target_ratio": TARGET_RATIO,
        "workloads": rows,
        "problems": problems,
    }
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    if problems:
        print("FAIL: the tools did not both extract every key:\n  " + "\n  ".join(problems[:20]), file=sys.stderr)
        return 1
    return 0


def print_table(r: dict) -> None:
    m = r["machine"]
    print()
    mtail_short = m["mtail"].replace("mtail version ", "mtail ").split(" git revision")[0]
    print(f"machine: {m['cpu_model']}, {m['nproc']} cores ({m['nproc_available']} available), {m['python']}, "
          f"{mtail_short}; exporter at {m['exporter_revision']}")
    print(f"runs:    {r['repeat']} rounds, each workload's exporter and mtail back to back; "
          f"{r['timing'].split(',')[0]}; RSS the maximum ({r['rss_method']})")
    print(f"start-up (an empty log, best of {STARTUP_RUNS}): exporter {r['startup_s']['exporter']:.3f} s, "
          f"mtail {r['startup_s']['mtail']:.3f} s; exporter bytecode compiled first: {r['bytecode_compiled_first']}")
    print()
    head = ("workload", "lines", "keys", "exporter lines/s", "mtail lines/s", "ratio", "exporter CPU s",
            "mtail CPU s", "exporter RSS MiB", "mtail RSS MiB")
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" if i < 1 else "---:" for i in range(len(head))) + " |")
    for w in r["workloads"]:
        e, t = w["exporter"], w["mtail"]
        print(f"| {w['workload']} | {w['log']['segments']:,} | {w['checks']['keys']} | {e['lines_per_s']:,} | "
              f"{t['lines_per_s']:,} | **{w['ratio_lines_per_s']:.2f}x** | {e['cpu_s_best']:.2f} | "
              f"{t['cpu_s_best']:.2f} | {e['peak_rss_mib']:.1f} | {t['peak_rss_mib']:.1f} |")
    print()
    for w in r["workloads"]:
        verdict = "met" if w["target_met"] else "MISSED"
        print(f"{w['workload']:13s} {w['ratio_lines_per_s']:.2f}x (target >= {r['target_ratio']:g}x: {verdict}); "
              f"wall runs exporter {w['exporter']['wall_s_runs']} mtail {w['mtail']['wall_s_runs']}")


if __name__ == "__main__":
    raise SystemExit(main())
