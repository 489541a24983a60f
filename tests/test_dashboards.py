"""The Grafana boards in grafana/: generated and up to date, structurally valid for Grafana 10+, loadable by the
grafana-foundation-sdk's dashboard models (every panel's options and field config are what its types accept),
every metric they query documented, and every query run against a real Prometheus scraping the exporter on the
real TRL fixtures: each returns data for the runs its board is for (PPO has no fixture and GPU no GPU here: their
queries must parse, and NVML's own health must answer). The step-aligned trend panels are checked as Grafana
draws them: the fixtures replayed record by record, both queries of each panel over the replay, joined by time
and run as the panel's transformations do, must give the steps the trainer logged, each with its value."""

from __future__ import annotations

import enum
import itertools
import json
import math
import re
import subprocess
import sys
import threading
import time
import types
import typing

import pytest
import yaml
from conftest import REPO, TRL, require_binary, trainer_state_values
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import common, dashboard, trend
from support import boards as preview

from exporter import dashboards as gen
from exporter.dashboards.builders import STEP_FIELD, STEP_ROW
from exporter.instruments.keymap import KeyMap

BOARDS = {name: json.loads((REPO / "grafana" / f"{name}.json").read_text()) for name in gen.BOARDS}
FIXTURE_RUNS = {"grpo": ["grpo", "grpo_saturated"], "dpo": ["dpo"], "sft": ["sft"]}
PANEL_TYPES = {"timeseries", "stat", "state-timeline", "trend", "text", "row"}
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
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "cluster", "namespace", "run"]
    for var, query in (("cluster", "label_values(posttrain_step, cluster)"),
                       ("namespace", 'label_values(posttrain_step{cluster=~"$cluster"}, namespace)'),
                       ("run", 'label_values(posttrain_step{cluster=~"$cluster", namespace=~"$namespace"}, run)')):
        v = variables[var]
        assert v["type"] == "query" and v["multi"] is True and v["includeAll"] is True, var
        assert v["allValue"] == ".*", f"{var}: All must match series without the label too"
        assert v["query"]["query"] == v["definition"] == query
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    alerts = [a for a in board["annotations"]["list"] if a.get("name") == "Firing alerts"]
    assert alerts and alerts[0]["expr"] == \
        'ALERTS{alertstate="firing", cluster=~"$cluster", namespace=~"$namespace", run=~"$run"}'
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
    assert [r.split(":")[0] for r in rows] == ["Run state", "Primary", "Secondary", "Tertiary", "By step"]
    assert "loss is not a progress metric" in panels["Loss (discontinuities only)"]["description"].lower()
    kl = " ".join(tg["expr"] for tg in panels["KL divergence"]["targets"])
    assert 'posttrain_threshold{instrument="kl"' in kl
    assert panels["KL-versus-reward regime"]["type"] == "state-timeline"
    assert "posttrain_reward_peak_step" in panels["Reward peak step"]["targets"][0]["expr"]
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


def test_runs_are_keyed_by_cluster_namespace_and_run() -> None:
    """Two teams may give a run the same name: every aggregation or join that keeps `run` (or an exporter's
    `instance`) keeps cluster and namespace too, and every query that selects runs selects namespace and cluster."""
    for name, board in BOARDS.items():
        exprs = [(p["title"], tg["expr"]) for p, tg in targets(board)]
        exprs += [(a["name"], a["expr"]) for a in board["annotations"]["list"] if "expr" in a]
        for title, expr in exprs:
            for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
                labels = {x.strip() for x in clause.split(",")}
                if labels & {"run", "instance"}:
                    assert {"cluster", "namespace"} <= labels, f"{name} {title!r}: ({clause})"
            n = expr.count('run=~"$run"')
            assert expr.count('namespace=~"$namespace"') == expr.count('cluster=~"$cluster"') == n, \
                f"{name} {title!r}: {expr}"
            assert "$run" not in expr.replace('run=~"$run"', ""), f"{name} {title!r}: {expr}"


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (run) (a_b{x="y or z"} * 2 or on (instance) c) and increase(d_total[5m])') \
        == {"a_b", "c", "d_total"}


