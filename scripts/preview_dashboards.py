"""Preview the Grafana boards without Grafana: replay real TRL logs into the exporter, let a real Prometheus
scrape it, run every panel's queries over the replay and draw the board (its grid layout, one plot per panel)
as a PNG with matplotlib.

    .venv/bin/python scripts/preview_dashboards.py          # docs/img/{grpo,grpo_saturated,dpo,sft,grpo_by_step}.png
    .venv/bin/python scripts/preview_dashboards.py --runs dpo --rate 40 --out /tmp/img

Needs /usr/bin/prometheus and matplotlib (a dev dependency). The replay appends one log record at a time to
a file the exporter follows (`--rate` records per second; Prometheus scrapes every `--scrape` seconds), so
the series have the run's history; the x axis is the training step (posttrain_step at each sample; for the
step-aligned trend panels, the step the panel's own queries give, joined as Grafana's transformations join them).
Runs of the same board are also drawn together: that board's step-aligned row with the runs overlaid.
The stack helpers here are also used by tests/test_dashboards.py."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_dashboards  # noqa: E402
from loopback import Processes, free_port, http_ready  # noqa: E402

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
    return {name: build() for name, build in gen_dashboards.BOARDS.items()}


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


# --- drawing ------------------------------------------------------------------------------------------------------

COLORS = {"green": "#37872d", "orange": "#fa6400", "red": "#c4162a", "blue": "#1f60c4", "purple": "#8f3bb8",
          "text": "#9e9e9e"}


def _matches(panel: dict, name: str, prop: str) -> Any:
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if re.fullmatch(o["matcher"]["options"], name):
            for p in o["properties"]:
                if p["id"] == prop:
                    return p["value"]
    return None


def draw(board: dict, series: dict[int, list[tuple[str, list[float], list[float]]]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = all_panels(board)
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit = 0.36
    fig = plt.figure(figsize=(18, height * unit + 0.6), dpi=64)
    fig.suptitle(title, fontsize=14, x=0.01, ha="left")
    top = 1 - 0.6 / (height * unit + 0.6)

    def box(p: dict) -> list[float]:
        g = p["gridPos"]
        return [g["x"] / 24 + 0.03, top - (g["y"] + g["h"]) / height * top + 0.035 / (height * unit / 10),
                g["w"] / 24 - 0.045, g["h"] / height * top - 0.06 / (height * unit / 10)]

    for p in panels:
        g = p["gridPos"]
        if p["type"] == "row":
            fig.text(0.005, top - (g["y"] + 0.7) / height * top, p["title"], fontsize=12, weight="bold")
            continue
        rect = box(p)
        if p["type"] == "state-timeline":  # room for the series names
            rect = [rect[0] + 0.06, rect[1], rect[2] - 0.06, rect[3]]
        ax = fig.add_axes(rect)
        ax.set_title(p["title"], fontsize=9, loc="left")
        data = series.get(p["id"], [])
        if p["type"] == "stat":
            ax.axis("off")
            lines = [f"{name}: {ys[-1]:.4g}" for name, _, ys in data if ys] or ["No data"]
            ax.text(0.02, 0.5, "\n".join(lines[:4]), fontsize=11, va="center", ha="left", weight="bold",
                    color="#1f60c4")
        elif p["type"] == "state-timeline":
            options = {}
            for m in p["fieldConfig"]["defaults"].get("mappings", []):
                options.update(m["options"])
            for i, (_name, xs, ys) in enumerate(data):
                for x0, x1, v in zip(xs, [*xs[1:], xs[-1] + 1], ys, strict=True):
                    opt = options.get(str(int(v)) if not math.isnan(v) else "", {})
                    ax.barh(i, x1 - x0, left=x0, height=0.8, color=COLORS.get(opt.get("color", "text"), "#9e9e9e"),
                            linewidth=0)
            seen = {}
            for _, _, ys in data:
                for v in ys:
                    opt = options.get(str(int(v)), {})
                    seen[opt.get("text", str(v))] = COLORS.get(opt.get("color", "text"), "#9e9e9e")
            ax.set_yticks(range(len(data)), [n for n, _, _ in data], fontsize=7)
            ax.tick_params(axis="x", labelsize=7)
            ax.set_xlabel("step", fontsize=7)
            if seen:
                ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in seen.values()],
                          labels=list(seen), fontsize=7, loc="lower right", ncols=min(4, len(seen)), frameon=False,
                          bbox_to_anchor=(1, 1))
            if not data:
                ax.text(0.5, 0.5, "No data", transform=ax.transAxes, ha="center")
        else:
            ax2 = None
            for name, xs, ys in data:
                target = ax
                if _matches(p, name, "custom.axisPlacement") == "right":
                    ax2 = ax2 or ax.twinx()
                    target = ax2
                style = "--" if _matches(p, name, "custom.lineStyle") else "-"
                if _matches(p, name, "custom.axisPlacement") == "right":
                    style = ":"
                color = "#c4162a" if "threshold" in name else None
                target.plot(xs, ys, style, lw=1.1 if color is None else 0.9, label=name, color=color)
            handles = ax.get_legend_handles_labels()
            if ax2:
                h2 = ax2.get_legend_handles_labels()
                handles = (handles[0] + h2[0], handles[1] + h2[1])
                ax2.tick_params(labelsize=7)
            if handles[0]:
                ax.legend(*handles, fontsize=6, loc="upper left", ncols=2, frameon=False)
            else:
                ax.text(0.5, 0.5, "No data", transform=ax.transAxes, ha="center")
            ax.tick_params(labelsize=7)
            ax.set_xlabel("step", fontsize=7)
            ax.grid(alpha=0.3)
    fig.savefig(out, dpi=64)
    plt.close(fig)


def collect_trend(stack: Stack, panel: dict, runs: list[str], start: float, end: float, step: float) -> list:
    """A trend panel's lines for the runs, x being the panel's own x field (the logged step), as Grafana joins it."""
    answers = {tg["refId"]: stack.query_range(substitute(tg["expr"], runs), start, end, step)
               for tg in panel["targets"]}
    return [(name, [x for x, _ in pts], [y for _, y in pts])
            for name, pts in trend_series(panel, answers).items() if pts]


def collect(stack: Stack, board: dict, run: str, start: float, end: float, step: float) -> dict:
    steps = stack.query_range(f'max(posttrain_step{{run="{run}"}})', start, end, step)
    at = {float(ts): float(v) for ts, v in steps[0]["values"]} if steps else {}
    out: dict[int, list] = {}
    for p in all_panels(board):
        if p["type"] == "trend":
            out[p["id"]] = collect_trend(stack, p, [run], start, end, step)
            continue
        for tg in p.get("targets", []):
            result = stack.query_range(substitute(tg["expr"], [run]), start, end, step)
            for s in result:
                pts = [(at[float(ts)], float(v)) for ts, v in s["values"] if float(ts) in at]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    out.setdefault(p["id"], []).append((legend(tg.get("legendFormat", ""), s["metric"]) or tg["refId"],
                                                        list(xs), list(ys)))
    return out


def step_row_board(board: dict) -> dict:
    """The board's step-aligned row alone, moved to the top (to draw several runs overlaid)."""
    row = next(p for p in board["panels"] if p["type"] == "row" and p["title"] == gen_dashboards.STEP_ROW)
    top = row["gridPos"]["y"]

    def moved(p: dict) -> dict:
        return {**p, "gridPos": {**p["gridPos"], "y": p["gridPos"]["y"] - top}}

    return {**board, "panels": [{**moved(row), "panels": [moved(p) for p in row["panels"]]}]}


