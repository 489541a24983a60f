"""The copier process alone, without the exporter: what passing the trainer's output through it costs the trainer,
with and without a parser's copy, apart from what parsing costs.

    python bench/copier_alone.py [--mb 200] [--repeat 11] [--exporter PATH_TO_A_CHECKOUT]

The stream and the trainer are bench/passthrough.py's (211 MB of TRL text and random binary, 64 KiB writes, three
quarters to stdout, a quarter to stderr, into pipes drained by `cat`). The copier (`python -m
exporter.sources.copier`) is started on the trainer's two pipes, as `run` starts it, in two ways:
- `no_parser`: no parser's copy (`--parse` not given): the pass-through alone;
- `cat_parser`: the parser's copy read by a bare `cat` at memory speed: the most a parser can ask of the copier.
Each way's trainer time is the median over --repeat runs, the ways interleaved with the trainer alone.
`--exporter` runs another checkout's copier as a peer in the same run."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from passthrough import REPO, TRAINER, make_stream, sink

sys.path.insert(0, str(REPO))
from exporter.sources.copier import set_pipe_size  # 1 MiB, as `run` asks of the trainer's pipes


def one(way: str, root: Path, stream: Path) -> float:
    took = Path(tempfile.mktemp(prefix="took-"))
    trainer = [sys.executable, "-c", TRAINER, str(stream), str(took), "65536"]
    out, err = sink(), sink()
    if way == "alone":
        subprocess.run(trainer, stdout=out.stdin, stderr=err.stdin, check=True)
    else:
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        set_pipe_size(out_w)
        set_pipe_size(err_w)
        argv = [sys.executable, "-m", "exporter.sources.copier", "--stream", f"{out_r}:1:o", "--stream", f"{err_r}:2:e"]
        keep = [out_r, err_r]
        parse_r = parse_w = None
        if way == "cat_parser":
            parse_r, parse_w = os.pipe()
            set_pipe_size(parse_w)
            argv += ["--parse", str(parse_w)]
            keep.append(parse_w)
        copier = subprocess.Popen(argv, stdout=out.stdin, stderr=err.stdin, pass_fds=keep, cwd=root,
                                  env=dict(os.environ, PYTHONPATH=str(root)))
        for fd in (out_r, err_r, *([parse_w] if parse_w is not None else [])):
            os.close(fd)
        reader = None
        if parse_r is not None:
            reader = subprocess.Popen(["cat"], stdin=parse_r, stdout=subprocess.DEVNULL)
            os.close(parse_r)
        time.sleep(0.5)  # the copier is up
        subprocess.run(trainer, stdout=out_w, stderr=err_w, check=True)
        os.close(out_w)
        os.close(err_w)
        copier.wait()
        if reader is not None:
            reader.wait()
    for s in (out, err):
        s.stdin.close()
        s.wait()
    t = float(took.read_text())
    took.unlink()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--exporter", type=Path, action="append", default=[], help="another checkout, run as a peer")
    args = ap.parse_args()
    roots = [("this", REPO)] + [(str(p), p) for p in args.exporter]
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp) / "stream.bin"
        make_stream(stream, args.mb)
        for _ in range(args.repeat):
            times.setdefault(("-", "alone"), []).append(one("alone", REPO, stream))
            for name, root in roots:
                for way in ("no_parser", "cat_parser"):
                    times.setdefault((name, way), []).append(one(way, root, stream))
    alone = statistics.median(times["-", "alone"])
    print(f"trainer alone: {alone:.4f} s (median of {args.repeat})")
    print(f"{'copier':<28} {'way':<11} {'trainer s':>9} {'x alone':>8}  (each)")
    for (name, way), ts in times.items():
        if way != "alone":
            t = statistics.median(ts)
            print(f"{name[-28:]:<28} {way:<11} {t:>9.4f} {t / alone:>8.2f}  {sorted(round(x, 3) for x in ts)}")


if __name__ == "__main__":
    main()
