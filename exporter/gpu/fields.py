"""The GPU fields: one table, as dcgm-exporter's default-counters.csv is, of every one-value-per-GPU reading.

A row says which NVML function the sampler calls (and with which arguments), how the raw answer becomes the exported
unit, the GpuReading attribute that carries it, the Prometheus family (name, type, HELP) the collector renders, and
the DCGM field that measures the same thing. From it:

- the sampler's reads (`READS`: one NVML call per distinct (read, function, arguments), its conversions);
- the collector's families (`FIELDS`: name, type, HELP);
- docs/gpu.md's field table (`render_doc_table`, between the markers; `scripts/generate.py --check` fails when the
  committed table differs).

Adding a field is one row here plus its GpuReading attribute (exporter/gpu/sampler.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# nvml.h enum values (ABI-stable), passed as arguments so the sampler does not depend on the module's constants.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


@dataclass(frozen=True)
class GpuField:
    attr: str  # the GpuReading attribute
    family: str  # the Prometheus family (a counter's name without _total)
    kind: str  # "gauge" or "counter"
    help: str  # the family's HELP
    read: str  # the sampler's name of the NVML read (in its log lines; NotSupported is remembered per read)
    call: str  # the NVML function, called with the device handle and `args`
    convert: Callable[[Any], float]  # NVML's answer -> the exported value
    nvml_unit: str  # what NVML answers, for the docs
    dcgm: str  # the DCGM field of the same quantity (dcgm-exporter's DCGM_FI_* series)
    args: tuple[tuple[str, int], ...] = ()  # (nvml.h name, value) of each argument after the handle
    # dcgm-exporter's unit -> the exported one, as PromQL (the recording rules of exporter/gpu/rules.py): the same
    # float operation as `convert`, so that a value read through DCGM equals the one read through NVML
    dcgm_scale: str = ""


def _div(n: float) -> Callable[[Any], float]:
    return lambda v: v / n


FIELDS: tuple[GpuField, ...] = (
    GpuField("utilization_ratio", "posttrain_gpu_utilization_ratio", "gauge",
             "Share of the last sample period (NVML: 1/6 s to 1 s) during which a kernel ran on the GPU.",
             "utilization", "nvmlDeviceGetUtilizationRates", lambda u: u.gpu / 100.0, "percent, `.gpu`",
             "DCGM_FI_DEV_GPU_UTIL", dcgm_scale=" / 100"),
    GpuField("memory_used_bytes", "posttrain_gpu_memory_used_bytes", "gauge", "GPU memory in use (all processes).",
             "memory", "nvmlDeviceGetMemoryInfo", lambda m: float(m.used), "bytes, `.used`", "DCGM_FI_DEV_FB_USED",
             dcgm_scale=" * 1048576"),
    GpuField("memory_total_bytes", "posttrain_gpu_memory_total_bytes", "gauge", "GPU memory installed.",
             "memory", "nvmlDeviceGetMemoryInfo", lambda m: float(m.total), "bytes, `.total`",
             "DCGM_FI_DEV_FB_TOTAL", dcgm_scale=" * 1048576"),
    GpuField("power_watts", "posttrain_gpu_power_watts", "gauge", "Board power draw.",
             "power", "nvmlDeviceGetPowerUsage", _div(1000.0), "milliwatts", "DCGM_FI_DEV_POWER_USAGE"),
    GpuField("power_limit_watts", "posttrain_gpu_power_limit_watts", "gauge", "Power limit the driver enforces.",
             "power_limit", "nvmlDeviceGetEnforcedPowerLimit", _div(1000.0), "milliwatts",
             "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    GpuField("temperature_celsius", "posttrain_gpu_temperature_celsius", "gauge", "GPU die temperature.",
             "temperature", "nvmlDeviceGetTemperature", float, "degrees Celsius", "DCGM_FI_DEV_GPU_TEMP",
             (("NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU),)),
    GpuField("sm_clock_hertz", "posttrain_gpu_sm_clock_hertz", "gauge", "Current SM clock.",
             "sm_clock", "nvmlDeviceGetClockInfo", lambda mhz: mhz * 1e6, "MHz", "DCGM_FI_DEV_SM_CLOCK",
             (("NVML_CLOCK_SM", NVML_CLOCK_SM),), dcgm_scale=" * 1e6"),
    GpuField("energy_joules", "posttrain_gpu_energy_joules", "counter",
             "Energy consumed since the driver was loaded (Volta and later).",
             "energy", "nvmlDeviceGetTotalEnergyConsumption", _div(1000.0), "millijoules",
             "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", dcgm_scale=" / 1000"),
)


# --- plausible values ---------------------------------------------------------------------------------------

# A board draws at most a few kW (a GB200 superchip ~2.7 kW); NVML's "no value" answers (0xFFFFFFFF mW: 4.3 MW)
# and garbage are far above this.
MAX_POWER_WATTS = 10_000.0
# (GpuReading attribute, lowest, highest) of the exported value; None: no bound. A value outside is not a reading
# of the GPU: not exported, counted (posttrain_gpu_nvml_errors_total{kind="out_of_range"}, or "feed_out_of_range").
RANGES: tuple[tuple[str, float | None, float | None], ...] = (
    ("utilization_ratio", 0.0, 1.0),
    ("memory_used_bytes", 0.0, None),
    ("memory_total_bytes", 0.0, None),
    ("power_watts", 0.0, MAX_POWER_WATTS),
    ("power_limit_watts", 0.0, MAX_POWER_WATTS),
    ("sm_clock_hertz", 0.0, None),
    ("energy_joules", 0.0, None),
)


def out_of_range(values: dict[str, float]) -> dict[str, str]:
    """The attributes of `values` that no GPU can have, each with why (for the log line). Memory used above total
    names both: which one is wrong cannot be told, and the memory alert divides one by the other."""
    bad: dict[str, str] = {}
    for attr, low, high in RANGES:
        v = values.get(attr)
        if v is None:
            continue
        if low is not None and v < low:
            bad[attr] = f"{v:g} < {low:g}"
        elif high is not None and v > high:
            bad[attr] = f"{v:g} > {high:g}"
    used, total = values.get("memory_used_bytes"), values.get("memory_total_bytes")
    if used is not None and total is not None and not bad.keys() & {"memory_used_bytes", "memory_total_bytes"} \
            and used > total:
        bad["memory_used_bytes"] = bad["memory_total_bytes"] = f"memory used {used:g} > total {total:g}"
    return bad


@dataclass(frozen=True)
class Read:
    """One NVML call per poll and GPU, and the GpuReading attributes made from its answer."""

    read: str
    call: str
    args: tuple[int, ...]
    outputs: tuple[tuple[str, Callable[[Any], float]], ...]  # (attribute, conversion)


def _reads(fields: tuple[GpuField, ...]) -> tuple[Read, ...]:
    """The calls in the table's order, fields of one call (memory used and total) sharing it."""
    calls: dict[tuple[str, str, tuple[int, ...]], list[tuple[str, Callable[[Any], float]]]] = {}
    for f in fields:
        calls.setdefault((f.read, f.call, tuple(v for _, v in f.args)), []).append((f.attr, f.convert))
    return tuple(Read(r, c, a, tuple(outs)) for (r, c, a), outs in calls.items())


READS = _reads(FIELDS)


# --- docs/gpu.md ----------------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpu.md"
BEGIN = "<!-- BEGIN generated from exporter/gpu/fields.py (python scripts/generate.py) -->"
END = "<!-- END generated -->"


def render_doc_table() -> str:
    """The field table of docs/gpu.md, one row per field, from FIELDS."""
    rows = ["| metric | type | meaning | NVML call | NVML answers | DCGM field |",
            "| --- | --- | --- | --- | --- | --- |"]
    for f in FIELDS:
        name = f"{f.family}_total" if f.kind == "counter" else f.family
        args = "".join(f", {a}" for a, _ in f.args)
        rows.append(f"| `{name}` | {f.kind} | {f.help} | `{f.call}(handle{args})` | {f.nvml_unit} | `{f.dcgm}` |")
    return "\n".join(rows) + "\n"


def render_doc(text: str) -> str:
    """`text` (docs/gpu.md) with the table between the markers rendered anew."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"docs/gpu.md has no {BEGIN!r} ... {END!r} markers")
    return pattern.sub(lambda _m: f"{BEGIN}\n{render_doc_table()}{END}", text, count=1)
