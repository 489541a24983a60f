"""Detection benchmark: every labelled run replayed through the real exporter, Prometheus with the project's
rules and Alertmanager, with time scaled so that one logged step stands for 60 seconds.

Each run's console log (tests/fixtures/corpus and tests/fixtures/trl) is written to a file the exporter
follows, one logged step per `--step-seconds` of real time (default 1 s: one minute per second), all runs at
once into one exporter. Every wall-clock duration of the stack shrinks by the same factor: the rules'
keep_firing_for and ranges (generated at that scale), the scrape and evaluation interval (15 s -> 0.25 s),
Alertmanager's waits, the exporter's stall threshold. Afterwards the benchmark reads from Prometheus when
each alert first fired and which step the run was at, and from the webhook which notifications reached the
pager and the chat.

Per run it prints the labelled onsets (tests/support/labels.py), the first alert on each pathology's
instruments (step, name, severity, logged steps after the onset) and every alert raised on a healthy run,
then the median and worst delay over all labelled pathologies, and with --write it puts the table into
bench/README.md. --in-process judges the same runs with the exporter's detectors read in process (their episodes,
what the rules read; tests/test_detection.py checks the two agree), in seconds and without the stack.

    .venv/bin/python bench/detection.py                 # all labelled runs, ~12 minutes
    .venv/bin/python bench/detection.py --only grpo_kl_blowup,grpo_healthy --step-seconds 0.5
    .venv/bin/python bench/detection.py --write         # and update bench/README.md
    .venv/bin/python bench/detection.py --in-process    # the detectors' own episodes, seconds
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from support.corpus import CAUGHT_BY, PAGE_WORTHY, WITHIN_STEPS, LabelledRun, labelled_runs, within  # noqa: E402
from support.labels import load_records  # noqa: E402
from support.loopback import Processes, free_port, http_ready  # noqa: E402
from support.stack import Stack, server_commands, webhook, write_configs  # noqa: E402

from exporter.parsers.chain import LineParserChain  # noqa: E402
from exporter.parsers.record import RecordKind  # noqa: E402

MODELED_STEP_SECONDS = 60.0  # one logged step stands for a minute of a real run
MODELED_SCRAPE_SECONDS = 15.0
README = REPO / "bench" / "README.md"
BEGIN, END = "<!-- detection:begin -->", "<!-- detection:end -->"


# --- the replay ---------------------------------------------------------------------------------------------


def chunks(log: Path) -> list[str]:
    """The log cut before each training record line: chunk i holds record i and what follows it up to the next
    record (its progress-bar redraw, the next step's bar draws), so a record never waits for its redraw."""
    text = log.read_text(encoding="utf-8", errors="replace")
    parser = LineParserChain()
    cuts, pos = [0], 0
    for line in text.splitlines(keepends=True):
        rec = None
        for part in re.split(r"[\r]", line):
            try:
                rec = rec or parser.parse(part.strip())
            except Exception:
                rec = None
        if rec is not None and rec.kind is RecordKind.TRAIN and pos:
            cuts.append(pos)
        pos += len(line)
    cuts.append(len(text))
    out = [text[a:b] for a, b in itertools.pairwise(cuts) if b > a]
    return [out[0] + out[1], *out[2:]] if len(out) > 1 else out  # the head goes with the first record


@dataclass
class Replay:
    run: LabelledRun
    path: Path
    parts: list[str]
    written: int = 0


def replay(replays: list[Replay], step_seconds: float, stop: threading.Event) -> None:
    t0 = time.monotonic()
    tick = 0
    while not stop.is_set() and any(r.written < len(r.parts) for r in replays):
        for r in replays:
            if r.written < len(r.parts):
                with r.path.open("a", encoding="utf-8") as f:
                    f.write(r.parts[r.written])
                r.written += 1
        tick += 1
        stop.wait(max(0.0, t0 + tick * step_seconds - time.monotonic()))


# --- reading the outcome ------------------------------------------------------------------------------------


@dataclass
class Alert:
    run: str
    name: str
    severity: str
    instrument: str
    first: float  # unix time it first fired
    step: int  # the run's step then
    episodes: int  # separate firing periods
    last_step: int  # the run's step when it last fired
    periods: list[tuple[int, int]] = field(default_factory=list)  # (first step, last step) of each period


@dataclass
class Outcome:
    run: LabelledRun
    alerts: list[Alert] = field(default_factory=list)
    notified: dict[str, list[str]] = field(default_factory=dict)  # receiver -> alert names notified


def firing(stack: Stack, start: float, end: float, step: float) -> list[Alert]:
    """Every alert that fired, its first firing time, the step its run was at then, its firing periods."""
    out = []
    steps = {s["metric"]["run"]: [(float(t), float(v)) for t, v in s["values"]]
             for s in stack.query_range("posttrain_step", start, end, step)}
    for s in stack.query_range('ALERTS{alertstate="firing"}', start, end, step):
        m = s["metric"]
        times = [float(t) for t, _ in s["values"]]
        run_steps = steps.get(m.get("run", ""), [])

        def step_at(when: float, run_steps=run_steps) -> int:
            at = [v for t, v in run_steps if t <= when]
            return int(at[-1]) if at else -1

        cuts = [0] + [i + 1 for i, (a, b) in enumerate(itertools.pairwise(times)) if b - a > 1.5 * step]
        periods = [(step_at(times[a]), step_at(times[b - 1])) for a, b in zip(cuts, [*cuts[1:], len(times)],
                                                                              strict=True)]
        out.append(Alert(m.get("run", ""), m["alertname"], m["severity"], m.get("instrument", ""), times[0],
                         periods[0][0], len(periods), periods[-1][1], periods))
    return out


def logged_delay(run: LabelledRun, onset: int, step: int) -> int:
    steps = sorted({int(e["step"]) for e in load_records(run.trainer_state)})
    if step >= onset:
        return sum(1 for s in steps if onset < s <= step)
    return -sum(1 for s in steps if step < s <= onset)


def verdicts(o: Outcome) -> list[dict]:
    """One row per labelled pathology (or one for a healthy run)."""
    rows = []
    if o.run.healthy:
        rows.append({"run": o.run.name, "pathology": "healthy", "onset": None,
                     "alerts": [f"{a.name} ({a.severity}) at step {a.step}" for a in o.alerts],
                     "ok": not o.alerts})
        return rows
    for pathology, onset in sorted(o.run.onsets.items(), key=lambda kv: kv[1]):
        # the firing periods on the pathology's instruments that were still firing at its onset or came later
        # (a period that ended before the onset is not an early warning of it)
        caught = sorted(((a, p) for a in o.alerts if a.instrument in CAUGHT_BY[pathology] for p in a.periods
                         if p[1] >= onset), key=lambda ap: ap[1][0])
        pages = [(a, p) for a, p in caught if a.severity == "critical"]
        first, page = (caught[0] if caught else None), (pages[0] if pages else None)
        d = logged_delay(o.run, onset, first[1][0]) if first else None
        dp = logged_delay(o.run, onset, page[1][0]) if page else None
        ok = d is not None and d <= within(pathology) and (pathology not in PAGE_WORTHY or (
            dp is not None and dp <= within(pathology)))
        rows.append({"run": o.run.name, "pathology": pathology, "onset": onset,
                     "first": f"{first[0].name} ({first[0].severity}) at step {first[1][0]}" if first else "none",
                     "delay": d, "page": f"{page[0].name} at step {page[1][0]}" if page else "none",
                     "page_delay": dp, "page_worthy": pathology in PAGE_WORTHY, "ok": ok,
                     "within_10": d is not None and d <= WITHIN_STEPS,
                     "others": sorted({a.name for a in o.alerts} - {a.name for a, _ in caught})})
    return rows


def in_process(runs: list[LabelledRun]) -> list[Outcome]:
    """Each run read to its end by the exporter in process; its detectors' episodes as the alerts' firing periods
    (an alert fires from the step its detector became active until it cleared)."""
    from support.judge import findings, read_log

    out = []
    for r in runs:
        state = read_log(r.log, r.name)
        by_alert: dict[tuple[str, str | None], Alert] = {}
        for f in findings(state):
            period = (f.start, f.end if f.end is not None else state.step)
            a = by_alert.get((f.alert, f.component))
            if a is None:
                by_alert[f.alert, f.component] = Alert(r.name, f.alert, f.severity, f.instrument, 0.0, f.start, 1,
                                                       period[1], [period])
            else:
                a.periods.append(period)
                a.episodes, a.last_step = a.episodes + 1, max(a.last_step, period[1])
        out.append(Outcome(r, list(by_alert.values())))
    return out


def delay_summary(rows: list[dict]) -> str:
    """The median and worst delay (logged steps from the labelled onset to the first alert on the pathology's
    instruments; an alert already firing at the onset counts 0) over every labelled pathology."""
    sick = [r for r in rows if r["pathology"] != "healthy"]
    delays = sorted(max(r["delay"], 0) for r in sick if r["delay"] is not None)
    missed = sum(r["delay"] is None for r in sick)
    if not delays:
        return "no labelled pathology was caught."
    worst = max(sick, key=lambda r: -1 if r["delay"] is None else r["delay"])
    return (f"Delay over {len(sick)} labelled pathologies in {len({r['run'] for r in sick})} runs: median "
            f"{statistics.median(delays):g} logged steps, worst {delays[-1]} ({worst['run']}, {worst['pathology']})"
            + (f"; {missed} never caught" if missed else "") + ".")


def table(rows: list[dict]) -> str:
    lines = ["| run | pathology (onset) | first alert on its instruments | delay | page | delay | other alerts | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["pathology"] == "healthy":
            alerts = "; ".join(r["alerts"]) or "none"
            lines.append(f"| {r['run']} | healthy | {alerts} | | | | | {'yes' if r['ok'] else 'NO'} |")
            continue
        page = r["page"] if r["page_worthy"] or r["page"] != "none" else "(warning expected)"
        pd = "" if r["page_delay"] is None else r["page_delay"]
        d = "" if r["delay"] is None else r["delay"]
        ok = "NO" if not r["ok"] else "yes" if r["within_10"] else f"yes (<= {within(r['pathology'])})"
        lines.append(f"| {r['run']} | {r['pathology']} ({r['onset']}) | {r['first']} | {d} | {page} | {pd} | "
                     f"{', '.join(r['others']) or ''} | {ok} |")
    return "\n".join(lines)


# --- the run ------------------------------------------------------------------------------------------------


def run_benchmark(runs: list[LabelledRun], step_seconds: float, workdir: Path) -> list[Outcome]:
    scale = step_seconds / MODELED_STEP_SECONDS
    scrape = MODELED_SCRAPE_SECONDS * scale
    ports = {name: free_port() for name in ("exporter", "prometheus", "alertmanager")}
    logs = workdir / "logs"
    logs.mkdir()
    replays = [Replay(r, logs / f"{r.name}.log", chunks(r.log)) for r in runs]
    for r in replays:
        r.path.write_text("")
    (workdir / "exporter.yml").write_text(yaml.safe_dump({
        "poll_interval_seconds": min(0.1, scrape / 2),
        "logs": [{"path": str(r.path), "run": r.run.name} for r in replays],
        "thresholds": {"stall_seconds": 1800 * scale},
    }))
    with webhook() as hook, Processes(workdir, REPO) as procs:
        write_configs(workdir, ports, hook, scrape, scale)
        exporter = procs.start("exporter", [sys.executable, "-m", "exporter", "serve", "--no-gpu", "--config",
                                            str(workdir / "exporter.yml"), "--listen-address",
                                            f"127.0.0.1:{ports['exporter']}"])
        servers = {n: procs.start(n, cmd) for n, cmd in server_commands(workdir, ports).items()}
        for n, p in servers.items():
            procs.wait(f"{n} ready", lambda n=n, p=p: p.poll() is None and http_ready(ports[n]), 30)
        procs.wait("exporter ready", lambda: exporter.poll() is None and http_ready(ports["exporter"], "/healthz"), 30)
        stack = Stack(workdir, ports)
        procs.wait("rules loaded", lambda: len(stack.prometheus("/api/v1/rules")["groups"]) >= 3, 30)
        start = time.time()
        stop = threading.Event()
        writer = threading.Thread(target=replay, args=(replays, step_seconds, stop), daemon=True)
        writer.start()
        longest = max(len(r.parts) for r in replays)
        print(f"replaying {len(replays)} runs, up to {longest} logged steps, {step_seconds:g} s per step",
              file=sys.stderr)
        writer.join(timeout=longest * step_seconds * 3 + 60)
        stop.set()
        time.sleep(max(5 * step_seconds, 2.0))  # the last evaluations and notifications
        end = time.time()
        assert exporter.poll() is None, procs.tails()
        alerts = firing(stack, start, end, scrape)
        notes = hook.notifications()
    out = []
    for r in runs:
        o = Outcome(r, [a for a in alerts if a.run == r.name])
        for _, receiver, a in notes:
            if a["labels"].get("run") == r.name and a["status"] == "firing":
                o.notified.setdefault(receiver, [])
                if a["labels"]["alertname"] not in o.notified[receiver]:
                    o.notified[receiver].append(a["labels"]["alertname"])
        out.append(o)
    return out


def write_readme(text: str) -> None:
    readme = README.read_text(encoding="utf-8")
    if BEGIN in readme:
        head, rest = readme.split(BEGIN, 1)
        readme = head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1]
    else:
        readme = readme.rstrip() + "\n\n" + BEGIN + "\n" + text + "\n" + END + "\n"
    README.write_text(readme, encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-seconds", type=float, default=1.0, help="real seconds per logged step (default 1)")
    ap.add_argument("--only", default="", help="comma-separated run names")
    ap.add_argument("--write", action="store_true", help="put the table into bench/README.md")
    ap.add_argument("--json", type=Path, help="write the rows as JSON")
    ap.add_argument("--in-process", action="store_true", help="the detectors' episodes in process, no stack")
    args = ap.parse_args()
    runs = labelled_runs()
    if args.only:
        wanted = set(args.only.split(","))
        runs = [r for r in runs if r.name in wanted]
    t0 = time.monotonic()
    if args.in_process:
        outcomes = in_process(runs)
    else:
        with tempfile.TemporaryDirectory(prefix="posttrain-detection-") as tmp:
            outcomes = run_benchmark(runs, args.step_seconds, Path(tmp))
    took = time.monotonic() - t0
    rows = [row for o in outcomes for row in verdicts(o)]
    pages = {o.run.name: o.notified.get("pager", []) for o in outcomes}
    text = table(rows)
    sick = [r for r in rows if r["pathology"] != "healthy"]
    summary = (f"{sum(r['ok'] for r in rows)} of {len(rows)} rows as required; {sum(r['within_10'] for r in sick)} "
               f"of {len(sick)} pathologies caught within {WITHIN_STEPS} logged steps; "
               f"{sum(len(r['alerts']) for r in rows if r['pathology'] == 'healthy')} alerts on "
               f"{sum(r['pathology'] == 'healthy' for r in rows)} healthy runs. " + delay_summary(rows))
    print(text)
    print(summary)
    print("pages that reached the pager webhook:", json.dumps({k: v for k, v in pages.items() if v}))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "pages": pages}, indent=1))
    if args.write and not args.in_process:
        machine = f"{platform.machine()}, Python {platform.python_version()}"
        write_readme(f"Measured by `.venv/bin/python bench/detection.py --step-seconds {args.step_seconds:g} --write` "
                     f"({machine}; {took / 60:.1f} minutes; one logged step = 60 s of a modeled run, "
                     f"{args.step_seconds:g} s of real time).\n\n{text}\n\n{summary}\n\nPages that reached the "
                     f"pager webhook through Alertmanager: "
                     + ("; ".join(f"{k}: {', '.join(v)}" for k, v in pages.items() if v) or "none") + ".")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