def draw_overlays(stack: Stack, boards: dict[str, dict], runs: list[str], start: float, end: float, step: float,
                  out_dir: Path) -> None:
    """For each board with several replayed runs: its step-aligned row with those runs overlaid."""
    for name, board in boards.items():
        mine = [r for r in runs if BOARD_FOR[r] == name]
        if len(mine) < 2:
            continue
        sub = step_row_board(board)
        series = {p["id"]: collect_trend(stack, p, mine, start, end, step)
                  for p in all_panels(sub) if p["type"] == "trend"}
        out = out_dir / f"{name}_by_step.png"
        draw(sub, series, f"{board['title']}: runs {', '.join(mine)} overlaid by step", out)
        print(f"{out} {out.stat().st_size // 1024} KiB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=["grpo", "grpo_saturated", "dpo", "sft"],
                    choices=[r for r in BOARD_FOR if r != "ppo"])
    ap.add_argument("--rate", type=float, default=20.0, help="records replayed per second (default 20)")
    ap.add_argument("--scrape", default="200ms", help="Prometheus scrape interval (default 200ms)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = ap.parse_args(argv)
    if shutil.which("prometheus") is None:
        print("prometheus not found on PATH", file=sys.stderr)
        return 2
    boards = load_boards()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="posttrain-preview-") as tmpname:
        tmp = Path(tmpname)
        paths = {run: tmp / f"{run}.log" for run in args.runs}
        for p in paths.values():
            p.touch()
        with Stack(tmp, paths, scrape=args.scrape) as stack:
            stack.wait("exporter scraped", lambda: stack.query("up == 1"), 30)
            start = time.time()
            writer = threading.Thread(target=replay, args=(paths, args.rate))
            writer.start()
            writer.join()
            time.sleep(3)  # a few more scrapes after the last record
            end = time.time()
            step = max(float(args.scrape.rstrip("ms")) / (1000 if args.scrape.endswith("ms") else 1), 0.05)
            for run in args.runs:
                board = boards[BOARD_FOR[run]]
                series = collect(stack, board, run, start, end, step)
                out = args.out / f"{run}.png"
                draw(board, series, f"{board['title']}  (run: {run}, real TRL fixture replayed)", out)
                print(f"{out} {out.stat().st_size // 1024} KiB")
            draw_overlays(stack, boards, args.runs, start, end, step, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
