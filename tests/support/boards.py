"""The boards on a real stack, for tests/test_dashboards.py, tests/test_multinode.py and
scripts/preview_dashboards.py: `posttrain-exporter serve` and a Prometheus scraping it on loopback (`Stack`), the
boards' queries with Grafana's variables expanded (`substitute`), what Grafana's transformations make of a
step-aligned trend panel's answers (`trend_series`), and the real TRL fixtures replayed record by record."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from exporter.dashboards import BOARDS
from support.loopback import Processes, free_port, http_ready

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("POSTTRAIN_FIXTURES", REPO / "tests" / "fixtures")) / "trl"
BOARD_FOR = {"grpo": "grpo", "grpo_saturated": "grpo", "dpo": "dpo", "sft": "sft", "ppo": "ppo"}
_RECORD_START = re.compile(r"(?<=[\r\n])(?=\{')")


# --- the stack: exporter + Prometheus on loopback ---------------------------------------------------------------


class Stack:
    """`posttrain-exporter serve` on the given {run: log path}, and a Prometheus scraping it."""

    def __init__(self, tmp: Path, logs: dict[str, Path], scrape: str = "1s", python: str = sys.executable,
                 prometheus: str = "prometheus") -> None:
        self.tmp, self.logs, self.scrape = tmp, logs, scrape
        self.python, self.prometheus_bin = python, prometheus
        self.exporter_port, self.prometheus_port = free_port(), free_port()
        self.procs = Processes(tmp, REPO)

    def __enter__(self) -> Stack:
        cfg = {"listen_address": f"127.0.0.1:{self.exporter_port}", "poll_interval_seconds": 0.1,
               "logs": [{"path": str(p), "run": run} for run, p in self.logs.items()]}
        (self.tmp / "exporter.yml").write_text(yaml.safe_dump(cfg))
        prom = {"global": {"scrape_interval": self.scrape, "evaluation_interval": self.scrape},
                "scrape_configs": [{"job_name": "posttrain", "scrape_interval": self.scrape,
                                    "static_configs": [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]}]}
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(prom))
        self.procs.start("exporter", [self.python, "-m", "exporter", "serve",
                                      "--config", str(self.tmp / "exporter.yml")])
        self.procs.start("prometheus", [self.prometheus_bin, f"--config.file={self.tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                                   "--log.level=warn"])
        self.wait("Prometheus ready", lambda: http_ready(self.prometheus_port), 30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.procs.__exit__(*exc)

    def tails(self) -> str:
        return self.procs.tails(2000)

    def wait(self, what: str, pred: Any, timeout: float, every: float = 0.2) -> Any:
        return self.procs.wait(what, pred, timeout, every)

    def api(self, path: str, **params: Any) -> dict:
        """GET the Prometheus API; returns the whole JSON answer (status, data or errorType/error)."""
        url = f"http://127.0.0.1:{self.prometheus_port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400/422: a bad query, with Prometheus' reason in the body
            return json.loads(e.read())

    def query(self, promql: str) -> list[dict]:
        answer = self.api("/api/v1/query", query=promql)
        if answer["status"] != "success":
            raise ValueError(f"{answer.get('errorType')}: {answer.get('error')}\n{promql}")
        return answer["data"]["result"]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        answer = self.api("/api/v1/query_range", query=promql, start=start, end=end, step=step)
        if answer["status"] != "success":
            raise ValueError(f"{answer.get('errorType')}: {answer.get('error')}\n{promql}")
        return answer["data"]["result"]


# --- the boards' queries --------------------------------------------------------------------------------------


def substitute(expr: str, runs: list[str], rate_interval: str = "30s", namespaces: list[str] | None = None,
               clusters: list[str] | None = None) -> str:
    """Grafana's variables as Grafana would expand them: $run (multi-value) as a regex alternation; $namespace and
    $cluster likewise, or their "All" (`.*`, which matches an absent label too) when not given."""
    def alternation(values: list[str] | None) -> str:
        # as Grafana escapes a multi-value variable for Prometheus: regex metacharacters get a backslash, itself
        # escaped inside the PromQL string (`a.b` -> `a\\.b`); `-` and `_` stay as they are
        if values is None:
            return ".*"
        return "|".join(re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values)

    for name, value in (("run", alternation(runs)), ("namespace", alternation(namespaces)),
                        ("cluster", alternation(clusters)), ("__rate_interval", rate_interval),
                        ("__interval", "5s"), ("__range", "5m"), ("datasource", "prometheus")):
        expr = expr.replace("${" + name + "}", value)
        expr = re.sub(r"\$" + name + r"\b", lambda _m, v=value: v, expr)
    return expr


def all_panels(board: dict) -> list[dict]:
    """Every panel, the panels of collapsed rows included."""
    out = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def load_boards() -> dict[str, dict]:
    return {name: build() for name, build in BOARDS.items()}


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


# --- what Grafana makes of a panel's answers (the step-aligned trend panels) -------------------------------------
#
# A frame is {field name: values}, all of one length. These follow Grafana 10.4 / 11: the Prometheus data source's
# table format (@grafana/prometheus transformDFToTable) and the transformations of @grafana/data that the
# step-aligned panels use. Only what those panels need; an unknown transformation raises.

Frame = dict[str, list]


def prometheus_tables(answers: dict[str, list[dict]]) -> list[Frame]:
    """Range answers of format=table queries ({refId: result}), as the data source hands them to the
    transformations: one table per refId that returned series, Time | its labels (sorted) | "Value #<refId>"
    ("Value" when only one refId returned data), rows series after series, sorted by time."""
    refids = [r for r, result in answers.items() if result]
    tables = []
    for refid in refids:
        labels = sorted({k for s in answers[refid] for k in s["metric"]})
        value = f"Value #{refid}" if len(refids) > 1 else "Value"
        rows = [(float(ts) * 1000, *(s["metric"].get(k, "") for k in labels), float(v))
                for s in answers[refid] for ts, v in s["values"]]
        rows.sort(key=lambda r: r[0])
        tables.append({name: [r[i] for r in rows] for i, name in enumerate(["Time", *labels, value])})
    return tables


def _rows(frame: Frame) -> list[dict]:
    n = len(next(iter(frame.values()), []))
    return [{k: v[i] for k, v in frame.items()} for i in range(n)]


def _frame(rows: list[dict], names: list[str]) -> Frame:
    return {name: [r.get(name) for r in rows] for name in names}


def merge(frames: list[Frame], _options: dict) -> list[Frame]:
    """Grafana's "Merge series/tables": rows whose fields common to every frame are equal become one row."""
    if len(frames) < 2:
        return frames
    names = list(dict.fromkeys(n for f in frames for n in f))
    keys = [n for n in names if all(n in f for f in frames)]
    if not keys:
        return frames
    merged: dict[tuple, list[dict]] = {}
    order: list[dict] = []
    for row in (r for f in frames for r in _rows(f)):
        bucket = merged.setdefault(tuple(row[k] for k in keys), [])
        target = next((m for m in bucket if all(m.get(k) in (None, v) for k, v in row.items())), None)
        if target is None:
            bucket.append(row)
            order.append(row)
        else:
            target.update(row)
    return [_frame(order, names)]


