"""Generate the Grafana 10+ dashboards in grafana/ (one per method, plus GPU) from plain dicts.

    python scripts/gen_dashboards.py           # write grafana/*.json
    python scripts/gen_dashboards.py --check   # exit 1 when a committed file is out of date

tests/test_dashboards.py runs every query of every panel against a real Prometheus scraping the exporter on
the real TRL fixtures. The panel layout follows the seeds: GRPO's primary / secondary / tertiary rows (Part III,
"Putting it together"), Part II's production RL layout for PPO and DPO, Part I's fundamentals for SFT, 002's
GPU behaviour. Thresholds are drawn from the exported posttrain_threshold series: the run's own values (the
seeds' defaults unless the run's config overrides them)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "grafana"
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
# A run is keyed by (cluster, namespace, run): two teams may both name a run "grpo". Series without a cluster or
# namespace label (one Prometheus, no Kubernetes) group under an empty value, and the variables' "All" is `.*`,
# which matches an absent label too.
KEY = "cluster, namespace, run"
RUN = 'cluster=~"$cluster", namespace=~"$namespace", run=~"$run"'

# Queries that may legitimately return nothing on the fixtures: (dashboard uid, panel title, refId) -> why.
# Every other query must return data in tests/test_dashboards.py, and every panel must return some data.
OPTIONAL: dict[tuple[str, str, str], str] = {
    ("posttrain-grpo", "Length diversity and baseline ratio", "A"):
        "completions/length_std comes from a custom logging callback; TRL 1.16 does not log it",
    ("posttrain-grpo", "Clip ratios and asymmetry", "E"):
        "asymmetry is exported only while clipping (low + high) exceeds 1%",
}

# posttrain_regime as one number per run, for a state timeline (value mappings below).
REGIMES = [
    ("unknown", "unknown (not enough points / no KL)", "text"),
    ("improving_without_drift", "improving without drift (ideal)", "green"),
    ("improving_with_drift", "improving with drift (healthy)", "green"),
    ("converged", "converged (nothing changes)", "blue"),
    ("drifting_without_gain", "drifting without gain (run its course)", "orange"),
    ("declining", "declining (reward lost, no drift)", "orange"),
    ("destructive", "destructive: stop immediately", "red"),
]
REGIME_EXPR = f"sum by ({KEY}) (\n  " + "\n  or ".join(
    f'posttrain_regime{{{RUN}, regime="{name}"}} * {i}' for i, (name, _, _) in enumerate(REGIMES)) + "\n)"
REGIME_MAPPINGS = [{"type": "value", "options": {
    str(i): {"text": text, "color": color, "index": i} for i, (_, text, color) in enumerate(REGIMES)}}]

GPU_PHASES = [("idle", "idle", "text"), ("generation", "generation", "purple"), ("training", "training", "green")]


# The run of each exporter: every exporter of a run carries posttrain_run_finished{run} from its start, whether
# its log holds training records (rank 0 of a multi-node run) or not (the other ranks, which serve their pod's GPUs
# only). One run per exporter (an exporter reading several logs is labelled with one of them).
RUN_OF_EXPORTER = ("topk by (cluster, namespace, instance) (1,\n"
                   f"  group by (cluster, namespace, instance, run) (posttrain_run_finished{{{RUN}}})\n)")
GPU_KEY = f"{KEY}, instance, gpu"


def _gpu(metric: str, extra: str = "") -> str:
    """A GPU family (no run label of its own) given the run of its exporter: the GPUs of every exporter serving a
    selected run, on every pod of the run (not only the pod whose log has the training records)."""
    sel = f"{{{extra}}}" if extra else ""
    return f"{metric}{sel}\n* on (cluster, namespace, instance) group_left (run)\n{RUN_OF_EXPORTER}"


GPU_PHASE_EXPR = f"sum by ({GPU_KEY}) (\n  " + "\n  or ".join(
    f'({_gpu("posttrain_gpu_phase", f"phase={chr(34)}{name}{chr(34)}")}) * {i}'
    for i, (name, _, _) in enumerate(GPU_PHASES)) + "\n)"
GPU_PHASE_MAPPINGS = [{"type": "value", "options": {
    str(i): {"text": text, "color": color, "index": i} for i, (_, text, color) in enumerate(GPU_PHASES)}}]


# --- panel builders -------------------------------------------------------------------------------------------


def t(expr: str, legend: str = "{{run}}") -> dict:
    return {"expr": expr, "legendFormat": legend}


def thr(instrument: str) -> dict:
    """The run's thresholds for one instrument, as dashed lines (the seeds' values unless the run overrides)."""
    return t(f'max by ({KEY}, level) (posttrain_threshold{{instrument="{instrument}", {RUN}}})',
             "{{run}} threshold {{level}}")


def limit(*detectors: str) -> dict:
    """The limit a detector judges against, in the instrument's units (a threshold, or a multiple of the run's
    baseline), drawn like a threshold."""
    names = "|".join(detectors)
    return t(f'max by ({KEY}, detector) (posttrain_detector_limit{{detector=~"{names}", {RUN}}})',
             "{{run}} threshold {{detector}}")


def baseline(instrument: str, sub: str = "") -> dict:
    """The run's own start for an instrument (the median of its first logged points)."""
    sel = f'instrument="{instrument}"' + (f", {sub}" if sub else "")
    return t(f"max by ({KEY}) (posttrain_baseline{{{sel}, {RUN}}})", "{{run}} baseline")


