"""What the model wrote: the trainers' printed completions read into per-step sample sets (exporter/samples), their
diversity as series, on the real labelled runs that print them (tests/fixtures/corpus/grpo_samples_healthy,
grpo_template_collapse, grpo_brevity_collapse) and on streams of the trainers' shapes."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from conftest import REPO, require_binary, require_module, run_cli
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry
from support.judge import findings, read_log
from support.sample_labels import template_onset

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.exposition.collector import ExporterCollector
from exporter.samples import parquet
from exporter.samples.diversity import diversity
from exporter.samples.panels import PanelReader
from exporter.samples.reader import SampleReader
from exporter.samples.sampleset import Sample, SampleSet, normal

CORPUS = REPO / "tests" / "fixtures" / "corpus"
SAMPLE_RUNS = ("grpo_samples_healthy", "grpo_template_collapse", "grpo_brevity_collapse")


def _lines(path: Path) -> list[str]:
    return re.split(r"[\r\n]", path.read_text(encoding="utf-8"))


def _sets(path: Path) -> list[SampleSet]:
    reader = SampleReader()
    return [s for line in _lines(path) if (s := reader.line(line)) is not None]


def _stream(tmp_path: Path, text: str, name: str = "run"):
    log = tmp_path / f"{name}.log"
    log.write_text(text, encoding="utf-8")
    return read_log(log, name)


def _diversity_series(state) -> dict[str, list[tuple[int, float]]]:
    state.refresh()
    out = {}
    for (inst, sub), s in state.series.items():
        if inst == "completion_diversity":
            out[sub] = s.history
    return out


# --- TRL's rich panels, on the real runs --------------------------------------------------------------------------


@pytest.mark.parametrize("run", SAMPLE_RUNS)
def test_every_logged_step_is_one_set_of_all_its_rows(run: str) -> None:
    """200 logged steps, 200 sets of 16 rows; the last panel, printed again after the summary, is read once."""
    reader = SampleReader()
    sets = [s for line in _lines(CORPUS / run / "combined.log") if (s := reader.line(line)) is not None]
    assert [s.step for s in sets] == list(range(1, 201))
    assert {len(s.samples) for s in sets} == {16}
    assert reader.repeats == 1


def test_the_panels_give_the_trainers_own_rows() -> None:
    """Wrapped cells joined, the cut reward header kept as printed, numbers as printed (2 decimals): the rows of the
    trainer's parquet file of the same step (written beside the table by TRL)."""
    require_module("pyarrow", "parquet")
    folder = CORPUS / "grpo_samples_healthy" / "completions"
    by_step = {s.step: s for s in _sets(CORPUS / "grpo_samples_healthy" / "combined.log")}
    kept = parquet.files(folder)
    assert [step for step, _ in kept] == [1, 100, 200]
    for step, path in kept:
        truth, printed = parquet.read_file(path, step), by_step[step]
        assert [(x.prompt, normal(x.completion)) for x in printed.samples] == \
               [(x.prompt, normal(x.completion)) for x in truth.samples]
        assert printed.samples[0].completion.startswith(" The")  # the completion's own leading space is kept
        for p, t in zip(printed.samples, truth.samples, strict=True):
            assert p.advantage == pytest.approx(t.advantage, abs=0.006)
            assert list(p.rewards) == ["format_reward", "closeness_r…"]  # as printed: cut to the column
            assert list(p.rewards.values()) == pytest.approx(list(t.rewards.values()), abs=0.006)


@pytest.mark.parametrize("run", SAMPLE_RUNS)
def test_the_labels_read_from_the_printed_tables_are_the_collected_ones(run: str) -> None:
    """The labelling rule on what the exporter reads from the log gives the onset collected from the parquet rows."""
    meta = json.loads((CORPUS / run / "run.json").read_text())
    tables = [(s.step, [(x.prompt, x.completion) for x in s.samples]) for s in _sets(CORPUS / run / "combined.log")]
    assert template_onset(tables) == meta["sample_onsets"].get("template_collapse")


