"""docs/metrics.md is generated from the code; it must match, and name every family a real dump emits."""

from __future__ import annotations

from conftest import REPO, TRL, run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.metricdoc import render

DOC = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
GPU_DOC = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")


def test_metrics_doc_is_up_to_date() -> None:
    assert render() == DOC, "docs/metrics.md is stale: run `python scripts/gen_metrics_doc.py`"


def test_every_family_of_a_real_dump_is_documented() -> None:
    for run in ("grpo", "dpo", "sft"):
        text = run_cli("dump", str(TRL / run / "combined.log")).stdout.decode()
        for fam in text_string_to_metric_families(text):
            name = fam.name + ("_total" if fam.type == "counter" else "")
            doc = GPU_DOC if name.startswith("posttrain_gpu_") else DOC
            assert f"`{name}" in doc, f"{name} is not in docs/metrics.md (or docs/gpu.md for GPU families)"