def spikes(detector: str, what: str) -> dict:
    """Single-step excursions beyond a detector's limit (counted, never alerted on), per scrape."""
    return t(f'sum by ({KEY}) (increase(posttrain_detector_spikes_total{{detector="{detector}", {RUN}}}'
             f"[$__rate_interval]))", f"{{{{run}}}} {what} spikes")


def _override(regex: str, *props: tuple[str, object]) -> dict:
    return {"matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": k, "value": v} for k, v in props]}


THRESHOLD_STYLE = _override(".*threshold.*", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                            ("custom.lineWidth", 1), ("color", {"mode": "fixed", "fixedColor": "red"}),
                            ("custom.fillOpacity", 0))


def right(regex: str, unit: str | None = None) -> dict:
    props: list[tuple[str, object]] = [("custom.axisPlacement", "right"), ("custom.lineStyle", {"fill": "dot"})]
    if unit:
        props.append(("unit", unit))
    return _override(regex, *props)


def _targets(targets: list[dict]) -> list[dict]:
    return [{"datasource": DS, "refId": chr(ord("A") + i), "range": True, "instant": False, **tg}
            for i, tg in enumerate(targets)]


def timeseries(title: str, description: str, targets: list[dict], unit: str = "short",
               overrides: list[dict] | None = None, w: int = 8, h: int = 8) -> dict:
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "gridPos": {"w": w, "h": h},
        "targets": _targets(targets),
        "fieldConfig": {
            "defaults": {"unit": unit, "color": {"mode": "palette-classic"},
                         "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "pointSize": 4,
                                    "showPoints": "never", "spanNulls": True, "axisPlacement": "auto"}},
            "overrides": [THRESHOLD_STYLE, *(overrides or [])]},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
    }


def stat(title: str, description: str, targets: list[dict], unit: str = "short", decimals: int | None = None,
         steps: list[tuple[float | None, str]] | None = None, w: int = 4, h: int = 4) -> dict:
    defaults: dict = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": {
        "mode": "absolute", "steps": [{"value": v, "color": c} for v, c in (steps or [(None, "blue")])]}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat", "title": title, "description": description, "datasource": DS, "gridPos": {"w": w, "h": h},
        "targets": _targets(targets), "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                    "justifyMode": "auto", "orientation": "auto"},
    }


def state(title: str, description: str, targets: list[dict], mappings: list[dict] | None = None,
          steps: list[tuple[float | None, str]] | None = None, w: int = 12, h: int = 5) -> dict:
    return {
        "type": "state-timeline", "title": title, "description": description, "datasource": DS,
        "gridPos": {"w": w, "h": h}, "targets": _targets(targets),
        "fieldConfig": {"defaults": {
            "color": {"mode": "thresholds"}, "mappings": mappings or [],
            "thresholds": {"mode": "absolute",
                           "steps": [{"value": v, "color": c} for v, c in (steps or [(None, "green")])]},
            "custom": {"fillOpacity": 80, "lineWidth": 0}}, "overrides": []},
        "options": {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9, "alignValue": "left",
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
                    "tooltip": {"mode": "single", "sort": "none"}},
    }


def text(title: str, content: str, w: int = 24, h: int = 3) -> dict:
    return {"type": "text", "title": title, "gridPos": {"w": w, "h": h},
            "options": {"mode": "markdown", "content": content}}


def row(title: str, panels: list[dict], collapsed: bool = False) -> dict:
    return {"type": "row", "title": title, "collapsed": collapsed, "gridPos": {"w": 24, "h": 1}, "panels": panels}


FLAG = [(None, "green"), (1, "orange")]


# --- step-aligned panels: instruments against the logged step, runs overlaid as in W&B / TensorBoard -------------
#
# Grafana plots against wall-clock time; the trend panel plots against any ascending numeric field. Each panel asks
# for two tables per run at the same evaluation times: the instrument's value (refId A) and the step at which that
# value was logged (refId B, posttrain_instrument_last_step: for instruments logged on some steps only, such as
# GRPO's rewards with num_iterations > 1, posttrain_step would pair a value with a later step). Each query keeps
# only the times where the other exists (`and on (cluster, namespace, run)`), so every row has both. Then, in Grafana:
#   merge             one table Time | run | series | Value #A | Value #B (rows with the same Time and run joined)
#   groupingToMatrix  one row per step (Value #B), one column per run (its Value #A), null where a run has no value
#   organize          the step column ("Value #B\series") renamed "step"
#   convertFieldType  "step" to a number (groupingToMatrix makes its row field a string)
#   sortBy            ascending step, which the trend panel requires
# The trend panel takes one frame: the matrix is that frame, with the step as its x field and one series per run.
# A column is named by the `series` label both queries add: the run, behind its namespace and cluster where the
# series have them (`team-a/grpo`, `c1/team-a/grpo`), so two teams' runs of the same name stay two lines.

