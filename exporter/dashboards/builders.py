"""The builder library of the boards: the run selector, queries, panels, variables and the board's layout.

Every training series is keyed by (cluster, namespace, run): two teams may both name a run "grpo". `KEY_LABELS` is
that key, written once: the `$cluster` / `$namespace` / `$run` variables, the selector every query carries
(`series`) and the grouping of every aggregation (`by_run`) are made from it. Series without a cluster or namespace
label (one Prometheus, no Kubernetes) group under an empty value, and the variables' "All" is `.*`, which matches an
absent label too."""

from __future__ import annotations

from collections.abc import Callable

SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
KEY_LABELS = ("cluster", "namespace", "run")
KEY = ", ".join(KEY_LABELS)
# The board's selection: each key label matched against its variable.
RUN = ", ".join(f'{label}=~"${label}"' for label in KEY_LABELS)


def series(metric: str, *matchers: str, after: tuple[str, ...] = ()) -> str:
    """`metric{matchers..., <the selected runs>, after...}`: a series of the runs the board's variables select."""
    return f"{metric}{{{', '.join(m for m in (*matchers, RUN, *after) if m)}}}"


def by_run(op: str, expr: str, *extra: str) -> str:
    """`op by (cluster, namespace, run[, extra...]) (expr)`: one value per run (and per `extra` label)."""
    return f"{op} by ({', '.join((KEY, *extra))}) ({expr})"


# --- panel builders -------------------------------------------------------------------------------------------


def t(expr: str, legend: str = "{{run}}") -> dict:
    return {"expr": expr, "legendFormat": legend}


def thr(instrument: str) -> dict:
    """The run's thresholds for one instrument, as dashed lines (the defaults unless the run overrides them)."""
    return t(by_run("max", series("posttrain_threshold", f'instrument="{instrument}"'), "level"),
             "{{run}} threshold {{level}}")


def limit(*detectors: str) -> dict:
    """The limit a detector judges against, in the instrument's units (a threshold, or a multiple of the run's
    baseline), drawn like a threshold."""
    names = "|".join(detectors)
    return t(by_run("max", series("posttrain_detector_limit", f'detector=~"{names}"'), "detector"),
             "{{run}} threshold {{detector}}")


def baseline(instrument: str, sub: str = "") -> dict:
    """The run's own start for an instrument (the median of its first logged points)."""
    return t(by_run("max", series("posttrain_baseline", f'instrument="{instrument}"', sub)), "{{run}} baseline")


def spikes(detector: str, what: str) -> dict:
    """Single-step excursions beyond a detector's limit (counted, never alerted on), per scrape."""
    counted = series("posttrain_detector_spikes_total", f'detector="{detector}"')
    return t(by_run("sum", f"increase({counted}[$__rate_interval])"), f"{{{{run}}}} {what} spikes")


def override(regex: str, *props: tuple[str, object]) -> dict:
    return {"matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": k, "value": v} for k, v in props]}


THRESHOLD_STYLE = override(".*threshold.*", ("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                           ("custom.lineWidth", 1), ("color", {"mode": "fixed", "fixedColor": "red"}),
                           ("custom.fillOpacity", 0))


def right(regex: str, unit: str | None = None) -> dict:
    props: list[tuple[str, object]] = [("custom.axisPlacement", "right"), ("custom.lineStyle", {"fill": "dot"})]
    if unit:
        props.append(("unit", unit))
    return override(regex, *props)


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


def value_mappings(styles: list[tuple[str, str]]) -> list[dict]:
    """A state timeline's value mappings: value i shows the i-th (text, color)."""
    return [{"type": "value", "options": {
        str(i): {"text": text, "color": color, "index": i} for i, (text, color) in enumerate(styles)}}]


def numbered_states(by: str, styles: dict[str, tuple[str, str]], names: tuple[str, ...],
                    selector: Callable[[str], str]) -> tuple[str, list[dict]]:
    """A family with one 0/1 series per state (`names`, the exporter's) as one number per `by` group, for a state
    timeline: the query `sum by (by) (state_0 * 0 or state_1 * 1 ...)`, numbered in the order of `styles`
    ({state: (text, color)}), and its value mappings. A state without a style, or a style of no state, fails."""
    if set(styles) != set(names):
        raise RuntimeError(f"the board's styles {sorted(styles)} must be exactly the exporter's states {sorted(names)}")
    expr = f"sum by ({by}) (\n  " + "\n  or ".join(f"{selector(name)} * {i}" for i, name in enumerate(styles)) + "\n)"
    return expr, value_mappings(list(styles.values()))


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
    value = by_run("max", series(metric, sub))
    step = by_run("max", series("posttrain_instrument_last_step", f'instrument="{instrument}"', sub))
    return [{**t(_series(f"{value}\nand on ({KEY}) {step}")), "format": "table"},
            {**t(_series(f"{step}\nand on ({KEY}) {value}"), "{{run}} step"), "format": "table"}]


def _series(expr: str) -> str:
    """`expr` with a `series` label naming its run: cluster/namespace/run, without the parts a series lacks."""
    labels = ", ".join(f'"{label}"' for label in KEY_LABELS)
    joined = f'label_join(\n{expr},\n"{SERIES}", "/", {labels})'
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


# --- the board ------------------------------------------------------------------------------------------------

ANNOTATIONS = {"list": [
    {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
     "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
    {"datasource": DS, "enable": True, "iconColor": "red", "name": "Firing alerts",
     "expr": series("ALERTS", 'alertstate="firing"'), "step": "60s", "useValueForTime": False,
     "titleFormat": "{{alertname}}", "textFormat": "{{run}} ({{severity}})", "tagKeys": "alertname,severity,run"},
]}


def templating() -> dict:
    """The data source, then one variable per key label, each listing the values under the ones before it."""
    variables = []
    for i, label in enumerate(KEY_LABELS):
        outer = ", ".join(f'{o}=~"${o}"' for o in KEY_LABELS[:i])
        variables.append(_variable(label, label.capitalize(),
                                   f"label_values(posttrain_step{f'{{{outer}}}' if outer else ''}, {label})"))
    return {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        *variables,
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
