"""The Grafana boards in grafana/: generated and up to date, structurally valid for Grafana 10+, every metric they
query documented, and every query run against a real Prometheus scraping the exporter on the real TRL fixtures:
each returns data for the runs its board is for (PPO has no fixture and GPU no GPU here: their queries must parse,
and NVML's own health must answer)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
import yaml
from conftest import REPO, TRL, require_binary

SCRIPTS = REPO / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(SCRIPTS))
gen = _load("gen_dashboards")
preview = _load("preview_dashboards")

BOARDS = {name: json.loads((REPO / "grafana" / f"{name}.json").read_text()) for name in gen.BOARDS}
FIXTURE_RUNS = {"grpo": ["grpo", "grpo_saturated"], "dpo": ["dpo"], "sft": ["sft"]}
PANEL_TYPES = {"timeseries", "stat", "state-timeline", "text", "row"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "inf", "nan"}


def targets(board: dict) -> list[tuple[dict, dict]]:
    return [(p, tg) for p in preview.all_panels(board) for tg in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not functions, keywords, labels or durations)."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)           # strings
    s = re.sub(r"\{[^}]*\}", " ", s)                       # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                      # range durations
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set(re.findall(r"(?<![\w:$])([a-zA-Z_:][\w:]*)\b(?!\s*\()", s))
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def documented() -> set[str]:
    text = (REPO / "docs" / "metrics.md").read_text() + (REPO / "docs" / "gpu.md").read_text()
    names = set(re.findall(r"`(posttrain_[a-z0-9_]+)", text))
    rules = yaml.safe_load((REPO / "rules" / "posttrain.recording.yml").read_text())
    names |= {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    return names | {"ALERTS"}


# --- static checks -------------------------------------------------------------------------------------------


def test_generated_files_are_up_to_date() -> None:
    for name, content in gen.render().items():
        path = REPO / "grafana" / name
        assert path.exists() and path.read_text() == content, \
            f"grafana/{name} is out of date: run python scripts/gen_dashboards.py and commit grafana/"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_structure(name: str) -> None:
    board = BOARDS[name]
    assert board["schemaVersion"] in (38, 39)
    assert board["uid"] == f"posttrain-{name}" and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    run = variables["run"]
    assert run["type"] == "query" and run["multi"] is True
    assert run["query"]["query"] == "label_values(posttrain_step, run)"
    assert run["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    alerts = [a for a in board["annotations"]["list"] if a.get("name") == "Firing alerts"]
    assert alerts and alerts[0]["expr"] == 'ALERTS{alertstate="firing", run=~"$run"}'
    assert alerts[0]["datasource"]["uid"] == "${datasource}"

    panels = preview.all_panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        where = f"{name}: panel {p.get('id')} {p.get('title')!r}"
        assert isinstance(p["id"], int) and p["type"] in PANEL_TYPES, where
        g = p["gridPos"]
        assert set(g) == {"x", "y", "w", "h"} and g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, where
        if p["type"] in ("row", "text"):
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert p.get("description"), f"{where}: says what healthy and pathological look like"
        assert p["targets"], where
        refs = [tg["refId"] for tg in p["targets"]]
        assert len(refs) == len(set(refs)), where
        for tg in p["targets"]:
            assert tg["expr"] and tg["refId"] and tg["datasource"]["uid"] == "${datasource}", where
    # panels of an expanded row must not overlap
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{name}: {p['title']!r} overlaps another panel"
                cells.add((x, y))


def test_grpo_board_follows_the_seeds() -> None:
    panels = {p["title"]: p for p in preview.all_panels(BOARDS["grpo"])}
    rows = [p["title"] for p in BOARDS["grpo"]["panels"] if p["type"] == "row"]
    assert [r.split(":")[0] for r in rows] == ["Run state", "Primary", "Secondary", "Tertiary"]
    assert "loss is not a progress metric" in panels["Loss (discontinuities only)"]["description"].lower()
    kl = " ".join(tg["expr"] for tg in panels["KL divergence"]["targets"])
    assert 'posttrain_threshold{instrument="kl"' in kl
    assert panels["KL-versus-reward regime"]["type"] == "state-timeline"
    assert "posttrain_reward_peak_step" in panels["Best step (reward peak)"]["targets"][0]["expr"]
    for derived in ("posttrain_reward_std_headroom", "posttrain_clip_asymmetry", "posttrain_entropy_acceleration",
                    "posttrain_completion_length_baseline_ratio", 'posttrain_trend{instrument="reward"'):
        assert any(derived in tg["expr"] for _, tg in targets(BOARDS["grpo"])), derived


def test_every_metric_queried_is_documented() -> None:
    known = documented()
    for name, board in BOARDS.items():
        exprs = [tg["expr"] for _, tg in targets(board)] + [a["expr"] for a in board["annotations"]["list"]
                                                             if "expr" in a]
        for expr in exprs:
            unknown = metric_names(expr) - known
            assert not unknown, f"{name}: {sorted(unknown)} not in docs/metrics.md, docs/gpu.md or rules/: {expr}"


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (run) (a_b{x="y or z"} * 2 or on (instance) c) and increase(d_total[5m])') \
        == {"a_b", "c", "d_total"}


# --- against a real Prometheus ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    prometheus = require_binary("prometheus")
    logs = {run: TRL / run / "combined.log" for runs in FIXTURE_RUNS.values() for run in runs}
    with preview.Stack(tmp_path_factory.mktemp("dashboards"), logs, scrape="1s", prometheus=prometheus) as s:
        # every fixture read to its end, and at least three scrapes of it (increase() needs two)
        s.wait("exporter scraped", lambda: len(s.query("posttrain_run_finished == 1")) == len(logs), 30)
        s.wait("three scrapes", lambda: s.query("count_over_time(posttrain_step[1m]) >= 3"), 30)
        yield s


def _check(stack, board_name: str, runs: list[str], need_data: bool) -> None:
    board = BOARDS[board_name]
    empty_panels, empty_targets = [], []
    exprs = [(p, tg) for p, tg in targets(board)]
    for p, tg in exprs:
        result = stack.query(preview.substitute(tg["expr"], runs))   # raises on a parse error
        if not result:
            key = (board["uid"], p["title"], tg["refId"])
            if key not in gen.OPTIONAL:
                empty_targets.append(f"{p['title']!r} {tg['refId']}: {tg['expr']}")
    for p in preview.all_panels(board):
        if p.get("targets") and not any(stack.query(preview.substitute(tg["expr"], runs)) for tg in p["targets"]):
            empty_panels.append(p["title"])
    for a in board["annotations"]["list"]:
        if "expr" in a:
            stack.query(preview.substitute(a["expr"], runs))
    if need_data:
        assert not empty_panels, f"{board_name} on {runs}: panels without data: {empty_panels}"
        assert not empty_targets, f"{board_name} on {runs}: queries without data:\n" + "\n".join(empty_targets)


@pytest.mark.parametrize("board,runs", [("grpo", ["grpo"]), ("grpo", ["grpo_saturated"]), ("dpo", ["dpo"]),
                                        ("sft", ["sft"])])
def test_queries_return_data_on_the_fixtures(stack, board: str, runs: list[str]) -> None:
    _check(stack, board, runs, need_data=True)


def test_ppo_queries_parse(stack) -> None:
    _check(stack, "ppo", ["ppo"], need_data=False)


def test_gpu_queries_parse_and_nvml_health_answers(stack) -> None:
    _check(stack, "gpu", ["grpo"], need_data=False)
    nvml = next(p for p in preview.all_panels(BOARDS["gpu"]) if p["title"] == "NVML up")
    assert stack.query(preview.substitute(nvml["targets"][0]["expr"], ["grpo", "dpo"])), \
        "posttrain_gpu_nvml_up must answer (0 without a GPU) for the exporter serving the runs"


def test_optional_queries_are_real() -> None:
    keys = {(b["uid"], p["title"], tg["refId"]) for b in BOARDS.values() for p, tg in targets(b)}
    assert set(gen.OPTIONAL) <= keys, "OPTIONAL names a query that no longer exists"