STEP_FIELD = "step"
SERIES = "series"
VALUE_COLUMN, STEP_COLUMN = "Value #A", "Value #B"  # the Prometheus data source's names for two table queries
STEP_MAX_POINTS = 3000  # rows per query: one per scrape over 12 h at 15 s (Prometheus allows 11,000)
STEP_TRANSFORMATIONS = [
    {"id": "merge", "options": {}},
    {"id": "groupingToMatrix", "options": {"columnField": SERIES, "rowField": STEP_COLUMN, "valueField": VALUE_COLUMN,
                                           "emptyValue": "null"}},
    {"id": "organize", "options": {"renameByName": {f"{STEP_COLUMN}\\{SERIES}": STEP_FIELD}}},
    {"id": "convertFieldType", "options": {"conversions": [{"targetField": STEP_FIELD, "destinationType": "number"}],
                                           "fields": {}}},
    {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": STEP_FIELD, "desc": False}]}},
]


def step_queries(metric: str, instrument: str, sub: str = "") -> list[dict]:
    """The instrument's value per run (A) and the step it was logged at (B), each kept where the other exists."""
    sel = ", ".join(part for part in (sub, RUN) if part)
    value = f"max by ({KEY}) ({metric}{{{sel}}})"
    step = f'max by ({KEY}) (posttrain_instrument_last_step{{instrument="{instrument}", {sel}}})'
    return [{**t(_series(f"{value}\nand on ({KEY}) {step}")), "format": "table"},
            {**t(_series(f"{step}\nand on ({KEY}) {value}"), "{{run}} step"), "format": "table"}]


def _series(expr: str) -> str:
    """`expr` with a `series` label naming its run: cluster/namespace/run, without the parts a series lacks."""
    joined = f'label_join(\n{expr},\n"{SERIES}", "/", "cluster", "namespace", "run")'
    return f'label_replace({joined}, "{SERIES}", "$1", "{SERIES}", "/*(.*)")'



def by_step(title: str, description: str, metric: str, instrument: str, sub: str = "", unit: str = "short",
            w: int = 8, h: int = 8) -> dict:
    """A trend panel: the instrument against the training step, one line per selected run."""
    return {
        "type": "trend", "title": title, "description": description, "datasource": DS,
        "gridPos": {"w": w, "h": h}, "maxDataPoints": STEP_MAX_POINTS,
        "targets": _targets(step_queries(metric, instrument, sub)),
        "transformations": STEP_TRANSFORMATIONS,
        "fieldConfig": {
            "defaults": {"unit": unit, "color": {"mode": "palette-classic"},
                         "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "pointSize": 4,
                                    "showPoints": "auto", "spanNulls": True, "axisPlacement": "auto"}},
            "overrides": [{"matcher": {"id": "byName", "options": STEP_FIELD},
                           "properties": [{"id": "unit", "value": "none"}, {"id": "decimals", "value": 0},
                                          {"id": "custom.axisLabel", "value": "training step"}]}]},
        "options": {"xField": STEP_FIELD,
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
    }


STEP_ROW = "By step: runs overlaid as in W&B and TensorBoard"
STEP_NOTE = ("x is the logged training step, not time: select several runs to overlay them. One point per scrape "
             "(steps logged between two scrapes are not drawn); the time range still picks the samples.")


def step_row(panels: list[dict]) -> dict:
    for p in panels:
        p["description"] = f"{p['description']} {STEP_NOTE}"
    return row(STEP_ROW, panels, collapsed=True)


# --- shared panels ----------------------------------------------------------------------------------------------


def step_stats(w: int = 4) -> list[dict]:
    return [
        stat("Step", "Last training step logged; a run that stops advancing has stalled.",
             [t(f"max by ({KEY}) (posttrain_step{{{RUN}}})")], decimals=0, w=w),
        stat("Best step (reward peak)",
             "Step of the highest smoothed reward so far: the checkpoint to keep. Far behind the current step "
             "means the model was better earlier: a peak followed by decline.",
             [t(f"max by ({KEY}) (posttrain_reward_peak_step{{{RUN}}})")], decimals=0, w=w),
        stat("Reward drawdown from peak",
             "Peak smoothed reward minus the current one. Zero while improving; above zero for long means "
             "continuing training is actively harmful.",
             [t(f"max by ({KEY}) (posttrain_reward_drawdown{{{RUN}}})")], decimals=3,
             steps=[(None, "green"), (0.05, "orange")], w=w),
    ]


def detectors_panel(w: int = 24, h: int = 6) -> dict:
    return state(
        "Detectors",
        "Each judgment of the exporter for the run, as the alerts read it: active (orange) once its condition has "
        "held for its required logged steps. A detector that never saw its inputs is absent.",
        [t(f"max by ({KEY}, detector) (posttrain_detector_active{{{RUN}}})", "{{run}} {{detector}}")],
        mappings=[{"type": "value", "options": {"0": {"text": "quiet", "color": "green", "index": 0},
                                                "1": {"text": "active", "color": "orange", "index": 1}}}],
        steps=FLAG, w=w, h=h)


def regime_panel(w: int = 12) -> dict:
    return state(
        "KL-versus-reward regime",
        "Five regimes from the trend directions of KL and reward: improving with or "
        "without drift is healthy; drifting without gain means the run has run its course; KL rising while "
        "reward falls is destructive: stop immediately.",
        [t(REGIME_EXPR)], mappings=REGIME_MAPPINGS, w=w)


def fundamentals(w: int = 8) -> list[dict]:
    return [
        timeseries("Gradient norm and learning rate",
                   "Gradient norm before clipping (left) and learning rate (right). Healthy: a stable band; "
                   "spikes or a steady climb precede divergence, a collapse to ~0 means nothing is learned.",
                   [t(f"posttrain_grad_norm{{{RUN}}}", "{{run}} grad norm"),
                    t(f"posttrain_learning_rate{{{RUN}}}", "{{run}} learning rate")],
                   overrides=[right(".*learning rate.*")], w=w),
    ]


ANNOTATIONS = {"list": [
    {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
     "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
    {"datasource": DS, "enable": True, "iconColor": "red", "name": "Firing alerts",
     "expr": f'ALERTS{{alertstate="firing", {RUN}}}', "step": "60s", "useValueForTime": False,
     "titleFormat": "{{alertname}}", "textFormat": "{{run}} ({{severity}})", "tagKeys": "alertname,severity,run"},
]}


def templating() -> dict:
    return {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        _variable("cluster", "Cluster", "label_values(posttrain_step, cluster)"),
        _variable("namespace", "Namespace", 'label_values(posttrain_step{cluster=~"$cluster"}, namespace)'),
        _variable("run", "Run", 'label_values(posttrain_step{cluster=~"$cluster", namespace=~"$namespace"}, run)'),
    ]}


def _variable(name: str, label: str, query: str) -> dict:
    """A multi-value query variable whose "All" is `.*`: it also matches series without the label (a Prometheus
    outside Kubernetes has no namespace, one without external labels no cluster)."""
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": query,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
            "multi": True, "includeAll": True, "allValue": ".*", "current": {}, "hide": 0, "refresh": 2, "sort": 1,
            "regex": "", "options": []}


