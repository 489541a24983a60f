"""Build a large TRL console log for the ingest benchmark.

The source is a real log (default: the GRPO fixture's combined_unbuffered.log: tqdm bars separated
by \\r, ANSI escapes, `{'loss': '-0.1011', ...}` dict lines). It is cut in three parts:

- prologue: everything before the first training-bar draw (model loading, warnings), written once;
- body: from the first training-bar draw to the line before the end-of-training summary
  (`{'train_runtime': ...}`), repeated;
- epilogue: the summary line and what follows it, written once.

So the result reads as one long run, not as many runs that each restart:

- the training bar's counts are offset: repetition k draws `N + T*k / T*R` instead of `N/T`
  (T: the source's training-bar total, R: the number of repetitions), with the percentage
  recomputed, so the step the exporter attributes keeps rising and never resets;
- cumulative keys (`epoch`, `num_tokens`) are offset by k times their last value in the source,
  formatted '.4g' like transformers 5 prints them. Every other value is kept as is.

Eval bars (`N/4`, cursor-up escapes) and the other bars are left untouched.

Writes PATH and PATH.meta.json (repetitions, final step, bytes), which ingest.py uses to check
that the exporter saw one run that reached the final step.

    python bench/make_log.py --size-mb 200 -o bench/out/trl_big.log
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SOURCE = Path(__file__).resolve().parents[1] / "tests/fixtures/trl/grpo/combined_unbuffered.log"
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "trl_big.log"
DEFAULT_SIZE_MB = 200.0

# `  4%|▍         | 13/300 [00:01<00:36,  7.95it/s]`: tqdm's `{percentage:3.0f}%|{bar}| {n}/{total} [`
_ANY_BAR = re.compile(rb"\| ?(\d+)/(\d+) \[")
_CUMULATIVE = (b"epoch", b"num_tokens")
_DICT_VALUE = re.compile(rb"'(" + b"|".join(_CUMULATIVE) + rb")': '([^']*)'")
_SUMMARY = b"{'train_runtime'"


def _bar_regex(total: int) -> re.Pattern[bytes]:
    return re.compile(rb"(?P<pct>[ \d]{3})%\|(?P<bar>[^|\r\n]*)\| ?(?P<n>\d+)/" + str(total).encode() + rb"(?= \[)")


@dataclass
class Template:
    """The body as static pieces with holes: ('bar', n) or ('value', key, number)."""

    pieces: list[bytes]
    holes: list[tuple[str, bytes, float, bytes]]  # (kind, key or bar text, number, original text)
    total: int


def training_total(data: bytes) -> int:
    """The training bar's total: the most frequent N/TOTAL total among the bar draws."""
    totals = Counter(int(m.group(2)) for m in _ANY_BAR.finditer(data))
    if not totals:
        raise SystemExit("make_log: no tqdm bar (N/TOTAL) in the source log")
    return totals.most_common(1)[0][0]


def split_source(data: bytes, total: int) -> tuple[bytes, bytes, bytes]:
    bar_rx = _bar_regex(total)
    first = bar_rx.search(data)
    if first is None:
        raise SystemExit(f"make_log: no training bar N/{total} in the source log")
    start = data.rfind(b"\r", 0, first.start())
    start = first.start() if start < 0 else start
    s = data.find(_SUMMARY, start)
    end = len(data) if s < 0 else data.rfind(b"\n", 0, s) + 1
    if end <= start:
        raise SystemExit("make_log: the summary line comes before the first training bar")
    return data[:start], data[start:end], data[end:]


def last_values(body: bytes) -> dict[bytes, float]:
    """Last value of each cumulative key in the body (what one repetition adds)."""
    out: dict[bytes, float] = {}
    for m in _DICT_VALUE.finditer(body):
        out[m.group(1)] = float(m.group(2))
    return out


def build_template(body: bytes, total: int) -> Template:
    bar_rx = _bar_regex(total)
    sites: list[tuple[int, int, tuple[str, bytes, float, bytes]]] = []
    for m in bar_rx.finditer(body):
        # Only the percentage and N change; the bar glyphs and `| ` stay as drawn.
        prefix = b"%|" + m.group("bar") + body[m.end("bar") : m.start("n")]
        sites.append((m.start("pct"), m.end(), ("bar", prefix, float(m.group("n")), m.group())))
    for m in _DICT_VALUE.finditer(body):
        sites.append((m.start(2), m.end(2), ("value", m.group(1), float(m.group(2)), m.group(2))))
    sites.sort()
    pieces: list[bytes] = []
    holes: list[tuple[str, bytes, float, bytes]] = []
    pos = 0
    for a, b, hole in sites:
        pieces.append(body[pos:a])
        holes.append(hole)
        pos = b
    pieces.append(body[pos:])
    return Template(pieces, holes, total)


def fmt_g4(x: float) -> bytes:
    """transformers 5 prints logged values with '.4g'."""
    return format(x, ".4g").encode()


