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


def test_readme_prometheus_config_is_valid(tmp_path) -> None:
    """The README's prometheus.yml for a setup without Kubernetes passes promtool, with the real rules loaded."""
    import re
    import shutil
    import subprocess

    from conftest import REPO, require_binary

    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "scrape_configs:" in b)
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "rules", rules)
    (tmp_path / "prometheus.yml").write_text(block.replace("/etc/prometheus/posttrain/", f"{rules}/"))
    r = subprocess.run([require_binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 2 rule files found" in r.stdout, r.stdout