def _layout(items: list[dict]) -> list[dict]:
    """Place panels left to right, top to bottom (24 columns); assign unique ids; nest collapsed rows."""
    out: list[dict] = []
    next_id = 1
    x = y = line_h = 0

    def place(p: dict) -> dict:
        nonlocal x, y, line_h, next_id
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        p["id"] = next_id
        next_id += 1
        x += w
        line_h = max(line_h, h)
        return p

    for item in items:
        if item["type"] == "row":
            x, y, line_h = 0, y + line_h, 0
            children = item.pop("panels")
            place(item)
            row_y = y
            x, y, line_h = 0, y + 1, 0
            placed = [place(c) for c in children]
            if item["collapsed"]:
                item["panels"] = placed
                out.append(item)
                x, y, line_h = 0, row_y + 1, 0   # a collapsed row takes one line; its panels keep their y
            else:
                item["panels"] = []
                out.extend([item, *placed])
        else:
            out.append(place(item))
    return out


def dashboard(uid: str, title: str, description: str, items: list[dict], tags: list[str]) -> dict:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["posttrain", *tags],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "timezone": "browser",
        "annotations": ANNOTATIONS, "templating": templating(),
        "links": [{"type": "dashboards", "tags": ["posttrain"], "asDropdown": True, "includeVars": True,
                   "keepTime": True, "title": "posttrain boards", "icon": "external link", "targetBlank": False}],
        "panels": _layout(items),
    }


# --- the boards -----------------------------------------------------------------------------------------------