# --- grafana-foundation-sdk: the dashboard models of Grafana 10.4 -------------------------------------------------

register_default_plugins()

# What the SDK's models do not carry at the board level, though Grafana reads it: the Prometheus data source's own
# annotation fields (its legacy annotation editor's format, which Grafana 10/11 still reads) and the display text
# of a query variable that Grafana's variable editor writes. Everything else must survive a round trip.
SDK_UNMODELLED = {
    ("annotations", "step"), ("annotations", "useValueForTime"), ("annotations", "titleFormat"),
    ("annotations", "textFormat"), ("annotations", "tagKeys"), ("templating", "definition"),
}


def lost_in_round_trip(original: object, back: object, path: str = "") -> list[str]:
    """Keys the SDK dropped or values it changed on from_json -> to_json (an unknown option is dropped)."""
    if isinstance(original, dict):
        if not isinstance(back, dict):
            return [f"{path}: became {type(back).__name__}"]
        return [problem for k, v in original.items()
                for problem in (lost_in_round_trip(v, back[k], f"{path}.{k}") if k in back else [f"{path}.{k}"])]
    if isinstance(original, list):
        if not isinstance(back, list) or len(back) != len(original):
            return [f"{path}: list changed"]
        return [problem for i, (a, b) in enumerate(zip(original, back, strict=True))
                for problem in lost_in_round_trip(a, b, f"{path}[{i}]")]
    return [] if original == back else [f"{path}: {original!r} -> {back!r}"]


def round_trip(model: object) -> object:
    return json.loads(JSONEncoder().encode(model))


def _is_model(value: object) -> bool:
    return type(value).__module__.startswith("grafana_foundation_sdk.") and not isinstance(value, enum.Enum)