def render(t: Template, k: int, reps: int, per_rep: dict[bytes, float]) -> bytes:
    grand = t.total * reps
    parts: list[bytes] = []
    for piece, (kind, key, num, orig) in zip(t.pieces, t.holes, strict=False):
        parts.append(piece)
        if kind == "bar":
            n = int(num) + t.total * k
            parts.append(f"{100 * n / grand:3.0f}".encode() + key + f"{n}/{grand}".encode())
        elif k == 0 or key not in per_rep:
            parts.append(orig)  # the first repetition prints its values exactly as the source did
        else:
            parts.append(fmt_g4(num + per_rep[key] * k))
    parts.append(t.pieces[-1])
    return b"".join(parts)


def offset_epilogue(epilogue: bytes, total: int, reps: int, per_rep: dict[bytes, float]) -> bytes:
    t = build_template(epilogue, total)
    return render(t, reps - 1, reps, per_rep)


def make_log(source: Path, out: Path, size_mb: float | None, reps: int | None) -> dict[str, object]:
    data = source.read_bytes()
    total = training_total(data)
    prologue, body, epilogue = split_source(data, total)
    per_rep = last_values(body)
    if reps is None:
        target = int((size_mb or DEFAULT_SIZE_MB) * 1_000_000)
        reps = max(1, math.ceil((target - len(prologue) - len(epilogue)) / len(body)))
    if reps < 1:
        raise SystemExit("make_log: --reps must be at least 1")
    t = build_template(body, total)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb", buffering=1 << 20) as f:
        f.write(prologue)
        for k in range(reps):
            f.write(render(t, k, reps, per_rep))
        f.write(offset_epilogue(epilogue, total, reps, per_rep))
    meta: dict[str, object] = {
        "source": str(source),
        "path": str(out),
        "bytes": out.stat().st_size,
        "repetitions": reps,
        "bar_total_per_repetition": total,
        "final_step": total * reps,
        "cumulative_offsets": {k.decode(): v for k, v in per_rep.items()},
    }
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta



# --- the other trainers' shapes (formats in the repo's README / tests: verl, OpenRLHF, JSON lines) ---------

# verl's step keys (its console logger and file logger print the same dict). `actor/*` come from
# np.mean (reduce_metrics) and print as `np.float64(...)` under NumPy 2 in the console; the others are
# Python floats and ints.
VERL_KEYS: tuple[str, ...] = (
    "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/kl_loss",
    "actor/kl_coef", "actor/entropy", "actor/grad_norm", "actor/lr",
    "critic/score/mean", "critic/score/max", "critic/score/min",
    "critic/rewards/mean", "critic/rewards/max", "critic/rewards/min",
    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
    "critic/returns/mean", "critic/returns/max", "critic/returns/min",
    "response_length/mean", "response_length/max", "response_length/min", "response_length/clip_ratio",
    "prompt_length/mean", "prompt_length/max", "prompt_length/min",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
    "timing_s/step", "perf/total_num_tokens", "perf/throughput",
)  # fmt: skip
VERL_VAL_KEYS = ("val-core/openai/gsm8k/reward/mean@1", "val-aux/openai/gsm8k/reward/std@1")
VERL_VAL_EVERY = 100  # steps between validation keys joining the step line (test_freq)
# The keys of OpenRLHF v0.11.0's PPO step line (with a critic) as tests/fixtures/openrlhf/make.py reproduces it.
OPENRLHF_KEYS: tuple[str, ...] = (
    "policy_loss", "actor_lr", "kl", "reward", "return", "response_length", "total_length", "critic_loss", "values",
    "critic_lr", "actor_grad_norm", "ppo_clip_ratio", "ppo_kl", "logprobs_diff", "entropy_loss",
    "timing/make_experience", "timing/ppo_train", "timing/broadcast", "timing/generation", "rollout/reward_mean",
    "rollout/reward_std", "rollout/response_length_mean", "rollout/truncated_rate", "rollout/num_samples",
    "critic_grad_norm", "timing/step_total",
)  # fmt: skip
OPENRLHF_LINES_PER_STEP = 70  # console lines (\r and \n pieces) of one step of that log
SHAPES = ("trl", "trl-dict", "verl-console", "verl-jsonl", "jsonl", "openrlhf")


def _verl_values(step: int, rng) -> dict[str, float | int]:
    v: dict[str, float | int] = {}
    for k in VERL_KEYS:
        if k == "perf/total_num_tokens":
            v[k] = rng.randrange(100_000, 400_000)
        elif k.startswith("response_length/") or k.startswith("prompt_length/"):
            v[k] = float(rng.randrange(10, 1024)) if not k.endswith("clip_ratio") else rng.random() * 0.1
        elif k == "actor/lr":
            v[k] = 1e-6
        else:
            v[k] = rng.gauss(0, 1) * 10 ** rng.randrange(-3, 2)
    if step % VERL_VAL_EVERY == 0:
        v.update({k: rng.random() for k in VERL_VAL_KEYS})
    return v


def _verl_console_line(step: int, v: dict[str, float | int]) -> str:
    parts = [f"step:{step}"]
    for k, x in v.items():
        parts.append(f"{k}:np.float64({x!r})" if k.startswith("actor/") else f"{k}:{x!r}")
    return "(TaskRunner pid=87031) " + " - ".join(parts)