def grpo() -> dict:
    return dashboard("posttrain-grpo", "Post-training: GRPO",
                     "GRPO instrument cluster: reward std is primary, loss is relegated to anomalies.", [
        row("Run state", [
            *step_stats(w=4), regime_panel(w=12),
            state("Dead reward components",
                  "1 (orange) when a reward component's within-group std is below 0.01: it no longer gives "
                  "learning signal, dead weight in the composite reward.",
                  [t(f"max by ({KEY}, component) (posttrain_reward_component_dead{{{RUN}}})", "{{run}} {{component}}")],
                  mappings=[{"type": "value", "options": {"0": {"text": "alive", "color": "green", "index": 0},
                                                          "1": {"text": "dead", "color": "orange", "index": 1}}}],
                  steps=FLAG, w=24, h=6),
            detectors_panel(),
        ]),
        row("Primary: watch constantly", [
            timeseries("Reward std and headroom",
                       "The main learning-signal indicator: the spread of rewards within a group. Healthy well "
                       "above 0.05 (headroom > 1, right axis); below it every completion scores alike, advantages "
                       "vanish and learning stops (saturation, mode collapse or a bug).",
                       [t(f"posttrain_reward_std{{{RUN}}}", "{{run}} reward std"),
                        thr("reward_std"),
                        t(f"posttrain_reward_std_headroom{{{RUN}}}", "{{run}} headroom"),
                        t(f"posttrain_reward_zero_std_ratio{{{RUN}}}", "{{run}} zero-std groups")],
                       overrides=[right(".*(headroom|zero-std).*")]),
            timeseries("Mean reward",
                       "The objective, read with caution: a rising reward with collapsing reward std or runaway "
                       "KL is reward hacking, not progress. Smoothed reward and its peak show a peak followed by "
                       "decline; the trend (right, slope per step) shows whether it still rises.",
                       [t(f"posttrain_reward{{{RUN}}}", "{{run}} reward"),
                        t(f"posttrain_reward_smoothed{{{RUN}}}", "{{run}} smoothed"),
                        t(f"posttrain_reward_peak{{{RUN}}}", "{{run}} peak"),
                        t(f'posttrain_trend{{instrument="reward", {RUN}}}', "{{run}} trend")],
                       overrides=[right(".*trend.*")]),
            timeseries("KL divergence",
                       "Distance from the reference policy (beta > 0). Healthy: slow growth under 0.5; held above "
                       "0.5 warns, held above 1.0 pages. Single-step spikes beyond 1.0 (bars, right) are counted "
                       "and drawn, never alerted on: per-step KL estimates are noisy.",
                       [t(f"posttrain_kl{{{RUN}}}", "{{run}} kl"),
                        t(f'max by ({KEY}) (posttrain_window_max{{instrument="kl", {RUN}}})', "{{run}} window max"),
                        thr("kl"), spikes("kl_critical", "KL > critical")],
                       overrides=[right(".*spikes.*"), _override(".*spikes.*", ("custom.drawStyle", "bars"))]),
        ]),
        row("Secondary: check regularly", [
            timeseries("Completion length",
                       "Mean, min and max completion length against the run's baseline (dashed). A steady climb "
                       "suggests a length bias in the reward; a collapse to one short template is mode collapse.",
                       [t(f'posttrain_completion_length_tokens{{stat=~"mean|min|max|mean_terminated", {RUN}}}',
                          "{{run}} {{stat}}"),
                        baseline("completion_length", 'stat="mean"'),
                        limit("completion_length_growing", "completion_length_shrinking")],
                       unit="none", overrides=[_override(".*baseline.*", ("custom.lineStyle", {"fill": "dash",
                                                                                            "dash": [4, 4]}))]),
            timeseries("Length diversity and baseline ratio",
                       "Within-group length std (completions/length_std, when logged) and the window "
                       "stddev of the mean length: falling to ~0 means every completion looks alike. Right: the "
                       "window mean over the baseline; outside 0.7x..1.3x deserves investigation (length hacking "
                       "or collapse).",
                       [t(f'posttrain_completion_length_tokens{{stat="std", {RUN}}}', "{{run}} within-group std"),
                        t(f'posttrain_window_stddev{{instrument="completion_length", stat="mean", {RUN}}}',
                          "{{run}} window stddev"),
                        t(f"posttrain_completion_length_baseline_ratio{{{RUN}}}", "{{run}} baseline ratio"),
                        thr("completion_length")],
                       overrides=[right(".*(baseline ratio|threshold).*")]),
            timeseries("Truncation",
                       "Share of completions cut at the maximum length (healthy under 20%) and the gap between "
                       "mean length and mean terminated length (right, tokens): truncation inflates the first.",
                       [t(f"posttrain_completion_truncated_ratio{{{RUN}}}", "{{run}} truncated"),
                        thr("completion_truncated"),
                        t(f"posttrain_completion_length_truncation_gap_tokens{{{RUN}}}", "{{run}} truncation gap")],
                       unit="percentunit", overrides=[right(".*gap.*", "none")]),
            timeseries("Clip ratios and asymmetry",
                       "The two faces of clipping. Healthy: low and high roughly balanced, total between 1% and "
                       "40%. Above 40% updates are too large; under 1% the policy barely moves. Asymmetry (right) "
                       "> 0 sharpens what the policy liked, < 0 unlearns.",
                       [t(f'posttrain_clip_ratio{{bound=~"low|high|region", {RUN}}}', "{{run}} {{bound}}"),
                        t(f"posttrain_clip_combined_ratio{{{RUN}}}", "{{run}} low + high"),
                        thr("clip_total"),
                        t(f'posttrain_trend{{instrument="clip_ratio", bound="region", {RUN}}}',
                          "{{run}} region trend"),
                        t(f"posttrain_clip_asymmetry{{{RUN}}}", "{{run}} asymmetry")],
                       unit="percentunit", overrides=[right(".*(asymmetry|trend).*", "none")], w=12),
            timeseries("Entropy and acceleration",
                       "Exploration versus exploitation. Healthy: a slow decline from the run's own start "
                       "(baseline). Below half of it (the dashed limit) is entropy collapse; an accelerating fall "
                       "(acceleration, right axis, strongly negative) comes first.",
                       [t(f"posttrain_entropy{{{RUN}}}", "{{run}} entropy"),
                        baseline("entropy"), limit("entropy_collapse"),
                        t(f"posttrain_entropy_acceleration{{{RUN}}}", "{{run}} acceleration"),
                        t(f'posttrain_trend{{instrument="entropy", {RUN}}}', "{{run}} trend")],
                       overrides=[right(".*(acceleration|trend).*")], w=12),
        ]),
        row("Tertiary: investigate on anomalies", [
            timeseries("Partial reward components",
                       "Each reward function's mean (solid) and within-group std (dotted, right). A component whose "
                       "std stays under 0.01 is dead: it no longer separates completions.",
                       [t(f"posttrain_reward_component{{{RUN}}}", "{{run}} {{component}}"),
                        t(f"posttrain_reward_component_std{{{RUN}}}", "{{run}} {{component}} std"),
                        thr("reward_component_std")],
                       overrides=[right(".*(std|threshold).*")]),
            timeseries("Loss (discontinuities only)",
                       "Loss is not a progress metric: the GRPO loss is a surrogate objective, do not watch it "
                       "trend. Look only for discontinuities: the magnitude ratio (right) outside 0.5..2 means it "
                       "suddenly halved or doubled, a numerical problem.",
                       [t(f"posttrain_loss{{{RUN}}}", "{{run}} loss"),
                        t(f"posttrain_loss_magnitude_ratio{{{RUN}}}", "{{run}} magnitude ratio"),
                        t(f"increase(posttrain_loss_discontinuities_total{{{RUN}}}[$__rate_interval])",
                          "{{run}} discontinuities")],
                       overrides=[right(".*(ratio|discontinuities).*")]),
            *fundamentals(),
        ], collapsed=True),
        step_row([
            by_step("Reward std by step", "Within-group reward spread at each logged step; healthy well above 0.05.",
                    "posttrain_reward_std", "reward_std"),
            by_step("Mean reward by step", "Mean reward at each logged step.", "posttrain_reward", "reward"),
            by_step("KL by step", "KL to the reference at each logged step: 0.5 warns, 1.0 is a stop sign.",
                    "posttrain_kl", "kl"),
            by_step("Entropy by step", "Policy entropy at each logged step: a slow decline is healthy, a cliff is "
                    "collapse.", "posttrain_entropy", "entropy", w=12),
            by_step("Completion length by step", "Mean completion length (tokens) at each logged step.",
                    "posttrain_completion_length_tokens", "completion_length", 'stat="mean"', unit="none", w=12),
        ]),
    ], ["grpo"])