def conformance(value: object, hint: object, path: str) -> list[str]:
    """Where a loaded value is not of the type the SDK's model declares (from_json itself checks nothing)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (typing.Any, object):
        return model_conformance(value, path) if _is_model(value) else []
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        tries = [conformance(value, a, path) for a in args if a is not type(None)]
        return [] if any(not t for t in tries) else tries[0]
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        return [e for i, v in enumerate(value) for e in conformance(v, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        return [e for k, v in value.items() for e in conformance(v, args[1], f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = {m.value for m in hint}
        return [] if value in allowed else [f"{path}: {value!r} not a {hint.__name__} ({sorted(allowed)})"]
    if hint in (int, float):
        ok = isinstance(value, int | float if hint is float else int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {value!r} is not {hint.__name__}"]
    if isinstance(hint, type) and isinstance(value, dict) and hasattr(hint, "from_json"):
        return model_conformance(hint.from_json(value), path)  # a plain object the SDK keeps unparsed
    if isinstance(hint, type) and not isinstance(value, hint):
        return [f"{path}: {type(value).__name__}, not {hint.__name__}"]
    return model_conformance(value, path) if _is_model(value) else []


def model_conformance(model: object, path: str) -> list[str]:
    hints = typing.get_type_hints(type(model))
    return [e for name, hint in hints.items() for e in conformance(getattr(model, name), hint, f"{path}.{name}")]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_boards_load_as_sdk_dashboards(name: str) -> None:
    board = BOARDS[name]
    model = dashboard.Dashboard.from_json(board)
    assert model.uid == board["uid"] and len(model.panels) == len(board["panels"])
    lost = lost_in_round_trip(board, round_trip(model))
    unexpected = [p for p in lost if (p.split(".")[1], p.split(".")[-1]) not in SDK_UNMODELLED]
    assert not unexpected, f"{name}: the SDK's Dashboard model drops or changes {unexpected}"
    errors = [e for e in model_conformance(model, name) if ".panels[" not in e]  # panels: the test below
    assert not errors, errors


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panel_is_what_the_sdk_models_accept(name: str) -> None:
    for p in preview.all_panels(BOARDS[name]):
        where = f"{name}: {p['title']!r}"
        if p["type"] == "row":
            model = dashboard.RowPanel.from_json({**p, "panels": []})
            original = {**p, "panels": []}
        else:
            assert cogruntime.panelcfg_config(p["type"]) is not None, f"{where}: no SDK model for {p['type']}"
            model, original = dashboard.Panel.from_json(p), p
        lost = lost_in_round_trip(original, round_trip(model))
        assert not lost, f"{where}: not in the SDK's {p['type']} models: {lost}"
        errors = model_conformance(model, where)
        assert not errors, errors


def test_step_panels_are_sdk_trend_panels() -> None:
    panels = [p for b in BOARDS.values() for p in preview.all_panels(b) if p["type"] == "trend"]
    assert len(panels) == 14
    for p in panels:
        model = dashboard.Panel.from_json(p)
        assert isinstance(model.options, trend.Options) and model.options.x_field == STEP_FIELD
        assert isinstance(model.field_config.defaults.custom, common.GraphFieldConfig)
        assert model.field_config.defaults.custom.span_nulls is True, "a run without a value at a step: a gap"
        assert [tr.id_val for tr in map(dashboard.DataTransformerConfig.from_json, p["transformations"])] \
            == ["merge", "groupingToMatrix", "organize", "convertFieldType", "sortBy"]


# --- the step-aligned rows --------------------------------------------------------------------------------------

STEP_INSTRUMENTS = {
    "grpo": {("reward_std", None), ("reward", None), ("kl", None), ("entropy", None), ("completion_length", "mean")},
    "ppo": {("reward", None), ("kl", None), ("clip_fraction", None)},
    "dpo": {("dpo_reward", "chosen"), ("dpo_reward", "rejected"), ("dpo_reward", "margin"), ("dpo_accuracy", None)},
    "sft": {("loss", None), ("grad_norm", None)},
}
_LAST_STEP = re.compile(r'posttrain_instrument_last_step\{instrument="(\w+)"(?:, \w+="(\w+)")?')


def step_instrument(panel: dict) -> tuple[str, str | None]:
    """(instrument, sub-label value) of a step-aligned panel, from its step query."""
    m = _LAST_STEP.search(panel["targets"][1]["expr"])
    assert m, panel["targets"][1]["expr"]
    return m.group(1), m.group(2)


def step_panels(board: dict) -> list[dict]:
    return [p for p in preview.all_panels(board) if p["type"] == "trend"]


@pytest.mark.parametrize("name", sorted(STEP_INSTRUMENTS))
def test_step_row_holds_the_primary_instruments(name: str) -> None:
    board = BOARDS[name]
    rows = [p for p in board["panels"] if p["type"] == "row" and p["title"] == STEP_ROW]
    assert len(rows) == 1 and rows[0]["collapsed"] and rows[0]["panels"] == step_panels(board)
    assert {step_instrument(p) for p in step_panels(board)} == STEP_INSTRUMENTS[name]
    for p in step_panels(board):
        value, step = p["targets"]
        assert (value["refId"], step["refId"]) == ("A", "B")
        assert value["format"] == step["format"] == "table" and value["range"] and step["range"]
        matrix = next(tr["options"] for tr in p["transformations"] if tr["id"] == "groupingToMatrix")
        assert (matrix["valueField"], matrix["rowField"], matrix["columnField"]) == ("Value #A", "Value #B", "series")
        for q in (value, step):  # a column per run, named by its namespace (and cluster) where the series have one
            assert q["expr"].startswith("label_replace(label_join(") and \
                q["expr"].endswith('"series", "/", "cluster", "namespace", "run"), "series", "$1", "series", "/*(.*)")')
        assert "\nand on (cluster, namespace, run) " in value["expr"] \
            and "\nand on (cluster, namespace, run) " in step["expr"], \
            "each query keeps only the times where the other exists, so no row lacks a step or a value"


def test_grafana_transformations_emulated() -> None:
    """The join on a hand-made answer: two runs, a step seen at two scrapes, a run missing at a step."""
    def series(run: str, points: list[tuple[float, float]]) -> dict:
        return {"metric": {"run": run, "series": run}, "values": [[t, str(v)] for t, v in points]}

    answers = {"A": [series("a", [(1, 0.5), (2, 0.5), (3, 0.7)]), series("b", [(10, 0.1), (11, 0.2)])],
               "B": [series("a", [(1, 4), (2, 4), (3, 8)]), series("b", [(10, 2), (11, 8)])]}
    panel = step_panels(BOARDS["grpo"])[0]
    frames = preview.transform(preview.prometheus_tables(answers), panel["transformations"])
    assert frames == [{"step": [2.0, 4.0, 8.0], "a": [None, 0.5, 0.7], "b": [0.1, None, 0.2]}]
    assert preview.trend_series(panel, answers) == {"a": [(4.0, 0.5), (8.0, 0.7)], "b": [(2.0, 0.1), (8.0, 0.2)]}


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


@pytest.mark.parametrize("name", ["grpo", "ppo", "dpo", "sft"])
def test_every_training_board_leads_with_the_judgment(name: str) -> None:
    """What to do next comes first: the judgment's three panels open the board's first row."""
    titles = [p["title"] for p in preview.all_panels(BOARDS[name]) if p["type"] != "row"]
    assert titles[:3] == ["What to do next", "Learning its task", "Checkpoint to keep"], titles[:5]


def test_the_judgment_panels_show_what_the_exporter_judged(stack) -> None:
    """The demo run (fixture `grpo`) is judged 'stop', not learning its task, with a checkpoint to keep: the
    board's numbered recommendation maps to that text, and its learning and checkpoint panels read it."""
    from exporter.report.live import judgment_of

    panels = {p["title"]: p for p in preview.all_panels(BOARDS["grpo"])}
    expr = panels["What to do next"]["targets"][0]["expr"]
    (got,) = stack.query(preview.substitute(expr, ["grpo"]))
    shown = panels["What to do next"]["fieldConfig"]["defaults"]["mappings"][0]["options"][got["value"][1]]["text"]
    assert shown.startswith("stop:"), shown
    (learning,) = stack.query(preview.substitute(panels["Learning its task"]["targets"][0]["expr"], ["grpo"]))
    assert learning["value"][1] == "0"
    (keep,) = stack.query(preview.substitute(panels["Checkpoint to keep"]["targets"][0]["expr"], ["grpo"]))
    ex = _exporter_of(TRL / "grpo" / "combined.log")
    assert float(keep["value"][1]) == judgment_of(ex.runs["grpo"]).keep.best_step


