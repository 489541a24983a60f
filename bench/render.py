"""/metrics render time and size at 1, 10 and 100 runs, and with 8 GPUs.

Each run reads the real GRPO log (tests/fixtures/trl/grpo/combined_unbuffered.log, 300 steps, about 400
series of its own), through the same Exporter as `serve`; then the registry that `serve` exposes (the
exporter's families, the process collector and, with --gpus, the GPU families of the sampler over the
fake NVML of tests/fake_nvml.py, polled once) is rendered N times with prometheus_client's
generate_latest, as a scrape does. Reported: the best and median render time, the exposition's size
plain and gzipped (what a Prometheus scrape with Accept-Encoding: gzip moves), samples, and the peak RSS
of this process after the runs were read.

    .venv/bin/python bench/render.py                         # 1, 10, 100 runs; then 1 run + 8 GPUs
    .venv/bin/python bench/render.py --runs 1,10 --repeat 20 --json bench/out/render.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fake_nvml import FakeNvml, h100s  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.process_collector import ProcessCollector  # noqa: E402

from exporter.app import Exporter  # noqa: E402
from exporter.config import Config, LogSpec  # noqa: E402
from exporter.exposition.collector import ExporterCollector  # noqa: E402
from exporter.gpu import GpuCollector, GpuSampler, SamplerConfig  # noqa: E402

LOG = REPO / "tests/fixtures/trl/grpo/combined_unbuffered.log"


def registry(exporter: Exporter, gpu: GpuSampler | None) -> CollectorRegistry:
    """What `serve` registers (exporter/commands/serving.py): the exporter's collector, the GPUs', the process'."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(exporter))
    if gpu is not None:
        reg.register(GpuCollector(gpu))
    ProcessCollector(registry=reg)
    return reg


def measure(runs: int, gpus: int, repeat: int) -> dict[str, object]:
    exporter = Exporter(Config(), [LogSpec(str(LOG), f"grpo-{i:03d}") for i in range(runs)])
    t0 = time.perf_counter()
    exporter.read_to_end()
    read_s = time.perf_counter() - t0
    gpu = None
    if gpus:
        gpu = GpuSampler(FakeNvml(h100s(gpus)), SamplerConfig(), env={})
        gpu.poll_once()
    reg = registry(exporter, gpu)
    times = []
    body = b""
    for _ in range(repeat):
        t = time.perf_counter()
        body = generate_latest(reg)
        times.append(time.perf_counter() - t)
    if gpu is not None:
        gpu.stop()
    text = body.decode()
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    gpu_samples = sum(1 for line in text.splitlines() if line.startswith("posttrain_gpu_"))
    return {
        "runs": runs,
        "gpus": gpus,
        "samples": samples,
        "samples_per_run": round((samples - gpu_samples) / runs),
        "gpu_samples": gpu_samples,
        "bytes": len(body),
        "gzip_bytes": len(gzip.compress(body, 6)),
        "render_ms_best": round(min(times) * 1e3, 2),
        "render_ms_median": round(statistics.median(times) * 1e3, 2),
        "read_s": round(read_s, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="1,10,100", help="comma-separated run counts (default 1,10,100)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the fake NVML for the last row (0: none)")
    p.add_argument("--repeat", type=int, default=10, help="renders per row (default 10)")
    p.add_argument("--json", type=Path, metavar="OUT")
    args = p.parse_args(argv)
    rows = [measure(int(n), 0, args.repeat) for n in args.runs.split(",")]
    if args.gpus:
        rows.append(measure(1, args.gpus, args.repeat))
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown")
    print(f"machine: {cpu}, {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}; "
          f"{args.repeat} renders per row (generate_latest of serve's registry)")
    print("| runs | GPUs | samples | per run | render best (ms) | render median (ms) | size (KiB) | gzip (KiB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['runs']} | {r['gpus']} | {r['samples']:,} | {r['samples_per_run']} | {r['render_ms_best']} | "
              f"{r['render_ms_median']} | {r['bytes'] / 1024:,.1f} | {r['gzip_bytes'] / 1024:,.1f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": cpu, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