def ppo() -> dict:
    return dashboard("posttrain-ppo", "Post-training: PPO",
                     "PPO instrument cluster: reward dynamics, KL health, policy ratio and clip "
                     "fraction, value function, fundamentals.", [
        row("Run state", [*step_stats(w=4), regime_panel(w=12), detectors_panel()]),
        row("Reward dynamics and KL", [
            timeseries("Reward-model score",
                       "The reward model's raw score, smoothed and its peak. Never trust it alone: a score that "
                       "climbs while KL runs away is reward hacking, the default failure mode.",
                       [t(f"posttrain_reward{{{RUN}}}", "{{run}} score"),
                        t(f"posttrain_reward_smoothed{{{RUN}}}", "{{run}} smoothed"),
                        t(f"posttrain_reward_peak{{{RUN}}}", "{{run}} peak"),
                        t(f'posttrain_trend{{instrument="reward", {RUN}}}', "{{run}} trend")],
                       overrides=[right(".*trend.*")]),
            timeseries("RLHF and non-score reward",
                       "rlhf = score + non-score; non-score is the KL penalty. A non-score reward growing more "
                       "negative means the policy pays ever more to drift from the reference.",
                       [t(f"posttrain_ppo_reward{{{RUN}}}", "{{run}} {{kind}}")]),
            timeseries("KL divergence",
                       "KL to the reference: above 0.5 is a warning, above 1.0 a stop sign. The window max keeps a "
                       "spike between scrapes visible.",
                       [t(f"posttrain_kl{{{RUN}}}", "{{run}} kl"),
                        t(f'max by ({KEY}) (posttrain_window_max{{instrument="kl", {RUN}}})', "{{run}} window max"),
                        thr("kl")]),
        ]),
        row("Policy ratio and clip fraction", [
            timeseries("Policy ratio",
                       "Mean ratio of new to old policy probabilities: healthy near 1.0; regularly above 1.5 "
                       "means reduce the learning rate, outside 0.5..2.0 the update is unstable. Distance |r - 1| "
                       "on the right; approximate KL between old and new policy beside it.",
                       [t(f"posttrain_policy_ratio{{{RUN}}}", "{{run}} ratio"),
                        thr("policy_ratio"),
                        t(f"posttrain_policy_ratio_distance{{{RUN}}}", "{{run}} distance"),
                        t(f"posttrain_approx_kl{{{RUN}}}", "{{run}} approx kl")],
                       overrides=[right(".*(distance|approx kl).*")]),
            timeseries("Clip fraction",
                       "Share of updates where the ratio clip was active: above 30% the steps are too large "
                       "(reduce the learning rate), under 1% the policy barely moves.",
                       [t(f"posttrain_clip_fraction_ratio{{{RUN}}}", "{{run}} clip fraction"), thr("clip_fraction")],
                       unit="percentunit"),
            timeseries("Value loss",
                       "The critic's loss. Healthy: falls and settles; a climbing or exploding value loss makes the "
                       "advantages noise, and the policy follows.",
                       [t(f"posttrain_value_loss{{{RUN}}}", "{{run}} value loss")]),
        ]),
        row("Fundamentals", [
            timeseries("Entropy", "Exploration: a slow decline from the run's start (baseline) is healthy; below "
                       "the dashed limit (half the baseline) or a cliff is collapse.",
                       [t(f"posttrain_entropy{{{RUN}}}", "{{run}} entropy"), baseline("entropy"),
                        limit("entropy_collapse")]),
            timeseries("Completion length",
                       "Mean length against the baseline ratio (right): outside 0.7x..1.3x deserves investigation "
                       "(length hacking or collapse).",
                       [t(f'posttrain_completion_length_tokens{{stat="mean", {RUN}}}', "{{run}} mean length"),
                        t(f"posttrain_completion_length_baseline_ratio{{{RUN}}}", "{{run}} baseline ratio"),
                        thr("completion_length")],
                       overrides=[right(".*(baseline ratio|threshold).*")]),
            *fundamentals(),
        ], collapsed=True),
        step_row([
            by_step("Score by step", "The reward model's score at each logged step.", "posttrain_reward", "reward"),
            by_step("KL by step", "KL to the reference at each logged step: 0.5 warns, 1.0 is a stop sign.",
                    "posttrain_kl", "kl"),
            by_step("Clip fraction by step", "Share of clipped updates at each logged step: above 30% the steps are "
                    "too large.", "posttrain_clip_fraction_ratio", "clip_fraction", unit="percentunit"),
        ]),
    ], ["ppo"])


