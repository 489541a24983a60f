"""The alerting rules (rules/), their promtool unit tests (tests/rules/), their conventions and runbooks,
the Alertmanager example (docs/alertmanager.example.yml), and the rules against real TRL runs.

No Prometheus rules linter can be installed here (pint is not on PyPI or in Debian; PyPI's `pint` is a
units library), so the conventions of the monitoring mixins are checked below, rule by rule."""

from __future__ import annotations

import math
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TRL, require_binary, run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.instruments.derived import threshold_series
from exporter.instruments.keymap import INSTRUMENTS
from exporter.instruments.settings import Thresholds

RULES = sorted((REPO / "rules").glob("*.yml"))
UNIT_TESTS = sorted((REPO / "tests" / "rules").glob("*.test.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
AM_EXAMPLE = REPO / "docs" / "alertmanager.example.yml"
METRICS_DOC = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
RUNBOOK_BASE = "https://github.com/posttrain-exporter/posttrain-exporter/blob/main/docs/runbooks.md"

# Families of the GPU sampler (NVML), being added beside this work; the rules use them already.
GPU_METRICS = {"posttrain_gpu_nvml_up", "posttrain_gpu_memory_used_bytes", "posttrain_gpu_memory_total_bytes"}
# Alerts whose value is a 0/1 state or a count of events: their descriptions give the numbers by query.
VALUE_IS_A_FLAG = {"PostTrainDestructiveRegime", "PostTrainDriftingWithoutGain", "PostTrainLossSignFlip",
                   "PostTrainLossDiscontinuity"}
# Groups whose alerts judge a run's training: their descriptions name the run and its step.
TRAINING_GROUPS = {"posttrain.pages", "posttrain.warnings"}
SUB_LABELS = {"bound", "stat", "kind", "component"}


def _groups() -> list[dict]:
    return [g for path in RULES for g in yaml.safe_load(path.read_text())["groups"]]


def _alerts() -> list[tuple[str, dict]]:
    return [(g["name"], r) for g in _groups() for r in g["rules"] if "alert" in r]


def _recorded() -> set[str]:
    return {r["record"] for g in _groups() for r in g["rules"] if "record" in r}


ALERTS = _alerts()
ALERT_NAMES = [r["alert"] for _, r in ALERTS]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=REPO)


# --- promtool ----------------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", *map(str, RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(ALERTS) >= 30


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(path: Path) -> None:
    r = _promtool("test", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        if len(doc["rule_files"]) > 1:
            assert doc.get("group_eval_order"), f"{path.name}: set group_eval_order (promtool's default is random)"
        for group in doc["tests"]:
            for case in group.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert set(ALERT_NAMES) - firing == set(), "alerts without a unit test where they fire"
    assert set(ALERT_NAMES) - quiet == set(), "alerts without a unit test where they stay quiet"
    assert (firing | quiet) - set(ALERT_NAMES) == set(), "unit tests of alerts that do not exist"


# --- the conventions of the monitoring mixins ---------------------------------------------------------


@pytest.mark.parametrize(("group", "rule"), ALERTS, ids=ALERT_NAMES)
def test_alert_conventions(group: str, rule: dict) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"PostTrain(?:[A-Z][a-z0-9]*|[A-Z]{2,}(?=[A-Z][a-z]|$))+", name), f"{name}: CamelCase"
    assert ALERT_NAMES.count(name) == 1, f"{name} is defined twice"
    labels, ann = rule.get("labels", {}), rule.get("annotations", {})
    assert labels.get("severity") in {"critical", "warning"}, f"{name}: severity critical or warning"
    assert (labels["severity"] == "critical") == (group == "posttrain.pages"), f"{name}: pages are the criticals"
    assert {"summary", "description", "runbook_url"} <= set(ann), f"{name}: summary, description, runbook_url"
    assert ann["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}"
    assert "{{" in ann["description"], f"{name}: the description is a template"
    if group in TRAINING_GROUPS:
        assert "$labels.run" in ann["description"] and "posttrain_step" in ann["description"], \
            f"{name}: the description names the run and its step"
        if name not in VALUE_IS_A_FLAG:
            assert "$value" in ann["description"], f"{name}: the description gives the value"
    if group in TRAINING_GROUPS or "posttrain_exporter_" in rule["expr"]:
        assert "run" in ann["summary"], f"{name}: the summary names the run"
    if "for" in rule:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: for"


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def _selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        matchers = dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', m.group(2)))
        out.append((m.group(1), matchers))
    return out


def test_every_metric_in_the_rules_exists() -> None:
    """Names in expressions and in the descriptions' queries: documented in docs/metrics.md, a GPU family,
    a recording rule of rules/, or Prometheus' own `up`."""
    recorded = _recorded()
    unknown = set()
    for g in _groups():
        for r in g["rules"]:
            texts = [_strip_strings(r["expr"]), *r.get("annotations", {}).values()]
            for text in texts:
                for name in re.findall(r"(?<![\w:])((?:posttrain_|run:)[a-zA-Z0-9_:]+)", text):
                    ok = f"`{name}" in METRICS_DOC or name in GPU_METRICS or name in recorded
                    if not ok:
                        unknown.add(f"{r.get('alert') or r.get('record')}: {name}")
    assert not unknown, sorted(unknown)
    assert "up" in {tok for _, r in ALERTS for tok in re.findall(r"\b\w+\b", _strip_strings(r["expr"]))}


def test_selectors_match_the_exporters_instruments_and_thresholds() -> None:
    """instrument="..." and its sub-label (bound, stat, kind, component) as the exporter's key table has
    them; every posttrain_threshold an alert reads is one the exporter exports."""
    exported = set(threshold_series(Thresholds()))
    derived_instruments = {"default"} | {inst for inst, _ in exported}
    for _, rule in ALERTS:
        for metric, m in _selectors(rule["expr"]):
            inst = m.get("instrument")
            if metric == "posttrain_threshold":
                for i in inst.split("|"):
                    assert (i, m["level"]) in exported, f"{rule['alert']}: {i}/{m['level']} is not exported"
            elif metric.startswith(("posttrain_window_", "posttrain_trend", "posttrain_instrument_last_step")):
                assert inst is not None, f"{rule['alert']}: {metric} needs an instrument"
                for i in inst.split("|"):
                    assert i in INSTRUMENTS, f"{rule['alert']}: unknown instrument {i}"
                    for sub in SUB_LABELS & set(m):
                        assert INSTRUMENTS[i].label == sub, f"{rule['alert']}: {i} has no {sub} label"
            elif metric == "posttrain_threshold_breaches_total":
                assert inst in derived_instruments, f"{rule['alert']}: no breach counter for {inst}"


def test_every_alert_has_a_runbook_section_and_every_section_an_alert() -> None:
    text = RUNBOOKS.read_text(encoding="utf-8")
    sections = re.findall(r"^### (\S+)$", text, re.M)
    assert sorted(sections) == sorted(ALERT_NAMES)
    for name in ALERT_NAMES:
        body = text.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**Means.**", "**Check.**", "**Do.**"):
            assert part in body, f"runbook of {name}: {part}"
    # links between sections point at anchors that exist
    for anchor in re.findall(r"\]\(#([a-z0-9-]+)\)", text):
        assert anchor in {n.lower() for n in ALERT_NAMES}, anchor


# --- the Alertmanager example -------------------------------------------------------------------------


def test_alertmanager_example_is_valid() -> None:
    amtool = require_binary("amtool")
    r = subprocess.run([amtool, "check-config", str(AM_EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(("labels", "receiver"), [
    (["severity=critical", "alertname=PostTrainKLCritical", "run=grpo-7b"], "pager"),
    (["severity=warning", "alertname=PostTrainKLWarning", "run=grpo-7b"], "chat"),
    (["severity=warning", "alertname=PostTrainNVMLDown"], "chat"),
])
def test_alertmanager_example_routes_pages_to_the_pager(labels: list[str], receiver: str) -> None:
    amtool = require_binary("amtool")
    r = subprocess.run([amtool, "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *labels],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [receiver]


def test_alertmanager_example_inhibits_the_kl_warning_by_the_kl_page() -> None:
    cfg = yaml.safe_load(AM_EXAMPLE.read_text())
    assert cfg["route"]["group_by"] == ["namespace", "run"]
    kl = [r for r in cfg["inhibit_rules"] if r["source_matchers"] == ['alertname="PostTrainKLCritical"']]
    assert kl and kl[0]["target_matchers"] == ['alertname="PostTrainKLWarning"'] and "run" in kl[0]["equal"]
    # every alert the general rule pairs up (a page and warnings about the same instrument) exists
    by_instrument = defaultdict(set)
    for _, rule in ALERTS:
        if "instrument" in rule.get("labels", {}):
            by_instrument[rule["labels"]["instrument"]].add(rule["labels"]["severity"])
    assert by_instrument["kl"] == {"critical", "warning"}
    assert by_instrument["reward_std"] == {"critical", "warning"}


# --- the rules against real TRL runs --------------------------------------------------------------------


def _dump_series(lines: list[str], run: str, tmp: Path, minutes: int) -> list[dict]:
    """The exporter's real exposition for a log made of `lines`, held for `minutes`, as promtool input."""
    log = tmp / f"{run}.log"
    log.write_text("\n".join(lines) + "\n")
    r = run_cli("dump", str(log), "--run", run)
    assert r.returncode == 0, r.stderr.decode()
    series = []
    for fam in text_string_to_metric_families(r.stdout.decode()):
        for s in fam.samples:
            labels = {**s.labels, "job": "posttrain", "instance": f"{run}:9847"}
            sel = s.name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            if s.name == "posttrain_exporter_last_record_timestamp_seconds":
                values = f"0+60x{minutes}"  # a live trainer: one record a minute
            else:
                v = s.value
                text = "NaN" if math.isnan(v) else ("Inf" if v > 0 else "-Inf") if math.isinf(v) else repr(v)
                values = f"{text}x{minutes}"
            series.append({"series": sel, "values": values})
    series.append({"series": f'up{{job="posttrain", instance="{run}:9847"}}', "values": f"1x{minutes}"})
    return series


def _stdout_records(run: str) -> list[str]:
    return [ln for ln in (TRL / run / "stdout.log").read_text().splitlines() if ln.startswith("{'")]


def test_rules_on_real_trl_runs(tmp_path: Path) -> None:
    """Real exporter output of real TRL runs (tiny models), held for 20 minutes: which alerts fire.

    - grpo, first 100 records: a healthy start (KL < 0.3): no page;
    - grpo, first 150 records: KL reached 1.23 at steps 143-144: the KL page;
    - grpo_saturated, its 300 training records (without the end-of-training summary, so the run is live):
      reward std 0 from about step 60: the reward-std page; KL spiked to 2.6 at step 262: the KL page too;
    - dpo and sft, all their training records: no page.
    Warnings: most GRPO groups tie (frac_reward_zero_std > 0.5) on all three GRPO runs; their entropy
    (about 0.6) is under the seeds' 1.0, which warns on the GRPO runs but not on DPO and SFT (no reward:
    low entropy is a fitted model there).
    """
    grpo, saturated = _stdout_records("grpo"), _stdout_records("grpo_saturated")
    training = {r: [ln for ln in _stdout_records(r) if "train_runtime" not in ln] for r in ("dpo", "sft")}
    cases = {
        "grpo-start": (grpo[:100], []),
        "grpo-kl": (grpo[:150], ["PostTrainKLCritical"]),
        "grpo-saturated": ([ln for ln in saturated if "train_runtime" not in ln],
                           ["PostTrainKLCritical", "PostTrainRewardStdCollapsed"]),
        "dpo": (training["dpo"], []),
        "sft": (training["sft"], []),
    }
    grpo_runs = ("grpo-kl", "grpo-saturated", "grpo-start")
    minutes = 20
    at = f"{minutes - 1}m"
    series, exprs = [], []
    for run, (lines, pages) in cases.items():
        series += _dump_series(lines, run, tmp_path, minutes)
        exprs.append({
            "expr": f'count by (alertname) (ALERTS{{alertstate="firing", severity="critical", run="{run}"}})',
            "eval_time": at,
            "exp_samples": [{"labels": f'{{alertname="{a}"}}', "value": 1} for a in pages],
        })
    for alert in ("PostTrainZeroStdGroups", "PostTrainEntropyCollapse"):
        exprs.append({"expr": f'count by (run) (ALERTS{{alertstate="firing", alertname="{alert}"}})',
                      "eval_time": at,
                      "exp_samples": [{"labels": f'{{run="{run}"}}', "value": 1} for run in grpo_runs]})
    test = {
        "rule_files": [str(p) for p in RULES],
        "evaluation_interval": "1m",
        "group_eval_order": ["posttrain.recording", "posttrain.pages", "posttrain.warnings", "posttrain.exporter"],
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}],
    }
    path = tmp_path / "real.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    r = _promtool("test", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
