"""The check on a real GPU (not run yet: no GPU machine was lent so far; bench/README.md "Real GPU check").

Run on a machine with an NVIDIA GPU, its driver, nvidia-smi and a CUDA build of PyTorch in the venv:

    .venv/bin/python scripts/gpu_check.py [--out DIR] [--seconds 20]

What it does, in about 2 minutes:
1. The sampler (exporter/gpu/sampler.py) at 0.2 s on the real NVML while GPU 0 is idle, then decodes (one token at
   a time through a 512M-parameter stack of linear layers: weight-read bound, as generation is), then trains the same
   stack (AdamW, batch 8 x 2048: compute bound): the phase the sampler judges against the phase the script is in.
2. The same run's GPU samples written by the trainer side (exporter/integrations/gpu_feed.py, what
   ExporterFeedCallback(gpu_feed=...) starts) and read back by the sidecar side (exporter/gpu/feed_samples.py).
3. Every field the exporter reads, compared with `nvidia-smi --query-gpu` taken right after one sampler poll at
   rest: index, UUID, name, utilization, memory used and total, power draw and enforced limit, temperature, SM clock
   (energy has no nvidia-smi field: checked as rising by about mean power x time).
4. The sampler's cost on the real driver: CPU per poll (the thread's own time), and promtool check metrics on the
   families.

It prints one line per check (PASS / FAIL and the figures) and writes them as JSON to --out (default: $OUT if set,
else the current folder); the exit status is 1 when a check fails."""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest

from exporter.gpu import GpuCollector, GpuSampler, SamplerConfig
from exporter.gpu.feed_samples import FeedGpuReader
from exporter.integrations.gpu_feed import GpuFeedWriter

# nvidia-smi field -> (GpuReading attribute, nvidia-smi's unit -> the exporter's, tolerance in the exporter's unit)
SMI_FIELDS = {
    "utilization.gpu": ("utilization_ratio", lambda v: v / 100, 0.15),  # sampled at different instants
    "memory.used": ("memory_used_bytes", lambda v: v * 2**20, 64 * 2**20),  # MiB, rounded
    "memory.total": ("memory_total_bytes", lambda v: v * 2**20, 2**20),
    "power.draw": ("power_watts", float, 15.0),  # a second apart at rest
    "enforced.power.limit": ("power_limit_watts", float, 1.0),
    "temperature.gpu": ("temperature_celsius", float, 2.0),
    "clocks.sm": ("sm_clock_hertz", lambda v: v * 1e6, 200e6),  # idle clocks move
}
results: list[dict] = []


def check(name: str, ok: bool, **figures: object) -> None:
    results.append({"check": name, "ok": bool(ok), **figures})
    print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(figures, default=str)}", flush=True)


def smi() -> list[dict[str, str]]:
    fields = ["index", "uuid", "name", *SMI_FIELDS]
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [dict(zip(fields, (c.strip() for c in row), strict=True)) for row in csv.reader(io.StringIO(out))]


def compare_with_smi(sampler: GpuSampler) -> None:
    snap = sampler.poll_once()
    rows = smi()
    check("nvml up and every GPU nvidia-smi lists is sampled", snap.nvml_up and len(snap.gpus) == len(rows),
          sampled=len(snap.gpus), smi=len(rows), errors=dict(snap.errors))
    by_uuid = {r.uuid: r for r in snap.gpus}
    for row in rows:
        g = by_uuid.get(row["uuid"])
        check(f"gpu {row['index']} identity", g is not None and str(g.index) == row["index"] and g.model == row["name"],
              smi=[row["index"], row["uuid"], row["name"]], exporter=g and [g.index, g.uuid, g.model])
        if g is None:
            continue
        for field, (attr, convert, tolerance) in SMI_FIELDS.items():
            text, ours = row[field], getattr(g, attr)
            if text in ("[N/A]", "[Not Supported]", ""):
                check(f"gpu {row['index']} {attr}", ours is None, smi=text, exporter=ours)
                continue
            want = convert(float(text))
            check(f"gpu {row['index']} {attr}", ours is not None and abs(ours - want) <= tolerance,
                  smi=want, exporter=ours, tolerance=tolerance)