def dpo() -> dict:
    return dashboard("posttrain-dpo", "Post-training: DPO",
                     "DPO reward dynamics (implicit rewards, margin, preference accuracy) and the fundamentals.", [
        row("Run state", [
            stat("Step", "Last training step logged.", [t(f"max by ({KEY}) (posttrain_step{{{RUN}}})")],
                 decimals=0, w=6),
            stat("Preference accuracy", "Share of pairs where the chosen response wins. Healthy: climbs well "
                 "above 0.5; stuck at 0.5 is no preference learned, 1.0 early can mean the pairs are too easy.",
                 [t(f"max by ({KEY}) (posttrain_dpo_accuracy_ratio{{{RUN}}})")], unit="percentunit",
                 steps=[(None, "orange"), (0.6, "green")], w=6),
            state("Margin converging",
                  "1 (orange) while the margin trends down: chosen and rejected rewards converge, the model is "
                  "losing the preference.",
                  [t(f"max by ({KEY}) (posttrain_dpo_margin_converging{{{RUN}}})")],
                  mappings=[{"type": "value", "options": {"0": {"text": "ok", "color": "green", "index": 0},
                                                          "1": {"text": "converging", "color": "orange",
                                                                "index": 1}}}],
                  steps=FLAG, w=12, h=4),
            detectors_panel(),
        ]),
        row("Reward dynamics", [
            timeseries("Chosen and rejected rewards",
                       "Implicit rewards of the chosen and rejected responses. Healthy: they separate, chosen "
                       "above rejected. The chosen reward below the dashed limit while the margin still grows is "
                       "likelihood displacement: both answers pushed down.",
                       [t(f'posttrain_dpo_reward{{kind=~"chosen|rejected", {RUN}}}', "{{run}} {{kind}}"),
                        limit("dpo_displacement")], w=12),
            timeseries("Margin",
                       "Chosen minus rejected reward and its trend (right, per step). Healthy: grows then "
                       "plateaus; shrinking means chosen and rejected converge.",
                       [t(f'posttrain_dpo_reward{{kind="margin", {RUN}}}', "{{run}} margin"),
                        t(f'posttrain_trend{{instrument="dpo_reward", kind="margin", {RUN}}}', "{{run}} trend")],
                       overrides=[right(".*trend.*")], w=12),
            timeseries("Preference accuracy",
                       "Share of pairs where the chosen response is preferred, with the window mean.",
                       [t(f"posttrain_dpo_accuracy_ratio{{{RUN}}}", "{{run}} accuracy"),
                        t(f'posttrain_window_mean{{instrument="dpo_accuracy", {RUN}}}', "{{run}} window mean")],
                       unit="percentunit"),
            timeseries("Loss", "DPO loss: healthy falls below ln 2 = 0.693 (the loss of no preference) and "
                       "settles; near 0 fast can be overfitting to easy pairs.",
                       [t(f"posttrain_loss{{{RUN}}}", "{{run}} loss")]),
            *fundamentals(),
        ]),
        row("Fundamentals", [
            timeseries("Token accuracy", "Mean token accuracy on the batch.",
                       [t(f"posttrain_token_accuracy_ratio{{{RUN}}}", "{{run}} token accuracy")],
                       unit="percentunit", w=12),
            timeseries("Entropy", "Policy entropy: a slow decline is healthy, a cliff is collapse.",
                       [t(f"posttrain_entropy{{{RUN}}}", "{{run}} entropy")], w=12),
        ]),
        step_row([
            by_step("Chosen reward by step", "Implicit reward of the chosen responses at each logged step.",
                    "posttrain_dpo_reward", "dpo_reward", 'kind="chosen"', w=12),
            by_step("Rejected reward by step", "Implicit reward of the rejected responses at each logged step.",
                    "posttrain_dpo_reward", "dpo_reward", 'kind="rejected"', w=12),
            by_step("Margin by step", "Chosen minus rejected reward at each logged step: grows then plateaus.",
                    "posttrain_dpo_reward", "dpo_reward", 'kind="margin"', w=12),
            by_step("Preference accuracy by step", "Share of pairs where the chosen response wins, at each logged "
                    "step.", "posttrain_dpo_accuracy_ratio", "dpo_accuracy", unit="percentunit", w=12),
        ]),
    ], ["dpo"])