def _exporter_of(log):
    from exporter.app import Exporter
    from exporter.config import Config, LogSpec

    ex = Exporter(Config(), [LogSpec(str(log), "grpo")])
    ex.read_to_end()
    return ex


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


# --- the step-aligned panels over a replay ----------------------------------------------------------------------

REPLAY_RATE = 40.0  # records per second; with a scrape every 200 ms, a point every ~8 logged steps
STEP_RUNS = [("grpo", ["grpo", "grpo_saturated"]), ("dpo", ["dpo"]), ("sft", ["sft"])]
MIN_POINTS = 10  # distinct logged steps each run must show on each panel (about 25 to 40 here)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The fixtures appended record by record to logs the exporter follows, scraped every 200 ms: Prometheus holds
    each run's history, as in a live run. Yields (stack, start, end) of the replay."""
    prometheus = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("by_step")
    paths = {run: tmp / f"{run}.log" for _, runs in STEP_RUNS for run in runs}
    for path in paths.values():
        path.touch()
    with preview.Stack(tmp, paths, scrape="200ms", prometheus=prometheus) as s:
        s.wait("exporter scraped", lambda: s.query("up == 1"), 30)
        start = time.time()
        writer = threading.Thread(target=preview.replay, args=(paths, REPLAY_RATE))
        writer.start()
        writer.join()
        s.wait("every run read to its end", lambda: len(s.query("posttrain_run_finished == 1")) == len(paths), 30)
        time.sleep(1.0)  # a few scrapes after the last record
        yield s, start, time.time()