def test_dump_has_the_diversity_series_and_never_the_text(tmp_path: Path) -> None:
    state = read_log(CORPUS / "grpo_template_collapse" / "combined.log", "tc")
    series = _diversity_series(state)
    assert set(series) == {"distinct_share", "top_share", "top_prompts", "top_prompt_share", "distinct_2gram",
                           "similarity", "rows", "prompts"}
    share = dict(series["top_share"])
    assert len(share) == 200
    assert sum(share[s] for s in range(1, 21)) / 20 < 0.3 and sum(share[s] for s in range(181, 201)) / 20 >= 0.9
    res = run_cli("dump", "--no-gpu", "--run", "tc", str(CORPUS / "grpo_template_collapse" / "combined.log"))
    assert res.returncode == 0, res.stderr
    text = res.stdout.decode()
    assert 'posttrain_completion_diversity{run="tc",stat="top_share"} 1.0' in text
    assert 'posttrain_completion_diversity{run="tc",stat="distinct_share"} 0.0625' in text
    assert "answer" not in text and "What is" not in text  # numbers only: no prompt, no completion


def test_completions_of_one_form_that_differ_where_it_matters_are_diverse() -> None:
    """The healthy run answers ' The answer is N.' throughout: one form, many answers. No template is found."""
    sets = _sets(CORPUS / "grpo_samples_healthy" / "combined.log")
    form = re.compile(r"The answer is \d+\.")
    rows = [x.completion for s in sets[100:] for x in s.samples]
    assert sum(bool(form.fullmatch(normal(c))) for c in rows) > 0.9 * len(rows)
    assert max(diversity(s)["top_share"] for s in sets[100:]) <= 0.5
    assert findings(read_log(CORPUS / "grpo_samples_healthy" / "combined.log")) == []


@pytest.mark.parametrize(("run", "label"), [("grpo_template_collapse", 74), ("grpo_brevity_collapse", 67)])
def test_template_collapse_fires_within_ten_logged_steps(run: str, label: int) -> None:
    """On the labelled runs (test_detection.py judges it on every run too, through the real rules as well)."""
    fs = [f for f in findings(read_log(CORPUS / run / "combined.log")) if f.detector == "template_collapse"]
    caught = [f for f in fs if f.end is None or f.end > label]
    assert caught and 0 <= min(f.start for f in caught) - label <= 10, fs


# --- shapes of the stream ------------------------------------------------------------------------------------------


def _trl_panel(width: int, step: int, prompts: list[str], completions: list[str]) -> str:
    """TRL's own printing function, at a given terminal width."""
    require_module("rich", "trl-test")
    require_module("trl", "trl-test")
    import os

    from trl.trainer.utils import print_prompt_completions_sample

    os.environ["COLUMNS"] = str(width)
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            print_prompt_completions_sample(prompts, completions, {"correctness_reward_function": [1.0] * len(prompts),
                                                                  "format": [0.5] * len(prompts)},
                                            [0.25] * len(prompts), step, extra={"source": ["gsm8k"] * len(prompts)})
    finally:
        del os.environ["COLUMNS"]
    return buf.getvalue()