def sft() -> dict:
    return dashboard("posttrain-sft", "Post-training: SFT",
                     "Supervised fine-tuning fundamentals: loss, gradients, learning rate, accuracy, entropy.", [
        row("Run state", [
            stat("Step", "Last training step logged.", [t(f"max by ({KEY}) (posttrain_step{{{RUN}}})")],
                 decimals=0, w=8),
            stat("Epoch", "Training epoch (fractional).", [t(f"max by ({KEY}) (posttrain_epoch{{{RUN}}})")],
                 decimals=2, w=8),
            stat("Loss trend", "Least-squares slope of the loss per step over the window: negative while "
                 "learning, ~0 once converged, positive is divergence.",
                 [t(f'max by ({KEY}) (posttrain_trend{{instrument="loss", {RUN}}})')], decimals=5,
                 steps=[(None, "green"), (0, "orange")], w=8),
            detectors_panel(h=4),
        ]),
        row("Fundamentals", [
            timeseries("Loss", "Training loss with the window's min and max. Healthy: falls then flattens; a "
                       "rising loss or sudden jumps are divergence; a floor near 0 is memorisation.",
                       [t(f"posttrain_loss{{{RUN}}}", "{{run}} loss"),
                        t(f'posttrain_window_min{{instrument="loss", {RUN}}}', "{{run}} window min"),
                        t(f'posttrain_window_max{{instrument="loss", {RUN}}}', "{{run}} window max")], w=12),
            timeseries("Gradient norm",
                       "Gradient norm before clipping: a stable band is healthy; spikes precede divergence.",
                       [t(f"posttrain_grad_norm{{{RUN}}}", "{{run}} grad norm")], w=12),
            timeseries("Learning rate", "The schedule as the trainer applied it (warmup, decay).",
                       [t(f"posttrain_learning_rate{{{RUN}}}", "{{run}} learning rate")]),
            timeseries("Token accuracy", "Mean token accuracy on the training batch: rises as loss falls.",
                       [t(f"posttrain_token_accuracy_ratio{{{RUN}}}", "{{run}} token accuracy")],
                       unit="percentunit"),
            timeseries("Entropy", "Mean token entropy: falls as the model grows confident; a cliff to ~0 is "
                       "overconfidence.", [t(f"posttrain_entropy{{{RUN}}}", "{{run}} entropy")]),
        ]),
        step_row([
            by_step("Loss by step", "Training loss at each logged step: falls then flattens.", "posttrain_loss",
                    "loss", w=12),
            by_step("Gradient norm by step", "Gradient norm before clipping at each logged step.",
                    "posttrain_grad_norm", "grad_norm", w=12),
        ]),
    ], ["sft"])


def gpu() -> dict:
    return dashboard("posttrain-gpu", "Post-training: GPU",
                     "NVML sampling of the training pods' GPUs (docs/gpu.md): every pod of the selected runs, every "
                     "rank of a multi-node run (each pod's exporter serves its own GPUs).", [
        row("Sampler", [
            stat("NVML up", "1 when NVML is initialized and the last poll read the GPUs; 0 without a GPU, a "
                 "driver or NVML (training metrics are unaffected).",
                 [t(_gpu("posttrain_gpu_nvml_up"), "{{run}} {{instance}}")], decimals=0,
                 steps=[(None, "red"), (1, "green")], w=6),
            stat("GPUs sampled", "GPUs the sampler reads (after CUDA_VISIBLE_DEVICES).",
                 [t(_gpu("posttrain_gpu_visible_devices"), "{{run}} {{instance}}")], decimals=0, w=6),
            state("Phase", "Generation (memory-bound, lower power) versus training (compute-bound), judged from "
                  "power against the GPU's own recent training level. RL should alternate; one phase for long "
                  "means a stage is starved.",
                  [t(GPU_PHASE_EXPR, "{{run}} {{instance}} gpu {{gpu}}")], mappings=GPU_PHASE_MAPPINGS, w=12, h=6),
        ]),
        row("Utilization and power", [
            timeseries("Utilization", "Share of time a kernel ran. Both phases read ~100%: utilization cannot "
                       "tell generation from training, power can.",
                       [t(_gpu("posttrain_gpu_utilization_ratio"), "{{run}} {{instance}} gpu {{gpu}}")],
                       unit="percentunit"),
            timeseries("Power and limit", "Board power against the enforced limit (dashed): training draws near "
                       "the limit, generation clearly below it.",
                       [t(_gpu("posttrain_gpu_power_watts"), "{{run}} {{instance}} gpu {{gpu}}"),
                        t(_gpu("posttrain_gpu_power_limit_watts"), "{{run}} {{instance}} gpu {{gpu}} limit")],
                       unit="watt", overrides=[_override(".*limit.*", ("custom.lineStyle",
                                                                       {"fill": "dash", "dash": [10, 10]}))]),
            timeseries("Memory", "Memory used against installed; colocated inference engines preallocate, so a "
                       "flat line is normal.",
                       [t(_gpu("posttrain_gpu_memory_used_bytes"), "{{run}} {{instance}} gpu {{gpu}} used"),
                        t(_gpu("posttrain_gpu_memory_total_bytes"), "{{run}} {{instance}} gpu {{gpu}} total")],
                       unit="bytes"),
            timeseries("Generation time ratio",
                       "Share of time spent generating: from NVML's phase rule per GPU, and from the trainer's own "
                       "timing keys per run. RL runs often spend most of the step generating.",
                       [t(_gpu("posttrain_gpu_generation_time_ratio"), "{{run}} {{instance}} gpu {{gpu}}"),
                        t(f"posttrain_generation_time_ratio{{{RUN}}}", "{{run}} trainer timing")],
                       unit="percentunit", w=12),
            timeseries("Temperature and SM clock", "Die temperature and SM clock (right): a clock that drops "
                       "while hot is thermal throttling.",
                       [t(_gpu("posttrain_gpu_temperature_celsius"), "{{run}} {{instance}} gpu {{gpu}} temperature"),
                        t(_gpu("posttrain_gpu_sm_clock_hertz"), "{{run}} {{instance}} gpu {{gpu}} sm clock")],
                       unit="celsius", overrides=[right(".*clock.*", "hertz")], w=12),
        ]),
    ], ["gpu"])


BOARDS = {"grpo": grpo, "ppo": ppo, "dpo": dpo, "sft": sft, "gpu": gpu}


def render() -> dict[str, str]:
    return {f"{name}.json": json.dumps(build(), indent=2, sort_keys=False) + "\n" for name, build in BOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when grafana/*.json is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name, content in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != content:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(content)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/gen_dashboards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
