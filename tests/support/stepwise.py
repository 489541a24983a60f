"""The exporter's detector state after every logged step of a real log, as promtool input series.

The fast, deterministic variant of the detection benchmark: one logged step stands for one minute, the
exporter is scraped after each step, and promtool evaluates the real rules on what it exported."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.exposition.collector import ExporterCollector
from exporter.parsers.record import Record, RecordKind

# What the alert rules read (and their descriptions quote).
FAMILIES = ("posttrain_step", "posttrain_run_finished", "posttrain_detector_", "posttrain_threshold")


def records_of(log: Path) -> list[Record]:
    """Every record the exporter reads from a log, with the step it gives it, in order."""
    ex = Exporter(Config(), [LogSpec(str(log), "r")])
    got: list[Record] = []
    ex.runs["r"].ingest = got.append  # type: ignore[method-assign]
    ex.read_to_end()
    return got


def scrapes(log: Path, run: str, instance: str) -> list[dict[str, float]]:
    """The exposition (the families above) after each logged step (its last training record: a step whose
    completions were printed has a second record, their diversity), as {series selector: value}."""
    ex = Exporter(Config(), [])
    state = ex.run_state(run)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(ex))
    out = []
    recs = records_of(log)
    for i, rec in enumerate(recs):
        state.ingest(rec)
        if rec.kind is not RecordKind.TRAIN or _next_train_step(recs, i) == rec.step:
            continue
        samples = {}
        for fam in text_string_to_metric_families(generate_latest(registry).decode()):
            for s in fam.samples:
                if s.name.startswith(FAMILIES):
                    labels = {**s.labels, "job": "posttrain", "instance": instance}
                    sel = s.name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                    samples[sel] = s.value
        out.append(samples)
    return out


def _next_train_step(recs: list[Record], i: int) -> int | None:
    return next((r.step for r in recs[i + 1 :] if r.kind is RecordKind.TRAIN), None)


def logged_steps_of(recs: list[Record]) -> list[int]:
    """The step of each scrape of `scrapes`: training records' steps, a step's records counted once."""
    steps = [r.step for r in recs if r.kind is RecordKind.TRAIN]
    return [s for i, s in enumerate(steps) if i + 1 == len(steps) or steps[i + 1] != s]


def input_series(steps: list[dict[str, float]]) -> list[dict[str, str]]:
    """promtool input_series: one value per minute, `_` before a series first appears."""
    selectors = sorted({sel for st in steps for sel in st})
    series = []
    for sel in selectors:
        values = []
        for st in steps:
            v = st.get(sel)
            values.append("_" if v is None else "NaN" if math.isnan(v) else repr(float(v)))
        series.append({"series": sel, "values": " ".join(values)})
    return series
