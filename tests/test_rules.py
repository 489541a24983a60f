"""The alerting rules (rules/, generated from the detector table), their promtool unit tests (tests/rules/ and
one firing and one quiet case per detector alert built here), their conventions and runbooks, and the
Alertmanager example (docs/alertmanager.example.yml). The rules on real runs: tests/test_detection.py.

No Prometheus rules linter can be installed here (pint is not on PyPI or in Debian; PyPI's `pint` is a
units library), so the conventions of the monitoring mixins are checked below, rule by rule."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_binary

from exporter import __version__
from exporter.detectors.catalog import BY_NAME, DETECTORS
from exporter.instruments.derived import threshold_series
from exporter.instruments.keymap import INSTRUMENTS
from exporter.instruments.settings import Thresholds

RULES = sorted((REPO / "rules").glob("*.yml"))
UNIT_TESTS = sorted((REPO / "tests" / "rules").glob("*.test.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
AM_EXAMPLE = REPO / "docs" / "alertmanager.example.yml"
METRICS_DOC = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
# This version's runbooks (exporter/buildinfo.py): the unit tests in tests/rules/ write it as ${RUNBOOK_BASE}.
RUNBOOK_BASE = f"https://github.com/posttrain-exporter/posttrain-exporter/blob/v{__version__}/docs/runbooks.md"

# Families of the GPU sampler (NVML), being added beside this work; the rules use them already.
GPU_METRICS = {"posttrain_gpu_nvml_up", "posttrain_gpu_memory_used_bytes", "posttrain_gpu_memory_total_bytes"}
GPU_METRICS |= {"posttrain_gpu_expected"}
GPU_METRICS |= {"posttrain_gpu_source_configured", "posttrain_gpu_training_expected"}  # exporter/gpu/sources.py
DETECTOR_ALERTS = {d.alert: d for d in DETECTORS}
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
    # the exporter's own alerts: 6, and PostTrainGPUDataMissing
    assert set(DETECTOR_ALERTS) <= set(ALERT_NAMES) and len(ALERT_NAMES) == len(DETECTORS) + 7


def test_generated_rules_are_up_to_date() -> None:
    r = subprocess.run([sys.executable, "scripts/gen_rules.py", "--check"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_every_detector_alert_fires_on_its_detector_and_on_nothing_else(tmp_path: Path) -> None:
    """Each detector alert, fed its own detector active at 2m: fires then with its labels, and is quiet before;
    every other detector active at the same time raises only its own alert; a finished run raises nothing."""
    inst = 'job="posttrain", instance="t:9847"'
    series, cases = [], []
    for i, d in enumerate(DETECTORS):
        run = f"r{i}"
        sub = ', component="c"' if isinstance(d.input, str) else ""
        for name in BY_NAME:
            if name == d.name:
                active, onsets = "0 0 1 1 1", "0 0 1 1 1"
            else:
                active, onsets = "0x4", "0x4"
            lab = f'detector="{name}", run="{run}", {inst}{sub}'
            series.append({"series": f'posttrain_detector_active{{{lab}, severity="{BY_NAME[name].severity}"}}',
                           "values": active})
            series.append({"series": f"posttrain_detector_onsets_total{{{lab}}}", "values": onsets})
        series.append({"series": f'posttrain_run_finished{{run="{run}", {inst}}}', "values": "0x4"})
        labels = {"severity": d.severity, "instrument": d.instrument, "detector": d.name, "run": run,
                  "job": "posttrain", "instance": "t:9847", **({"component": "c"} if sub else {})}
        cases.append({"expr": f'ALERTS{{alertstate="firing", run="{run}"}}', "eval_time": "3m",
                      "exp_samples": [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in
                                                                 {"__name__": "ALERTS", "alertname": d.alert,
                                                                  "alertstate": "firing", **labels}.items()) + "}",
                                       "value": 1}]})
        cases.append({"expr": f'ALERTS{{run="{run}"}}', "eval_time": "1m", "exp_samples": []})
    series.append({"series": f'posttrain_detector_active{{detector="kl_critical", severity="critical", run="done", '
                             f'{inst}}}', "values": "1x4"})
    series.append({"series": f'posttrain_detector_onsets_total{{detector="kl_critical", run="done", {inst}}}',
                   "values": "0 1x3"})
    series.append({"series": f'posttrain_run_finished{{run="done", {inst}}}', "values": "1x4"})
    cases.append({"expr": 'ALERTS{run="done"}', "eval_time": "3m", "exp_samples": []})
    path = tmp_path / "each.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(p) for p in RULES], "evaluation_interval": "1m",
                                    "tests": [{"interval": "1m", "input_series": series,
                                               "promql_expr_test": cases}]}, sort_keys=False))
    r = _promtool("test", "rules", str(path))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr


def test_every_detector_has_a_distinct_alert_and_a_known_input() -> None:
    assert len(DETECTOR_ALERTS) == len(DETECTORS)
    for d in DETECTORS:
        inst = d.input if isinstance(d.input, str) else d.input[0]
        assert inst in INSTRUMENTS or inst in ("clip_total", "nonfinite"), d.name
        assert d.severity in ("critical", "warning") and d.required >= 1


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(path: Path) -> None:
    # a copy beside the original (its rule_files are relative) with this version's runbook links filled in
    filled = path.with_name(f".{path.stem}.{os.getpid()}.yml")
    filled.write_text(path.read_text(encoding="utf-8").replace("${RUNBOOK_BASE}", RUNBOOK_BASE), encoding="utf-8")
    try:
        r = _promtool("test", "rules", str(filled))
    finally:
        filled.unlink()
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    """The exporter's own alerts in tests/rules/; the detector alerts here, each with its detector."""
    firing: set[str] = set(DETECTOR_ALERTS)
    quiet: set[str] = set(DETECTOR_ALERTS)
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