def test_panels_at_other_widths_and_cut_headers() -> None:
    prompts = ["Solve: a train leaves at 3pm going 60 km/h; when does it arrive 150 km away?", "What is 2 plus 2?"]
    completions = [" It arrives at 5:30 pm because 150 / 60 = 2.5 hours.", " The answer is 4."]
    reader = SampleReader()
    got = []
    for width, step in ((120, 1), (60, 2), (200, 3)):
        for line in _trl_panel(width, step, prompts, completions).splitlines():
            if (s := reader.line(line)) is not None:
                got.append((width, s))
    assert [s.step for _, s in got] == [1, 2, 3]
    for width, s in got:
        if width == 60:  # rich cuts a word longer than its column with an ellipsis: what is left is read
            for x, prompt, completion in zip(s.samples, prompts, completions, strict=True):
                for read, full in ((x.prompt, prompt), (x.completion, completion)):
                    assert re.fullmatch(".*?".join(map(re.escape, normal(read).split("…"))), normal(full)), read
            assert "…" in s.samples[0].completion
        else:
            assert [normal(x.prompt) for x in s.samples] == prompts, width
            assert [normal(x.completion) for x in s.samples] == [normal(c) for c in completions], width
        assert [x.advantage for x in s.samples] == [0.25, 0.25], width
        assert [list(x.rewards.values()) for x in s.samples] == [[1.0, 0.5]] * 2, width  # extras are no rewards
    narrow = got[1][1].samples[0].rewards
    assert any(k.endswith("…") for k in narrow), narrow  # the 60-column table cuts the long reward name


def test_a_panel_glued_after_the_bar_and_a_buffered_dict(tmp_path: Path) -> None:
    """In a `> log 2>&1` capture the metric dict lands glued after the bar's draw, the panel after it; unbuffered, the
    panel's top line is glued to the bar. Both give the step's record and its set."""
    panel = _trl_panel(80, 5, ["What is 1 plus 2?", "What is 3 plus 3?"], [" The answer is 3.", " The answer is 6."])
    top, rest = panel.split("\n", 1)
    bar = "\r  2%|▎         | 5/200 [00:01<00:40,  4.90it/s]"
    buffered = (f"{bar}{{'loss': '0.01', 'grad_norm': '0.5', 'reward': '1.5', 'epoch': '0.01'}}\n{panel}"
                f"{bar}\r  3%|▎         | 6/200 [00:01<00:40,  4.90it/s]\n")
    glued = f"{{'loss': '0.01', 'reward': '1.5', 'epoch': '0.01'}}\n{bar}{top}\n{rest}"
    for name, text in (("buffered", buffered), ("glued", glued)):
        state = _stream(tmp_path, text, name)
        assert state.samples.total_sets == 1, name
        assert state.samples.at(5).samples[1].completion == " The answer is 6."
        series = _diversity_series(state)
        assert series["distinct_share"] == [(5, 1.0)], name
        state.refresh()
        assert state.passthrough["reward"] == 1.5, name


def test_a_broken_panel_is_counted_and_the_next_one_read(tmp_path: Path) -> None:
    good = _trl_panel(80, 7, ["What is 1 plus 2?", "What is 3 plus 3?"], [" 3", " 6"])
    lines = _trl_panel(80, 6, ["What is 1 plus 2?", "What is 3 plus 3?"], [" 3", " 6"]).splitlines()
    row = next(i for i, line in enumerate(lines) if "What is 1" in line)
    cut = lines[row].index("│", 3)
    lines[row] = lines[row][:cut] + lines[row][cut + 1 :]  # a row that lost a column separator
    ex = Exporter(Config(), [LogSpec(str(tmp_path / "b.log"), "b")])
    (tmp_path / "b.log").write_text("\n".join(lines) + "\n" + good, encoding="utf-8")
    ex.read_to_end()
    state = ex.runs["b"]
    assert [s for s in state.samples.sets] == [7]
    stats = ex.stats["b"] if hasattr(ex, "stats") else None
    text = _scrape(ex)
    assert re.search(r'posttrain_exporter_parse_errors_total\{format="trl_panel",reason="broken_panel",run="b"\} 1',
                     text), stats


def _scrape(ex: Exporter) -> str:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(ex))
    return generate_latest(registry).decode()


def test_another_rich_panel_titled_step_is_no_sample_set() -> None:
    reader = PanelReader()
    text = ["╭──── Step 3 ────╮", "│ just a message │", "╰────────────────╯"]
    assert [reader.line(t) for t in text] == [None, None, None]


# --- verl's printed samples (a stream of the naive reward manager's shape, our own values) ---------------------------

