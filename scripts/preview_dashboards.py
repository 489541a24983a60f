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
The stack, the replay and Grafana's transformations are tests/support/boards.py, shared with the tests."""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.boards import (  # noqa: E402  (the stack and Grafana's transformations, shared with the tests)
    BOARD_FOR,
    Stack,
    all_panels,
    legend,
    load_boards,
    replay,
    substitute,
    trend_series,
)

from exporter.dashboards.builders import STEP_ROW  # noqa: E402

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
    row = next(p for p in board["panels"] if p["type"] == "row" and p["title"] == STEP_ROW)
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