def test_an_alert_that_says_to_keep_a_checkpoint_names_its_step() -> None:
    """The destructive and peaked-and-fell pages tell the on-call engineer which checkpoint to keep: the judgment's
    step (posttrain_checkpoint_keep_step) of the alert's own run and instance, as it is sent."""
    rules = {r["alert"]: r for _, r in ALERTS}
    for name in ("PostTrainDestructiveRegime", "PostTrainRewardPeakedAndFell"):
        desc = rules[name]["annotations"]["description"]
        assert "(posttrain_checkpoint_keep_step, now step {{ with printf " in desc, name
        assert 'posttrain_checkpoint_keep_step{run=%q,instance=%q}" $labels.run $labels.instance | query' in \
            desc.replace("\\", ""), name


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
        if name in DETECTOR_ALERTS:
            assert "posttrain_detector_since_step" in ann["description"], f"{name}: the description says since when"
        else:
            assert "$value" in ann["description"], f"{name}: the description gives the value"
    if group in TRAINING_GROUPS or "posttrain_exporter_" in rule["expr"]:
        assert "run" in ann["summary"], f"{name}: the summary names the run"
    if "for" in rule:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: for"
    if name in DETECTOR_ALERTS:  # persistence is counted in steps by the exporter: no wall-clock wait to fire
        assert "for" not in rule and rule["keep_firing_for"] == "2m", name
        assert f'detector="{DETECTOR_ALERTS[name].name}"' in rule["expr"], name


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
            elif metric.startswith("posttrain_detector_"):
                assert m.get("detector") in BY_NAME, f"{rule['alert']}: unknown detector {m.get('detector')}"
        for text in rule["annotations"].values():  # thresholds quoted in the words exist
            for inst_level in re.findall(r'posttrain_threshold\{instrument=\\"(\w+)\\",level=\\"(\w+)\\"', text):
                assert inst_level in exported, f"{rule['alert']}: quotes {inst_level}, not exported"


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