VERL = """\
(TaskRunner pid=4242) [prompt] <|im_start|>user
(TaskRunner pid=4242) How many legs do 3 spiders have? Think step by step.<|im_end|>
(TaskRunner pid=4242) [response] Each spider has 8 legs.
(TaskRunner pid=4242) 3 x 8 = 24. #### 24
(TaskRunner pid=4242) [ground_truth] 24
(TaskRunner pid=4242) [score] 1.0
(TaskRunner pid=4242) [prompt] <|im_start|>user
(TaskRunner pid=4242) What is 12 minus 5?<|im_end|>
(TaskRunner pid=4242) [response] #### 24
(TaskRunner pid=4242) [ground_truth] 7
(TaskRunner pid=4242) [score] 0.0
(TaskRunner pid=4242) step:1 - actor/entropy:0.61 - critic/score/mean:0.5 - response_length/mean:40.5
(WorkerDict pid=4300) a worker's warning with [brackets]
(TaskRunner pid=4242) [prompt] What is 2 plus 2?
(TaskRunner pid=4242) [response] #### 24
(TaskRunner pid=4242) [ground_truth] 4
(TaskRunner pid=4242) [score] 0.0
(TaskRunner pid=4242) [acc] False
(TaskRunner pid=4242) [prompt] What is 6 times 4?
(TaskRunner pid=4242) [response] #### 24
(TaskRunner pid=4242) [ground_truth] 24
(TaskRunner pid=4242) [score] 1.0
(TaskRunner pid=4242) [acc] True
(TaskRunner pid=4242) step:2 - actor/entropy:0.40 - critic/score/mean:0.5 - response_length/mean:4.0
"""


def test_verl_samples_are_the_set_of_the_step_line_that_follows(tmp_path: Path) -> None:
    state = _stream(tmp_path, VERL, "verl")
    one, two = state.samples.at(1), state.samples.at(2)
    assert (one.step, one.source, two.step) == (1, "verl", 2)
    assert one.samples[0].completion == "Each spider has 8 legs.\n3 x 8 = 24. #### 24"
    assert one.samples[0].prompt.endswith("Think step by step.<|im_end|>")
    assert one.samples[1].rewards == {"score": 0.0}
    assert two.samples[0].rewards == {"score": 0.0, "acc": 0.0} and two.samples[1].rewards["acc"] == 1.0
    series = _diversity_series(state)
    assert series["distinct_share"] == [(1, 1.0), (2, 0.5)]
    assert series["top_prompt_share"] == [(1, 0.5), (2, 1.0)]
    state.refresh()
    assert state.passthrough["actor/entropy"] == pytest.approx(0.40)


# --- the numbers ---------------------------------------------------------------------------------------------------


def test_diversity_of_a_small_set() -> None:
    rows = [("p1", "The answer is 7."), ("p1", "The answer is 7."), ("p2", "The  answer is 7."), ("p3", "Seven"),
            ("p3", "")]
    d = diversity(SampleSet(1, "t", tuple(Sample(p, c) for p, c in rows)))
    assert d["distinct_share"] == pytest.approx(3 / 5)
    assert d["top_share"] == pytest.approx(3 / 5)
    assert d["top_prompts"] == 2 and d["prompts"] == 3 and d["rows"] == 5
    assert d["top_prompt_share"] == pytest.approx(2 / 3)
    # bigrams: 3 x 5 of the template (5 distinct), ("<s>","Seven"), ("Seven","</s>"), ("<s>","</s>")
    assert d["distinct_2gram"] == pytest.approx(8 / 18)
    # word sets: A={The,answer,is,7.} x3, B={Seven}, C={}: pairs AA 3 x 1.0, AB 3 x 0, AC 3 x 0, BC 0
    assert d["similarity"] == pytest.approx(3 / 10)
    one_prompt = diversity(SampleSet(1, "t", (Sample("p", "a"), Sample("p", "a"))))
    assert math.isnan(one_prompt["top_prompt_share"])  # one prompt's answers agreeing is no template


