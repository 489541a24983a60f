"""GPU sampler cost: CPU time per poll with 8 fake GPUs, and CPU time per scrape of its families.

The sampler polls tests/fake_nvml.py (pure Python, the real exception classes) rather than a
driver: what is measured is the sampler's own work (calls, conversions, phase rule, snapshot)
plus the fake's. The fake's share is measured apart ("fake NVML alone": the same calls, in the
same number, made straight on the fake with no sampler around them), so that

    sampler overhead = sampler + fake - fake alone.

On a GPU machine each call also costs a ctypes call and a driver ioctl, not measured here.

Each poll runs with a fake clock one second after the previous (the default interval), so the
slow fields (every 30 s), the phase windows (600 s) and the reference quantile run as in service.
CPU time is the polling thread's own (time.thread_time, what the sampler exports as
posttrain_gpu_sampler_cpu_seconds_total), cross-checked with time.process_time over the loop.

    .venv/bin/python bench/gpu_sampler.py                         # 8 GPUs, 2000 polls, 3 repeats
    .venv/bin/python bench/gpu_sampler.py --gpus 8 --polls 2000 --repeat 3 --json bench/out/gpu_sampler.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fake_nvml import FakeNvml, h100s  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from exporter.gpu import GpuCollector, GpuSampler, SamplerConfig  # noqa: E402
from exporter.gpu.sampler import ECC_SCOPES, ECC_TYPES, RETIREMENT_CAUSES  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_fake(n_gpus: int, polls: int, seed: int = 1) -> FakeNvml:
    """n H100s in RL-like cycles (generation ~380 W, pause, training ~640 W), phase-shifted per GPU."""
    rng = random.Random(seed)
    gpus = h100s(n_gpus, ecc={(0, 0): 2})
    for k, g in enumerate(gpus):
        util, power = [], []
        for t in range(polls + 1):
            c = (t + 17 * k) % 165
            u, w = (97, 380) if c < 90 else (0, 90) if c < 105 else (99, 640)
            util.append(u)
            power.append(int((w + rng.uniform(-25, 25)) * 1000))
        g.utilization, g.power_mw = util, power
    return FakeNvml(gpus)


def machine() -> dict[str, object]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model, "python": platform.python_version(),
            "implementation": platform.python_implementation(), "platform": platform.platform()}


def run_sampler(n_gpus: int, polls: int) -> dict[str, float]:
    fake = make_fake(n_gpus, polls)
    clock = Clock()
    sampler = GpuSampler(fake, SamplerConfig(), env={}, clock=clock, wall_clock=time.time)
    sampler.poll_once()  # NVML init and the first slow read are not the steady state
    fake.advance()
    base = sampler.snapshot()
    calls0 = sum(fake.calls.values())
    p0 = time.process_time()
    for i in range(1, polls + 1):
        clock.t = float(i)
        sampler.poll_once()
        fake.advance()
    process = time.process_time() - p0
    snap = sampler.snapshot()
    assert snap.nvml_up and len(snap.gpus) == n_gpus and all(g.phase is not None for g in snap.gpus)
    return {
        "cpu_us_per_poll": (snap.cpu_seconds - base.cpu_seconds) / polls * 1e6,
        "wall_us_per_poll": (snap.poll_seconds - base.poll_seconds) / polls * 1e6,
        "process_us_per_poll": process / polls * 1e6,  # includes fake.advance() and the loop
        "nvml_calls_per_poll": (sum(fake.calls.values()) - calls0) / polls,
    }


def run_fake_alone(n_gpus: int, polls: int) -> float:
    """The same NVML calls, as many, straight on the fake: its share of the figure above."""
    fake = make_fake(n_gpus, polls)
    fake.nvmlInit()
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(n_gpus)]
    c0 = time.thread_time()
    for i in range(1, polls + 1):
        for h in handles:
            fake.nvmlDeviceGetUtilizationRates(h)
            fake.nvmlDeviceGetMemoryInfo(h)
            fake.nvmlDeviceGetPowerUsage(h)
            fake.nvmlDeviceGetEnforcedPowerLimit(h)
            fake.nvmlDeviceGetTemperature(h, 0)
            fake.nvmlDeviceGetClockInfo(h, 1)
            fake.nvmlDeviceGetTotalEnergyConsumption(h)
            fake.nvmlDeviceGetCurrentClocksEventReasons(h)
            if i % 30 == 0:
                for _, t in ECC_TYPES:
                    for _, s in ECC_SCOPES:
                        fake.nvmlDeviceGetTotalEccErrors(h, t, s)
                for _, c in RETIREMENT_CAUSES:
                    fake.nvmlDeviceGetRetiredPages(h, c)
                fake.nvmlDeviceGetRemappedRows(h)
        fake.tick += 1  # the traces move as in run_sampler; energy is not needed here
    return (time.thread_time() - c0) / polls * 1e6


def run_scrape(n_gpus: int, scrapes: int) -> dict[str, float]:
    fake = make_fake(n_gpus, 700)
    clock = Clock()
    sampler = GpuSampler(fake, SamplerConfig(), env={}, clock=clock)
    for i in range(700):  # past the phase windows
        clock.t = float(i)
        sampler.poll_once()
        fake.advance()
    collector = GpuCollector(sampler)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg)
    c0 = time.thread_time()
    for _ in range(scrapes):
        generate_latest(reg)
    c1 = time.thread_time()
    for _ in range(scrapes):
        list(collector.collect())
    c2 = time.thread_time()
    return {"cpu_us_per_scrape": (c1 - c0) / scrapes * 1e6, "collect_cpu_us_per_scrape": (c2 - c1) / scrapes * 1e6,
            "exposition_bytes": len(text), "exposition_series": text.count(b"\n") - text.count(b"\n#")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--polls", type=int, default=2000)
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measure; medians are reported")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    runs = [run_sampler(args.gpus, args.polls) for _ in range(args.repeat)]
    fake_alone = statistics.median(run_fake_alone(args.gpus, args.polls) for _ in range(args.repeat))
    scrapes = [run_scrape(args.gpus, args.scrapes) for _ in range(args.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    scrape = {k: statistics.median(r[k] for r in scrapes) for k in scrapes[0]}
    overhead = med["cpu_us_per_poll"] - fake_alone
    result = {
        "machine": machine(), "gpus": args.gpus, "polls": args.polls, "repeat": args.repeat, **med,
        "fake_alone_cpu_us_per_poll": fake_alone, "sampler_overhead_cpu_us_per_poll": overhead,
        "sampler_overhead_cpu_us_per_gpu_poll": overhead / args.gpus,
        "core_share_at_1s_interval": med["cpu_us_per_poll"] / 1e6, **scrape,
    }
    m = result["machine"]
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['implementation']} {m['python']}, {m['platform']}")
    print(f"{args.gpus} fake GPUs, {args.polls} polls x {args.repeat} runs (medians)")
    print(f"  CPU per poll, sampler + fake      {med['cpu_us_per_poll']:9.1f} us   "
          f"(process_time cross-check {med['process_us_per_poll']:.1f} us, wall {med['wall_us_per_poll']:.1f} us)")
    print(f"  CPU per poll, fake NVML alone     {fake_alone:9.1f} us   "
          f"({med['nvml_calls_per_poll']:.1f} calls per poll)")
    print(f"  sampler overhead per poll         {overhead:9.1f} us   ({overhead / args.gpus:.1f} us per GPU)")
    print(f"  share of one core at 1 s interval {100 * result['core_share_at_1s_interval']:9.4f} %")
    print(f"  CPU per scrape of the GPU families {scrape['cpu_us_per_scrape']:8.1f} us   "
          f"(collect() {scrape['collect_cpu_us_per_scrape']:.1f} us, the rest prometheus_client's text format; "
          f"{scrape['exposition_series']:.0f} series, {scrape['exposition_bytes']:.0f} bytes)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