def grouping_to_matrix(frames: list[Frame], options: dict) -> list[Frame]:
    """Grafana's "Grouping to matrix": a row per distinct rowField value, a column per distinct columnField value."""
    if len(frames) != 1:
        return frames
    frame = frames[0]
    col, row, value = options["columnField"], options["rowField"], options["valueField"]
    empty = {"null": None, "true": True, "false": False}.get(options.get("emptyValue", "empty"), "")
    cells: dict[object, dict[object, object]] = {}
    for c, r, v in zip(frame[col], frame[row], frame[value], strict=True):
        cells.setdefault(c, {})[r] = v  # the last row wins, as in Grafana
    rows = list(dict.fromkeys(frame[row]))
    return [{f"{row}\\{col}": rows, **{str(c): [cells[c].get(r, empty) for r in rows] for c in cells}}]


def organize(frames: list[Frame], options: dict) -> list[Frame]:
    """Renames and exclusions (Grafana renames through the display name; the frames here have no other)."""
    renames, excluded = options.get("renameByName", {}), options.get("excludeByName", {})
    return [{renames.get(k, k) or k: v for k, v in f.items() if not excluded.get(k)} for f in frames]


def convert_field_type(frames: list[Frame], options: dict) -> list[Frame]:
    """Conversions to number only (what the step-aligned panels use)."""
    out = []
    for f in frames:
        f = dict(f)
        for c in options["conversions"]:
            if c["destinationType"] != "number":
                raise NotImplementedError(c["destinationType"])
            if c["targetField"] in f:
                f[c["targetField"]] = [None if v in (None, "") else float(v) for v in f[c["targetField"]]]
        out.append(f)
    return out


def sort_by(frames: list[Frame], options: dict) -> list[Frame]:
    """Rows sorted by the listed fields, the first one first."""
    out = []
    for f in frames:
        for s in reversed(options["sort"]):
            if s["field"] in f:
                rows = sorted(_rows(f), key=lambda r, k=s["field"]: r[k], reverse=bool(s.get("desc")))
                f = _frame(rows, list(f))
        out.append(f)
    return out


TRANSFORMATIONS = {"merge": merge, "groupingToMatrix": grouping_to_matrix, "organize": organize,
                   "convertFieldType": convert_field_type, "sortBy": sort_by}


def transform(frames: list[Frame], transformations: list[dict]) -> list[Frame]:
    for tr in transformations:
        if not tr.get("disabled"):
            frames = TRANSFORMATIONS[tr["id"]](frames, tr.get("options", {}))
    return frames


def trend_series(panel: dict, answers: dict[str, list[dict]]) -> dict[str, list[tuple[float, float]]]:
    """A trend panel's lines: {series name: [(x, y)]} from its single frame, x being options.xField."""
    frames = transform(prometheus_tables(answers), panel.get("transformations", []))
    if not frames or not frames[0]:
        return {}
    if len(frames) != 1:
        raise ValueError(f"{panel['title']}: {len(frames)} frames, the trend panel takes one")
    frame, x = frames[0], panel["options"]["xField"]
    return {name: [(xv, yv) for xv, yv in zip(frame[x], ys, strict=True) if yv is not None]
            for name, ys in frame.items() if name != x}


# --- replay -------------------------------------------------------------------------------------------------------


def records(run: str) -> list[str]:
    text = (FIXTURES / run / "combined.log").read_text(encoding="utf-8", errors="replace")
    starts = [0, *(m.start() for m in _RECORD_START.finditer(text))]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True) if b > a]


def replay(paths: dict[str, Path], rate: float) -> None:
    pieces = {run: records(run) for run in paths}
    files = {run: p.open("a", encoding="utf-8") for run, p in paths.items()}
    try:
        for i in range(max(len(v) for v in pieces.values())):
            for run, chunks in pieces.items():
                if i < len(chunks):
                    files[run].write(chunks[i])
                    files[run].flush()
            time.sleep(1.0 / rate)
    finally:
        for f in files.values():
            f.close()