def test_parquet_folder_reads_every_kept_step() -> None:
    require_module("pyarrow", "parquet")
    sets = list(parquet.read_folder(CORPUS / "grpo_template_collapse" / "completions"))
    assert [s.step for s in sets] == [1, 100, 200]
    assert all(len(s.samples) == 16 for s in sets)
    assert {normal(x.completion) for x in sets[-1].samples} == {"The answer is 7."}
    assert list(sets[0].samples[0].rewards) == ["seven_reward"]


# --- the report --------------------------------------------------------------------------------------------------


def _hostile_log(tmp_path: Path) -> Path:
    """Three logged steps whose printed completions are markup: the report must show them as text."""
    out = []
    for step in (1, 2, 3):
        out.append(f"{{'loss': '0.1', 'reward': '0.{step}', 'epoch': '0.0{step}'}}\n")
        out.append(_trl_panel(100, step, ["Say <b>hi</b> & bye", "What is 1 plus 1?"],
                              [" <script> alert(1) </script>", " </td></table> <h1>x</h1>"]))
    log = tmp_path / "hostile.log"
    log.write_text("".join(out), encoding="utf-8")
    return log


def test_text_and_json_reports_show_samples_at_the_finding_and_the_end() -> None:
    res = run_cli("report", str(CORPUS / "grpo_brevity_collapse" / "combined.log"))
    text = res.stdout.decode()
    block = text[text.index("  samples (printed by the trainer"):]
    assert "first step of PostTrainTemplateCollapse" in block and ", end:" in block and "best step" in block
    end = block[block.index(", end:"):]
    assert "completion:    [brevity_reward=0" in end  # the collapsed run's empty answers, shown as empty
    res = run_cli("report", "--format", "json", str(CORPUS / "grpo_template_collapse" / "combined.log"))
    views = json.loads(res.stdout)["runs"][0]["samples"]
    assert views[-1]["why"] == "end" and views[-1]["shown_step"] == 200
    assert {normal(r["completion"]) for r in views[-1]["rows"]} == {"The answer is 7."}
    assert len({r["prompt"] for r in views[-1]["rows"]}) == 4  # one row per prompt: the same answer to each