def workload(seconds: float, out: Path) -> None:
    import torch

    dev, d = torch.device("cuda:0"), 8192
    uuid = "GPU-" + str(torch.cuda.get_device_properties(dev).uuid)
    sampler = GpuSampler(config=SamplerConfig(interval_seconds=0.2, slow_interval_seconds=1))
    feed_path = out / "gpu-samples.jsonl"
    feed_path.unlink(missing_ok=True)
    feed = GpuFeedWriter(feed_path, 0.5)  # the trainer side, as ExporterFeedCallback(gpu_feed=...) runs it
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(8)]).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    state = {"phase": "idle", "since": time.monotonic()}
    log: list[tuple[str, float, object]] = []
    done = threading.Event()

    def record() -> None:
        while not done.wait(0.2):
            g = [r for r in sampler.snapshot().gpus if r.uuid == uuid]
            log.append((state["phase"], time.monotonic() - state["since"], g[0] if g else None))

    def train_step() -> None:
        x = torch.randn(8, 2048, d, device=dev, dtype=torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def decode_step() -> None:
        x = torch.randn(1, d, device=dev, dtype=torch.bfloat16)
        for _ in range(64):
            x = torch.nn.functional.normalize(model(x), dim=-1)

    def run(phase: str, secs: float, step=None) -> None:
        torch.cuda.synchronize()
        state.update(phase=phase, since=time.monotonic())
        while time.monotonic() - state["since"] < secs:
            if step is None:
                time.sleep(0.05)
            else:
                step()
        torch.cuda.synchronize()

    sampler.start()
    feed.start()
    threading.Thread(target=record, daemon=True).start()
    t0 = time.monotonic()
    run("idle", 10)
    for _ in range(3):
        run("generation", seconds, decode_step)
        run("idle", 5)
        run("training", seconds, train_step)
    done.set()
    span = time.monotonic() - t0
    feed.stop()
    snap = sampler.snapshot()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(sampler))
    text = generate_latest(reg)
    sampler.stop()

    check("torch's GPU is sampled", any(r.uuid == uuid for r in snap.gpus), uuid=uuid)
    check("sampler cost on the real driver", snap.polls > 0,
          cpu_us_per_poll=round(1e6 * snap.cpu_seconds / snap.polls, 1),
          wall_us_per_poll=round(1e6 * snap.poll_seconds / snap.polls, 1),
          gpus=len(snap.gpus), polls=snap.polls)
    readings = [r for _, _, r in log if r is not None]
    energy = readings[-1].energy_joules - readings[0].energy_joules if readings[0].energy_joules is not None else None
    mean_power = statistics.mean(r.power_watts for r in readings if r.power_watts)
    check("energy rises by about mean power x time", energy is not None and abs(energy - mean_power * span)
          <= 0.2 * mean_power * span, energy_j=energy, mean_power_x_time_j=round(mean_power * span))
    first_training = next(i for i, (p, _, _) in enumerate(log) if p == "training")
    medians = {}
    for phase in ("idle", "generation", "training"):
        rows = [r for i, (p, t, r) in enumerate(log) if p == phase and t > 2 and i > first_training and r]
        agree = sum(r.phase is not None and r.phase.phase == phase for r in rows) / max(len(rows), 1)
        medians[phase] = statistics.median(r.power_watts for r in rows if r.power_watts) if rows else None
        check(f"phase agreement while {phase}", agree >= 0.9, n=len(rows), agreement=round(agree, 3),
              power_median_w=medians[phase])
    if medians["generation"] and medians["training"]:
        check("decode draws at most 0.7 x training power (the phase rule's premise)",
              medians["generation"] <= 0.7 * medians["training"], ratio=round(medians["generation"] /
                                                                               medians["training"], 3))
    promtool = shutil.which("promtool")
    if promtool:
        rc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True).returncode
        check("promtool check metrics", rc == 0)
    # the trainer's samples, as the sidecar reads them
    reader = FeedGpuReader(str(feed_path), stale_after_seconds=3600)
    fed = reader.poll_once()
    lines = feed_path.read_text().splitlines()
    times = [json.loads(ln)["t"] for ln in lines]
    fsnap = feed.sampler.snapshot()
    check("gpu feed: the trainer's samples at the bounded rate, read back", bool(fed.gpus) and not fed.errors
          and min(b - a for a, b in itertools.pairwise(times)) >= 0.45, lines=len(lines),
          feed_cpu_us_per_poll=round(1e6 * fsnap.cpu_seconds / max(fsnap.polls, 1), 1), gpus=[g.uuid for g in fed.gpus])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--seconds", type=float, default=20.0, help="length of each generation and training phase")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: run this on a machine with an NVIDIA GPU and its driver", file=sys.stderr)
        return 2
    rest = GpuSampler(config=SamplerConfig(interval_seconds=1.0))
    try:
        compare_with_smi(rest)
    finally:
        rest.stop()
    with tempfile.TemporaryDirectory():
        workload(a.seconds, out)
    (out / "gpu_check.json").write_text(json.dumps({"results": results, "smi": smi()}, indent=1, default=str))
    failed = [r["check"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} of {len(results)} checks pass" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