def make_synthetic(shape: str, out: Path, lines: int, seed: int = 14) -> dict[str, object]:
    """`lines` lines of one trainer's log shape, a rising step (all numbers from a seeded RNG)."""
    import random

    rng = random.Random(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = 0
    with open(out, "w", buffering=1 << 20) as f:
        if shape == "verl-console":
            f.write("(TaskRunner pid=87031) step:0 - " + " - ".join(f"{k}:{rng.random()!r}" for k in VERL_VAL_KEYS)
                    + "\n")
        for step in range(1, lines + (shape != "verl-console")):
            if shape == "verl-console":
                f.write(_verl_console_line(step, _verl_values(step, rng)) + "\n")
            elif shape == "verl-jsonl":
                f.write(json.dumps({"step": step, "data": _verl_values(step, rng)}) + "\n")
            elif shape == "jsonl":
                v = {k.replace("actor/", "train/"): x for k, x in _verl_values(step, rng).items()}
                f.write(json.dumps({"step": step, **v}) + "\n")
            else:
                raise SystemExit(f"make_log: unknown shape {shape}")
            records += 1
    meta: dict[str, object] = {"shape": shape, "path": str(out), "bytes": out.stat().st_size,
                               "records": records + (shape == "verl-console"), "final_step": step, "seed": seed}
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def make_trl_dict_only(source: Path, out: Path, lines: int) -> dict[str, object]:
    """The GRPO fixture's stdout (dict lines only, no bars) repeated as one run: `epoch` and `num_tokens`
    offset per repetition like make_log, the eval lines kept, the summary once at the end."""
    text = source.read_bytes()
    body_lines = [ln for ln in text.split(b"\n") if ln.startswith(b"{'")]
    summary = [ln for ln in body_lines if ln.startswith(_SUMMARY)]
    body = b"\n".join(ln for ln in body_lines if not ln.startswith(_SUMMARY)) + b"\n"
    per_rep = last_values(body)
    reps = max(1, math.ceil(lines / body.count(b"\n")))
    t = build_template(body, 10**9)  # no bar in stdout: only the value holes
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb", buffering=1 << 20) as f:
        for k in range(reps):
            f.write(render(t, k, reps, per_rep))
        for ln in summary:
            f.write(ln + b"\n")
    per_rep_records = sum(b"'loss'" in ln for ln in body_lines if not ln.startswith(_SUMMARY))
    meta: dict[str, object] = {"shape": "trl-dict", "source": str(source), "path": str(out),
                               "bytes": out.stat().st_size, "repetitions": reps, "final_step": reps * per_rep_records}
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta

def make_openrlhf(out: Path, lines: int) -> dict[str, object]:
    """OpenRLHF v0.11.0 PPO with a critic as its console shows it (tests/fixtures/openrlhf/make.py: Ray's coloured
    actor prefixes, the workers' `Train epoch` bars with a postfix per micro-batch, the controller's `Episode` and
    `Generate samples` bars, logger lines, a `✨ Global step N: {...}` line of 26 keys a step, an eval line every 50
    steps), about `lines` console lines long."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "openrlhf_make", Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "openrlhf" / "make.py")
    make = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(make)  # type: ignore[union-attr]
    steps = max(1, lines // OPENRLHF_LINES_PER_STEP)
    text, truth = make.build("ppo_v0_11_0", steps)
    if set(truth[steps]) != set(OPENRLHF_KEYS):
        raise SystemExit(f"make_log: make.py's step line keys changed: {sorted(truth[steps])}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8", newline="")
    meta: dict[str, object] = {"shape": "openrlhf", "path": str(out), "bytes": out.stat().st_size, "records": steps,
                               "final_step": steps}
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help=f"output log (default {DEFAULT_OUT})")
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help=f"source log (default {DEFAULT_SOURCE})")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--size-mb", type=float, default=None, help=f"target size in MB (default {DEFAULT_SIZE_MB:g})")
    g.add_argument("--reps", type=int, default=None, help="number of repetitions of the body instead of a size")
    p.add_argument("--shape", choices=SHAPES, default="trl",
                   help="trl: the combined GRPO log (default); trl-dict: its stdout dict lines only; verl-console, "
                   "verl-jsonl, jsonl, openrlhf: generated lines of that trainer's shape")
    p.add_argument("--lines", type=int, default=200_000, help="lines of the generated shapes (default 200,000)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.shape == "trl":
        meta = make_log(args.source, args.out, args.size_mb, args.reps)
    elif args.shape == "trl-dict":
        meta = make_trl_dict_only(DEFAULT_SOURCE.with_name("stdout.log"), args.out, args.lines)
    elif args.shape == "openrlhf":
        meta = make_openrlhf(args.out, args.lines)
    else:
        meta = make_synthetic(args.shape, args.out, args.lines)
    print(f"wrote {meta['path']}: {meta['bytes']:,} bytes, final step {meta['final_step']:,} "
          f"({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