def test_the_html_report_shows_the_completions_escaped_in_a_browser(tmp_path: Path) -> None:
    chromium = require_binary("chromium")
    page = tmp_path / "report.html"
    r = run_cli("report", str(CORPUS / "grpo_template_collapse" / "combined.log"), str(_hostile_log(tmp_path)),
                "--format", "html", "--out", str(page))
    assert r.returncode == 0, r.stderr.decode()
    text = page.read_text()
    assert "<script" not in text and "&lt;script&gt; alert(1) &lt;/script&gt;" in text
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, timeout=120).stdout.decode()
    assert "<script" not in dom and "<h1>x</h1>" not in dom  # parsed as text, not as markup
    assert "&lt;script&gt; alert(1) &lt;/script&gt;" in dom and "Say &lt;b&gt;hi&lt;/b&gt; &amp; bye" in dom
    assert dom.count('<table class="samples">') >= 4 and "first step of PostTrainTemplateCollapse" in dom
    assert dom.count(" The answer is 7.") >= 8
    shot = tmp_path / "samples.png"
    subprocess.run([*flags, "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
    if os.environ.get("KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["KEEP_SCREENSHOT"])


def test_a_hostile_panel_costs_bounded_memory_and_time() -> None:
    """A table that never ends, with one cell of 200,000 one-character lines and 20,000 rows: the kept text is cut,
    the reading stays linear, and the next real panel is read."""
    import time

    from exporter.samples import panels

    reader = SampleReader()
    head = ["╭──── Step 1 ────╮", "│ ┏━━━━━━━━┳━━━━━━━━━━━━┓ │", "│ ┃ Prompt ┃ Completion ┃ │",
            "│ ┡━━━━━━━━╇━━━━━━━━━━━━┩ │"]
    t = time.perf_counter()
    for line in head:
        reader.line(line)
    for _ in range(200_000):
        reader.line("│ │ x      │ y          │ │")
    for _ in range(20_000):
        reader.line("│ ├────────┼────────────┤ │")
        reader.line("│ │ p      │ q          │ │")
    got = reader.line("╰──────────────────╯")
    assert time.perf_counter() - t < 20
    assert got is not None and len(got.samples) == panels.MAX_ROWS
    assert len(got.samples[0].prompt) <= panels.MAX_CELL
    again = [s for line in _trl_panel(80, 2, ["a b", "c d"], [" e", " f"]).splitlines() if (s := reader.line(line))]
    assert [s.step for s in again] == [2]


def test_a_log_of_completion_samples_only_is_no_data_and_says_why(tmp_path: Path) -> None:
    """The trainer's metric records filtered out of a real log, its completion panels left: the diversity of each set
    is a record at its step, but no metric of the training's was read, so the run is no_data (never healthy), and
    the hint says that only samples were read."""
    text = (CORPUS / "grpo_samples_healthy" / "combined.log").read_text(encoding="utf-8")
    kept = "".join(ln for ln in text.splitlines(keepends=True) if "{'loss'" not in ln and "'train_runtime'" not in ln)
    assert kept.count("\n") < text.count("\n")
    log = tmp_path / "panels.log"
    log.write_text(kept, encoding="utf-8")
    r = run_cli("report", str(log), "--output.format", "json")
    assert r.returncode == 0, r.stderr
    (one,) = json.loads(r.stdout)["runs"]
    assert one["read"]["records"].get("samples", 0) > 10, one["read"]
    assert one["verdict"] == "no_data" and one["read"]["training_records"] == 0, one["read"]
    text = run_cli("report", str(log)).stdout.decode()
    assert text.startswith("run panels: NO DATA") and "try: only completion samples were read" in text, text[:800]


def _dropped(ex: Exporter, run: str) -> dict[str, float]:
    text = _scrape(ex)
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'posttrain_exporter_lines_dropped_total\{{reason="(\w+)",run="{run}"\}} ([0-9.e+]+)', text)}


def test_what_the_sample_readers_leave_out_is_counted(tmp_path: Path, monkeypatch) -> None:
    """Right or loud: a panel cut off by the end of the stream, rows past the cap of a panel, and verl samples that
    no step line followed are counted in lines_dropped by reason (before, each was left out without a trace); the
    complete panel beside them is read whole."""
    from exporter.samples import panels
    monkeypatch.setattr(panels, "MAX_ROWS", 2)
    prompts = ["What is 1 plus 2?", "What is 3 plus 3?", "What is 4 plus 4?"]
    capped = _trl_panel(80, 3, prompts, [" 3", " 6", " 8"])
    cut = _trl_panel(80, 4, prompts[:2], [" 3", " 6"]).splitlines()[:-1]  # no bottom line: the stream ended
    log = tmp_path / "d.log"
    log.write_text(capped + "\n".join(cut) + "\n", encoding="utf-8")
    ex = Exporter(Config(), [LogSpec(str(log), "d")])
    ex.read_to_end()
    assert [len(s.samples) for s in ex.runs["d"].samples.sets.values()] == [2]
    body = capped.splitlines()
    last_separator = max(i for i, ln in enumerate(body) if ln.startswith("│ ├"))
    third_row = [ln for ln in body[last_separator:] if ln.startswith("│ │")]  # the row past the cap, its lines
    dropped = _dropped(ex, "d")
    assert dropped["panel_rows_over_cap"] == len(third_row) >= 1, dropped
    assert dropped["panel_unfinished"] == len(cut), dropped

    verl = tmp_path / "v.log"
    tail = VERL.split("(TaskRunner pid=4242) step:2")[0]  # the second step's samples, and no step line after them
    verl.write_text(tail, encoding="utf-8")
    ex = Exporter(Config(), [LogSpec(str(verl), "v")])
    ex.read_to_end()
    second = tail.split("step:1")[1].splitlines()[2:]  # the lines after step 1's line and the worker's warning
    assert _dropped(ex, "v")["samples_without_step"] == len(second), (_dropped(ex, "v"), second)


def test_completion_sets_are_no_trainer_records_in_run_mode_too(tmp_path: Path) -> None:
    """`run` hands the console stream a wrapper of the run (launch.py: ConsoleBesideFeed, MaybeFeed), not the
    RunState: the count of completion sets must reach the run itself, or a run of samples only reads healthy under
    `run` (and a set's record makes the next postfix record look superseded)."""
    from exporter.launch import Launch
    from exporter.report.verdict import verdict_of
    text = (CORPUS / "grpo_samples_healthy" / "combined.log").read_text(encoding="utf-8")
    kept = "".join(ln for ln in text.splitlines(keepends=True) if "{'loss'" not in ln and "'train_runtime'" not in ln)
    log = tmp_path / "panels.log"
    log.write_text(kept, encoding="utf-8")
    for launch in (None, Launch("trainer"), Launch("p")):
        ex = Exporter(Config(), [LogSpec(str(log), "p")], launch=launch)
        ex.read_to_end()
        run = ex.runs["p"]
        assert run.sample_records > 10 and run.trainer_records == 0, (launch, run.sample_records, run.records)
        assert verdict_of(run, []) == "no_data", launch


def test_a_verl_sample_left_out_is_counted_once() -> None:
    """A sample without a response, then a whole one, then the stream ends: the first is one sample_without_response
    (not also lines of samples_without_step), the whole one's lines are samples_without_step."""
    from exporter.samples.verl import VerlSampleReader
    reader = VerlSampleReader()
    lines = ["(T pid=1) [prompt] What is 1 plus 1?", "(T pid=1) [ground_truth] 2", "(T pid=1) [score] 0.0",
             "(T pid=1) [prompt] What is 2 plus 2?", "(T pid=1) [response] 4", "(T pid=1) and more of it",
             "(T pid=1) [score] 1.0"]
    for line in lines:
        reader.line(line)
    reader.finish()
    assert dict(reader.dropped) == {"sample_without_response": 1, "samples_without_step": 4}


def test_a_panel_given_up_for_the_text_inside_it_is_counted_whole(tmp_path: Path) -> None:
    """More than 64 other lines inside a panel (another process's output interleaved): the panel is given up, and
    every line of it, those that came after the give-up included, is counted as dropped; the next panel is read."""
    lines = _trl_panel(80, 3, ["What is 1 plus 2?", "What is 3 plus 3?"], [" 3", " 6"]).splitlines()
    noise = [f"worker 7: a line of its own {i}" for i in range(70)]
    good = _trl_panel(80, 4, ["What is 1 plus 2?", "What is 3 plus 3?"], [" 3", " 6"])
    log = tmp_path / "g.log"
    log.write_text("\n".join(lines[:4] + noise + lines[4:]) + "\n" + good, encoding="utf-8")
    ex = Exporter(Config(), [LogSpec(str(log), "g")])
    ex.read_to_end()
    assert list(ex.runs["g"].samples.sets) == [4]
    assert _dropped(ex, "g")["panel_unfinished"] == len(lines), (_dropped(ex, "g"), len(lines))


# --- bounded in cells and characters, not only rows ---------------------------------------------------------------


def test_a_table_of_too_many_columns_is_counted_and_the_panels_around_it_are_read() -> None:
    """A table of 50,000 named columns took the exporter to 626 MB: one too wide for TRL's table (over MAX_COLUMNS)
    is left out whole, its lines counted as panel_too_wide; the panels before and after it are read."""
    from support.hostile_inputs import good_panel, panel_lines

    from exporter.samples.panels import MAX_COLUMNS

    wide = list(panel_lines(2, ["Prompt", "Completion", *(f"r{i}" for i in range(MAX_COLUMNS))],
                            [["p", "c", *("1" for _ in range(MAX_COLUMNS))]] * 3))
    reader = SampleReader()
    sets = [s for line in [*good_panel(1), *wide, *good_panel(3)] if (s := reader.line(line)) is not None]
    assert [s.step for s in sets] == [1, 3] and [len(s.samples) for s in sets] == [2, 2]
    assert sets[1].samples[0].completion == "4 at step 3"
    assert reader.dropped == {"panel_too_wide": len(wide)}


def test_a_wide_table_keeps_fewer_rows() -> None:
    """Rows x columns kept are bounded (MAX_CELLS): a table of MAX_COLUMNS columns keeps MAX_CELLS / MAX_COLUMNS
    rows, the rest counted as panel_rows_over_cap."""
    from support.hostile_inputs import panel_lines

    from exporter.samples.panels import MAX_CELLS, MAX_COLUMNS

    headers = ["Prompt", "Completion", *(f"r{i}" for i in range(MAX_COLUMNS - 2))]
    rows = [[f"p{i}", "c", *("1" for _ in range(MAX_COLUMNS - 2))] for i in range(MAX_CELLS // MAX_COLUMNS + 100)]
    reader = PanelReader()
    (s,) = [s for line in panel_lines(5, headers, rows) if (s := reader.line(line)) is not None]
    assert len(s.samples) == MAX_CELLS // MAX_COLUMNS and s.samples[-1].prompt == f"p{len(s.samples) - 1}"
    assert reader.dropped == {"panel_rows_over_cap": 100}


def test_verl_samples_are_bounded_in_scores_and_characters_per_step() -> None:
    """A sample's `[key] value` lines past MAX_SCORES are counted (sample_scores_over_cap), and a step keeps at most
    MAX_STEP_TEXT characters of samples (the rest: samples_over_cap); the next step is read."""
    from exporter.samples.verl import MAX_SCORES, MAX_STEP_TEXT, MAX_TEXT

    reader = SampleReader()
    lines = ["[prompt] 1+1?", "[response] 2", *(f"[score_{k}] 1.0" for k in range(MAX_SCORES + 10))]
    long_samples = MAX_STEP_TEXT // (2 * MAX_TEXT) + 5
    for _ in range(long_samples):
        lines += ["[prompt] " + "p" * MAX_TEXT, "[response] " + "r" * MAX_TEXT, "[score] 1.0"]
    for line in lines:
        reader.line(line)
    first = reader.close(1)
    assert first is not None and len(first.samples[0].rewards) == MAX_SCORES
    kept = (MAX_STEP_TEXT - len("1+1?2")) // (2 * MAX_TEXT)  # of the long ones, after the first sample
    assert len(first.samples) == 1 + kept
    assert reader.dropped == {"sample_scores_over_cap": 10, "samples_over_cap": long_samples - kept}
    for line in ["[prompt] 2+2?", "[response] 4", "[score] 1.0"]:
        reader.line(line)
    second = reader.close(2)
    assert second is not None and [x.completion for x in second.samples] == ["4"]


def test_the_exporter_counts_a_too_wide_table_and_keeps_the_records_around_it(tmp_path) -> None:
    """Through `dump`: the records and the good panels around tables of 2,000 columns arrive; what was left out is
    in posttrain_exporter_lines_dropped_total{reason="panel_too_wide"}."""
    from support.hostile_inputs import wide_table

    log = wide_table(tmp_path / "wide.log", 1, columns=2000, rows_per_panel=5)
    res = run_cli("dump", "--no-gpu", "--run", "r", str(log))
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    out = res.stdout.decode()
    assert 'posttrain_step{run="r"} 10000.0' in out
    assert 'posttrain_exporter_lines_dropped_total{reason="panel_too_wide",run="r"} 15.0' in out  # every line of it
    assert 'posttrain_completion_diversity{' in out