def logged_values(run: str) -> dict[tuple[str, str | None], dict[int, list[float]]]:
    """{(instrument, sub-label value): {step: values}} as the trainer logged them (trainer_state.json, full
    precision), through the exporter's key map."""
    keymap, out = KeyMap(), {}
    for values, step in trainer_state_values(run):
        for key, value in values.items():
            target = keymap.resolve(key)
            if target is not None:
                out.setdefault((target.instrument, target.label_value), {}).setdefault(step, []).append(value)
    return out


def printed_as(exact: float, printed: float) -> bool:
    """The console prints values with 4 significant digits."""
    return printed == float(f"{exact:.4g}") or math.isclose(printed, exact, rel_tol=6e-4, abs_tol=1e-12)


def joined_by_time(answers: dict[str, list[dict]]) -> dict[str, list[tuple[float, float, float]]]:
    """{run: [(time, step, value)]}: the value (A) and step (B) series of each run joined on their timestamps."""
    steps = {(s["metric"]["run"], t): float(v) for s in answers["B"] for t, v in s["values"]}
    out: dict[str, list[tuple[float, float, float]]] = {}
    for s in answers["A"]:
        run = s["metric"]["run"]
        for t, v in s["values"]:
            assert (run, t) in steps, f"{run}: a value at {t} without its step"
            out.setdefault(run, []).append((float(t), steps[run, t], float(v)))
    assert len(steps) == sum(len(v) for v in out.values()), "a step without its value"
    return out


@pytest.mark.parametrize("board,runs", STEP_RUNS)
def test_step_panels_overlay_the_logged_steps(replayed, board: str, runs: list[str]) -> None:
    stack, start, end = replayed
    logged = {run: logged_values(run) for run in runs}
    for panel in step_panels(BOARDS[board]):
        instrument = step_instrument(panel)
        answers = {tg["refId"]: stack.query_range(preview.substitute(tg["expr"], runs), start, end, 0.2)
                   for tg in panel["targets"]}
        joined = joined_by_time(answers)
        drawn = preview.trend_series(panel, answers)
        assert sorted(drawn) == sorted(joined) == sorted(runs), f"{panel['title']}: one line per selected run"
        for run, rows in joined.items():
            where = f"{panel['title']} ({run})"
            rows.sort()
            assert all(a[1] <= b[1] for a, b in itertools.pairwise(rows)), \
                f"{where}: the step went backwards in time"
            by_step: dict[float, set[float]] = {}
            for _, step, value in rows:
                by_step.setdefault(step, set()).add(value)
            assert all(len(v) == 1 for v in by_step.values()), f"{where}: one step seen with two values"
            assert drawn[run] == sorted((step, v.pop()) for step, v in by_step.items()), \
                f"{where}: the transformations do not give the time join"
            xs = [x for x, _ in drawn[run]]
            assert xs == sorted(set(xs)) and len(xs) >= MIN_POINTS, f"{where}: {len(xs)} steps"
            truth = logged[run][instrument]
            for step, value in drawn[run]:
                assert step.is_integer() and int(step) in truth, f"{where}: step {step} was never logged"
                assert any(printed_as(exact, value) for exact in truth[int(step)]), \
                    f"{where}: step {int(step)} drawn at {value}, logged {truth[int(step)]}"


def test_the_serve_path_does_not_import_the_board_generator() -> None:
    """exporter/dashboards/ is a generator: the sidecar's import path stays as light as it was."""
    code = ("import sys, exporter.cli, exporter.app; "
            "print(sorted(m for m in sys.modules if m.startswith('exporter.dashboards')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
