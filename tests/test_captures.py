"""Logs as users have them (issue 16): console captures of public training runs hold more than training records.

Every line here is written for this test after the shapes users' captures showed: prose that mentions a dict
(verl, vLLM, Ray, DeepSpeed, the Trainer's model card), loading bars before the training bar, the Trainer's
end-of-run metrics blocks, trainer_state.json under another name or inside an output folder, Ray's worker
prefixes and `[repeated Nx across cluster]`, a log pasted inside a markdown code fence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port, run_cli, trainer_state
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.exposition.collector import ExporterCollector
from exporter.parsers.chain import LineParserChain
from exporter.parsers.record import RecordKind
from exporter.parsers.summary import MetricsBlocks
from exporter.sources.trainer_state import holds_log_history

AUTO = LineParserChain()

# --- helpers ---------------------------------------------------------------------------------------------------


def exporter_of(tmp_path, text: str, name: str = "train.log", fmt: str = "auto") -> Exporter:
    log = tmp_path / name
    log.write_text(text, encoding="utf-8")
    ex = Exporter(Config(), [LogSpec(str(log), "r", fmt)])
    ex.read_to_end()
    return ex


def scrape(ex: Exporter) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(ex))
    return generate_latest(reg).decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    want = {"run": "r", **labels}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels == want:
                return s.value
    return None


def steps_of(ex: Exporter, instrument: str = "loss") -> list[int]:
    ex.runs["r"].refresh()
    return [s for s, _ in ex.runs["r"].series[instrument, None].history]


def hf_record(step: int, max_steps: int = 170, epochs: int = 3) -> str:
    """A transformers 4 console record logged at `step` (epoch rounded to 2 decimals, as ProgressCallback does)."""
    epoch = round(step * epochs / max_steps, 2)
    return f"{{'loss': {1.0 / step:.4f}, 'grad_norm': 0.8, 'learning_rate': 2e-05, 'epoch': {epoch}}}"


def bar(n: int, total: int, description: str = "") -> str:
    percent = f"{100 * n // total:3d}%"
    return f"{description}{percent}|{'#' * (10 * n // total):<10}| {n}/{total} [00:01<00:10,  4.20it/s]"


def training_with_tqdm(max_steps: int = 170, every: int = 10) -> str:
    """A combined stream as the Trainer's ProgressCallback writes it: bar draws on \\r, and each record through
    tqdm.write (clear the bar, print the line, redraw the bar)."""
    out = ["\r" + bar(0, max_steps)]
    for step in range(1, max_steps + 1):
        out.append("\r" + bar(step, max_steps))
        if step % every == 0:
            out.append("\r" + " " * 60 + "\r" + hf_record(step, max_steps) + "\n\r" + bar(step, max_steps))
    return "".join(out) + "\n"


def loading_bars() -> str:
    return "".join("\r" + bar(n, 4, "Loading checkpoint shards: ") for n in range(5)) + "\n" + \
        "".join("\r" + bar(n, 1000, "Map: ") for n in (0, 500, 1000)) + "\n"


# --- 1. a training record is a metrics line, not any dict ---------------------------------------------------------

PROSE_DICTS = [
    "(TaskRunner pid=2301) test_gen_batch meta info: {'eos_token_id': 151645, 'pad_token_id': 151643, "
    "'recompute_log_prob': False, 'do_sample': False, 'validate': True}",
    "(WorkerDict pid=1609, ip=10.0.0.5) kwargs: {'n': 1, 'logprobs': 0, 'max_tokens': 1024, 'temperature': 1.0, "
    "'top_k': -1, 'top_p': 1}",
    "ray init kwargs: {'num_cpus': None, 'runtime_env': {'env_vars': {'TOKENIZERS_PARALLELISM': 'true'}}}",
    "(TaskRunner pid=2301) override_generation_config: {'temperature': 1.0, 'top_k': -1, 'top_p': 1.0}",
    "[2026-03-14 09:10:02,118] [INFO] [launch.py:146:main] WORLD INFO DICT: {'localhost': [0, 1]}",
    "[2026-03-14 09:10:09,377] [INFO] [config.py:1001:print]   aio_config ................... {'block_size': "
    "1048576, 'queue_depth': 8, 'thread_count': 1, 'single_submit': False, 'overlap_events': True}",
    "{'task': {'name': 'Causal Language Modeling', 'type': 'text-generation'}, 'dataset': {'name': 'my-data', "
    "'type': 'json'}, 'metrics': [{'name': 'Accuracy', 'type': 'accuracy', 'value': 0.51}]}",
    "{'prompt': 'What is 2 + 2?', 'completion': 'It is four.'}",  # a data sample: no number
    "(WorkerDict pid=1609, ip=10.0.0.5) kwargs: {'n': 1, 'logprobs': 0} [repeated 7x across cluster]",
    "sampling params: {'n': 8, 'top_k': 50} (seed 3)",  # text after the dict
]


@pytest.mark.parametrize("line", PROSE_DICTS)
@pytest.mark.parametrize("fmt", ["auto", "hf"])
def test_a_dict_in_prose_is_no_record(line: str, fmt: str) -> None:
    assert LineParserChain(fmt).parse(line) is None


@pytest.mark.parametrize("line", [
    "{'loss': 0.5, 'epoch': 0.1}",
    "   {'loss': 0.5, 'epoch': 0.1}",
    "[rank0]:{'loss': 0.5, 'epoch': 0.1}",
    "[default3]:{'loss': 0.5}",
    "[1,0]<stdout>:{'loss': 0.5}",
    "(WorkerDict pid=1609, ip=10.0.0.5) {'loss': 0.5}",
    "(pid=77) {'loss': 0.5}",
    "2026-03-14T09:12:44.123456789Z {'loss': 0.5}",
    "0: {'loss': 0.5}",
    "2026-03-14T09:12:44Z [rank0]: {'loss': 0.5}",
    " 6%|6         | 10/170 [00:30<08:00,  3.00s/it]{'loss': 0.5}",
    # any other prefix (a pdsh host, a logging header): the Trainer's `epoch` says it is a record
    "worker-1: {'loss': 0.5, 'epoch': 0.1}",
    "[INFO|callbacks.py:310] 2026-03-14 09:12:44,120 >> {'loss': 0.5, 'learning_rate': 2e-05, 'epoch': 0.1}",
    "(TaskRunner pid=2301) {'loss': 0.5} [repeated 2x across cluster]",
])
def test_a_record_behind_known_prefixes_or_carrying_epoch_is_read(line: str) -> None:
    rec = AUTO.parse(line)
    assert rec is not None and rec.fmt == "hf_dict" and rec.values["loss"] == 0.5


def test_behind_an_unknown_prefix_a_dict_without_epoch_is_prose() -> None:
    assert AUTO.parse("worker-1: {'loss': 0.5}") is None
    assert AUTO.parse("note: {'loss': 0.5, 'epoch': 0.1") is None  # cut: prose is never an error


def test_prose_dicts_are_counted_unmatched_and_export_nothing(tmp_path) -> None:
    text = "\n".join([*PROSE_DICTS, hf_record(10), hf_record(20)]) + "\n"
    out = scrape(exporter_of(tmp_path, text))
    assert sample(out, "posttrain_exporter_lines_total", format="none", outcome="unmatched") == len(PROSE_DICTS)
    assert sample(out, "posttrain_exporter_lines_total", format="hf_dict", outcome="record") == 2
    assert "error" not in {s.labels.get("outcome") for f in text_string_to_metric_families(out) for s in f.samples}
    keys = {s.labels["key"] for f in text_string_to_metric_families(out) for s in f.samples
            if s.name == "posttrain_metric"}
    assert keys == {"loss", "grad_norm", "learning_rate", "epoch"}  # no eos_token_id, top_k, block_size, num_cpus


def test_verl_prose_dicts_and_vllm_bars_before_training_do_not_move_the_step(tmp_path) -> None:
    """Three prose dicts and a vLLM bar at 7/7 pushed the step to 7, so `step:1` read as a resume."""
    runner = "(TaskRunner pid=2301) "
    lines = [runner + PROSE_DICTS[0][len(runner):], "ray init kwargs: {'num_cpus': None}", PROSE_DICTS[3],
             "(WorkerDict pid=1609, ip=10.0.0.5) Processed prompts: 100%|##########| 7/7 [00:03<00:00,  2.10it/s]",
             runner + "step:0 - val-core/openai/gsm8k/reward/mean@1:0.12"]
    for step in range(1, 6):
        lines += [PROSE_DICTS[0], f"{runner}step:{step} - actor/pg_loss:-0.01 - actor/entropy:{1.5 - step / 10} - "
                  f"critic/score/mean:{step / 10}"]
    ex = exporter_of(tmp_path, "\n".join(lines) + "\n")
    assert ex.runs["r"].resets == 0 and steps_of(ex, "entropy") == [1, 2, 3, 4, 5]
    assert not {"eos_token_id", "temperature", "num_cpus"} & set(ex.runs["r"].passthrough)


def test_deepspeed_dicts_without_a_progress_bar_do_not_shift_the_ordinals(tmp_path) -> None:
    """Stdout alone (no bar): records are numbered by ordinal; five prose dicts shifted every step by 5."""
    ds = "[2026-03-14 09:10:09,377] [INFO] [config.py:1001:print]   "
    prose = [PROSE_DICTS[4], ds + "aio_config ........ {'block_size': 1048576, 'queue_depth': 8}",
             ds + "zero_config ....... {'stage': 2, 'reduce_bucket_size': 500000000}",
             ds + "optimizer_params .. {'lr': 2e-05, 'weight_decay': 0.0}", PROSE_DICTS[6]]
    ex = exporter_of(tmp_path, "\n".join(prose + [hf_record(s, 10, 1) for s in range(1, 11)]) + "\n")
    assert steps_of(ex) == list(range(1, 11))


# --- 2. only the training bar gives steps ---------------------------------------------------------------------------


def test_a_loading_bar_gives_no_step_records_without_the_training_bar_take_ordinals(tmp_path) -> None:
    """LLaMA-Factory-like: the last bar before the first record is `Loading checkpoint shards: 100%| 4/4`; the
    records (logged every 10 steps, printed without the training bar) got steps 4..20."""
    text = loading_bars() + "".join(hf_record(s) + "\n" for s in range(10, 171, 10))
    ex = exporter_of(tmp_path, text)
    assert steps_of(ex) == list(range(1, 18))  # the README's fallback: the ordinal
    assert sample(scrape(ex), "posttrain_exporter_step_disagreements_total", reason="epoch") == 0


def test_the_training_bar_gives_exact_steps_among_other_bars(tmp_path) -> None:
    text = loading_bars() + training_with_tqdm()
    ex = exporter_of(tmp_path, text)
    assert steps_of(ex) == list(range(10, 171, 10))
    assert sample(scrape(ex), "posttrain_exporter_step_disagreements_total", reason="epoch") == 0


def test_an_eval_bar_without_description_gives_no_step(tmp_path) -> None:
    """A description-less bar of another total while training runs (not nested: no cursor moves) is another bar."""
    text = training_with_tqdm(max_steps=100)
    eval_bar = "".join("\r" + bar(n, 4) for n in range(5)) + "\r" + " " * 60 + "\r"
    text = text.replace(hf_record(50, 100) + "\n", hf_record(50, 100) + "\n" + eval_bar, 1)
    assert steps_of(exporter_of(tmp_path, text)) == list(range(10, 101, 10))


def test_a_new_training_bar_after_the_last_one_ran_out_is_followed(tmp_path) -> None:
    """A second `trainer.train()` with another max_steps in the same log (a resumed history is cut back)."""
    ex = exporter_of(tmp_path, training_with_tqdm(max_steps=50) + training_with_tqdm(max_steps=80))
    assert steps_of(ex) == list(range(10, 81, 10)) and ex.runs["r"].resets == 1


def test_a_step_that_disagrees_with_epoch_is_counted(tmp_path) -> None:
    """A description-less bar that is no training bar (4/4) before records printed without the training bar: the
    first record takes its 4, the rest ordinals 5..20, which epoch progress (every 10 steps) contradicts."""
    text = "".join("\r" + bar(n, 4) for n in range(5)) + "\n" + "".join(hf_record(s) + "\n" for s in range(10, 171, 10))
    ex = exporter_of(tmp_path, text)
    assert steps_of(ex) == list(range(4, 21))  # kept: the counter says so, nothing is guessed
    assert sample(scrape(ex), "posttrain_exporter_step_disagreements_total", reason="epoch") == 15


# --- 3. the Trainer's end-of-run metrics blocks are the summary ---------------------------------------------------

METRICS_BLOCKS = """***** train metrics *****
  epoch                    =        3.0
  total_flos               =    12345GF
  train_loss               =     0.2231
  train_runtime            = 0:01:23.45
  train_samples_per_second =     12.345
  train_steps_per_second   =      2.037
***** eval metrics *****
  epoch                   =        3.0
  eval_loss               =     0.3112
  eval_runtime            = 0:00:04.02
  eval_samples            =        200
  eval_samples_per_second =     49.751
  eval_steps_per_second   =      6.219
  perplexity              =     1.3651
"""


def test_metrics_blocks_are_summary_pass_through_not_steps(tmp_path) -> None:
    """Each block is one record (issue 24): train's a summary, eval's an evaluation record; no training step."""
    summary = "{'train_runtime': 83.45, 'train_samples_per_second': 12.345, 'train_steps_per_second': 2.037, " \
              "'train_loss': 0.2231, 'epoch': 3.0}\n"
    ex = exporter_of(tmp_path, training_with_tqdm() + summary + METRICS_BLOCKS + "Training done.\n")
    run = ex.runs["r"]
    out = scrape(ex)
    assert run.step == 170 and steps_of(ex) == list(range(10, 171, 10)) and run.finished
    assert run.records["train"] == 17 and run.records["summary"] == 1 + 1 and run.records["eval"] == 1
    assert sample(out, "posttrain_exporter_lines_total", format="hf_metrics", outcome="record") == 2
    assert sample(out, "posttrain_exporter_lines_total", format="none", outcome="unmatched") == 1  # Training done.
    assert sample(out, "posttrain_exporter_lines_total", format="katib", outcome="record") is None
    assert sample(out, "posttrain_metric", key="train_runtime") == pytest.approx(83.45)
    assert sample(out, "posttrain_metric", key="eval_runtime") == pytest.approx(4.02)
    assert sample(out, "posttrain_metric", key="total_flos") == 12345 * 2**30
    assert sample(out, "posttrain_metric", key="eval_loss") == pytest.approx(0.3112)
    assert sample(out, "posttrain_metric", key="perplexity") == pytest.approx(1.3651)


def test_a_block_never_overwrites_the_precise_values_logged_before_it(tmp_path) -> None:
    """The Trainer logs the summary dict at full precision, then prints the block rounded to 4 decimals: the
    dict's values stay; a value the block alone has (total_flos) or one it prints differently is taken."""
    summary = "{'train_runtime': 139862.4789, 'train_samples_per_second': 0.107, 'train_steps_per_second': 0.013, " \
              "'train_loss': 0.00015002657560484402, 'epoch': 1.0}\n"
    evals = "{'eval_loss': 0.31118774414062, 'eval_runtime': 4.0211, 'epoch': 1.0}\n"
    block = ("***** train metrics *****\n  epoch                    =        1.0\n"
             "  total_flos               =    12345GF\n  train_loss               =     0.0002\n"
             "  train_runtime            = 1 day, 14:51:02.47\n***** eval metrics *****\n"
             "  epoch                   =        1.0\n  eval_loss               =     0.3112\n"
             "  eval_runtime            = 0:00:04.02\n  perplexity              =     1.3651\n")
    ex = exporter_of(tmp_path, training_with_tqdm(max_steps=30) + summary + evals + block)
    out = scrape(ex)
    assert sample(out, "posttrain_metric", key="train_loss") == 0.00015002657560484402
    assert sample(out, "posttrain_metric", key="train_runtime") == 139862.4789
    assert sample(out, "posttrain_metric", key="eval_loss") == 0.31118774414062
    assert sample(out, "posttrain_metric", key="eval_runtime") == 4.0211
    assert sample(out, "posttrain_metric", key="total_flos") == 12345 * 2**30
    assert sample(out, "posttrain_metric", key="perplexity") == 1.3651
    assert ex.runs["r"].records["eval"] == 2 and ex.runs["r"].records["summary"] == 2  # the block at the end of input


def test_a_metrics_block_ends_at_the_first_line_that_is_no_entry() -> None:
    chain = LineParserChain()
    assert chain.parse("[rank0]:***** train metrics *****") is None and chain.block_line  # a header is no record
    assert chain.parse("[rank0]:  train_runtime = 1 day, 2:00:00.50") is None and chain.block_line  # gathered
    assert chain.parse("  init_mem_cpu_alloc_delta = 3MB") is None
    assert chain.parse("Saving model checkpoint to out") is None and not chain.block_line
    rec = chain.ended_block
    assert rec.kind is RecordKind.SUMMARY and rec.values == {"train_runtime": 93600.5,
                                                             "init_mem_cpu_alloc_delta": 3 * 2**20}
    assert chain.ended_block is None  # taken once
    katib = chain.parse("  loss = 0.5")  # outside a block: Katib's text format, as before
    assert katib.fmt == "katib" and katib.kind is RecordKind.TRAIN
    blocks = MetricsBlocks()
    assert not blocks.header("***** Running training *****") and not blocks.active
    assert chain.parse("***** eval metrics *****") is None and chain.parse("  eval_loss = 0.5") is None
    assert chain.parse("***** test metrics *****") is None  # the next header ends the last block
    assert chain.ended_block.kind is RecordKind.EVAL
    assert chain.parse("  test_loss = 0.25") is None and chain.close_block().values == {"test_loss": 0.25}


# --- 4. trainer_state.json under another name, and a Trainer's output folder ------------------------------------


def state_text(entries: list[dict]) -> str:
    """As the Trainer writes it: sorted keys, indent 2, log_history after a few short keys."""
    return json.dumps({"best_global_step": None, "best_metric": None, "epoch": 1.0, "global_step": entries[-1]["step"],
                       "log_history": entries, "max_steps": 300}, indent=2, sort_keys=True)


def entries(first: int, last: int) -> list[dict]:
    return [{"step": s, "loss": 1.0 / s + 1e-9, "epoch": s / 300} for s in range(first, last + 1)]


@pytest.mark.parametrize("name", ["state_copy.json", "trainer_state (1).json", "grpo-run.state"])
def test_trainer_state_under_another_name_is_read_by_its_content(tmp_path, name: str) -> None:
    path = tmp_path / name
    shutil.copy(TRL / "grpo" / "trainer_state.json", path)
    res = run_cli("dump", "--no-gpu", str(path), "--run", "r")
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    out = res.stdout.decode()
    history = trainer_state("grpo")
    assert sample(out, "posttrain_exporter_lines_total", format="trainer_state", outcome="record") == len(history)
    assert sample(out, "posttrain_step") == 300
    kl = max((e for e in history if "kl" in e), key=lambda e: e["step"])["kl"]
    assert sample(out, "posttrain_kl") == kl  # full precision


@pytest.mark.parametrize("text", [
    hf_record(1) + "\n" + '{"log_history": [1]}\n',  # a console log
    '{"step": 1, "loss": 0.5}\n{"log_history": [{"step": 2, "loss": 0.25}]}\n',  # JSON lines
    '{"config": {"log_history": []}, "step": 1, "loss": 0.5}\n',  # the key, nested
])
def test_other_logs_mentioning_log_history_are_no_trainer_state(tmp_path, text: str) -> None:
    ex = exporter_of(tmp_path, text, name="train.json")
    assert sum(n for (fmt, outcome), n in ex.stats["r"].lines.items() if outcome == "record") >= 1
    assert ex.stats["r"].lines["trainer_state", "record"] == 0


@pytest.mark.parametrize("head", ['{"' + '\\"' * 40_000, "{" + '"log_history" ' * 5_000, '{"a": ' + '"x' * 40_000])
def test_judging_a_file_by_its_content_takes_linear_time(tmp_path, head: str) -> None:
    """An unclosed JSON string full of escaped quotes was scanned again from each quote: 14 s for 64 KiB."""
    path = tmp_path / "hostile.json"
    path.write_text(head)
    t = time.perf_counter()
    assert not holds_log_history(str(path))
    assert time.perf_counter() - t < 0.5


def write_checkpoint(out, step: int, mtime: int) -> None:
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(state_text(entries(1, step)))
    os.utime(folder / "trainer_state.json", (mtime, mtime))


def test_an_output_folder_is_read_through_its_newest_checkpoint_and_followed(tmp_path) -> None:
    out = tmp_path / "out"
    write_checkpoint(out, 10, mtime=1_000)
    write_checkpoint(out, 20, mtime=2_000)
    write_checkpoint(out, 5, mtime=500)  # older: rotated away in a real run, or an earlier attempt
    ex = Exporter(Config(), [LogSpec(str(out), "r")])
    ex.poll_once()
    assert steps_of(ex) == list(range(1, 21))
    write_checkpoint(out, 30, mtime=3_000)  # the Trainer saves again
    ex.poll_once()
    assert steps_of(ex) == list(range(1, 31)) and ex.runs["r"].resets == 0
    (out / "trainer_state.json").write_text(state_text(entries(1, 35)))  # the end of training: its own
    ex.poll_once()
    assert steps_of(ex) == list(range(1, 36)) and ex.stats["r"].lines["trainer_state", "record"] == 35


def test_an_output_folder_that_appears_later_is_waited_for(tmp_path) -> None:
    out = tmp_path / "out"
    ex = Exporter(Config(), [LogSpec(str(out) + "/", "r")])
    ex.poll_once()
    assert ex.inputs[0].follow.up is False
    out.mkdir()
    ex.poll_once()  # a folder holding nothing yet: still waiting
    write_checkpoint(out, 10, mtime=1_000)
    ex.poll_once()
    assert ex.inputs[0].follow.up is True and steps_of(ex) == list(range(1, 11))


def test_trainer_state_wins_over_event_files_in_one_output_folder(tmp_path) -> None:
    out = tmp_path / "out"
    shutil.copytree(TRL / "grpo" / "tensorboard", out / "runs" / "Mar14_09-10-00_host")
    (out / "checkpoint-300").mkdir()
    shutil.copy(TRL / "grpo" / "trainer_state.json", out / "checkpoint-300" / "trainer_state.json")
    res = run_cli("dump", "--no-gpu", str(out), "--run", "r")
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    text = res.stdout.decode()
    assert sample(text, "posttrain_exporter_lines_total", format="trainer_state", outcome="record") > 0
    assert sample(text, "posttrain_exporter_lines_total", format="tensorboard", outcome="record") is None
    shutil.rmtree(out / "checkpoint-300")  # event files alone: TensorBoard, as before
    text = run_cli("dump", "--no-gpu", str(out), "--run", "r").stdout.decode()
    assert sample(text, "posttrain_exporter_lines_total", format="tensorboard", outcome="record") > 0


def test_dump_of_a_folder_holding_no_log_is_an_error(tmp_path) -> None:
    res = run_cli("dump", "--no-gpu", str(tmp_path))
    assert res.returncode == 2 and b"cannot read log" in res.stderr


def test_serve_follows_a_renamed_state_and_an_output_folder(tmp_path) -> None:
    from test_serve import value, wait_for

    renamed = tmp_path / "grpo_state.json"
    shutil.copy(TRL / "grpo" / "trainer_state.json", renamed)
    # an output folder with a generic name (`out`) is its run's folder's run: `qwen-grpo`
    out = tmp_path / "qwen-grpo" / "out"
    out.mkdir(parents=True)
    port = free_port()
    p = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--log",
                                      str(renamed), "--log", str(out)), cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        wait_for(port, lambda t: value(t, "posttrain_step", run="grpo_state") == 300)
        write_checkpoint(out, 10, mtime=1_000)
        wait_for(port, lambda t: value(t, "posttrain_step", run="qwen-grpo") == 10)
        write_checkpoint(out, 20, mtime=2_000)
        text = wait_for(port, lambda t: value(t, "posttrain_step", run="qwen-grpo") == 20)
        assert value(text, "posttrain_exporter_history_resets_total", run="qwen-grpo") == 0
    finally:
        p.terminate()
        assert p.wait(timeout=10) == 0, p.stderr.read().decode()[-2000:]


# --- 5. Ray's prefixes and suffixes, a log inside a markdown code fence ------------------------------------------


def test_ray_worker_prefixes_with_an_address_and_repeated_suffixes() -> None:
    rec = AUTO.parse("(WorkerDict pid=1609, ip=10.0.0.5) step:3 - actor/pg_loss:-0.02 - actor/entropy:1.1 "
                     "[repeated 15x across cluster]")
    assert rec.step == 3 and rec.values == {"actor/pg_loss": -0.02, "actor/entropy": 1.1} and not rec.skipped
    assert AUTO.parse("(WorkerDict pid=1609, ip=10.0.0.5) Loading weights took 3.1 s [repeated 15x across "
                      "cluster]") is None
    pinned = LineParserChain("verl").parse("(TaskRunner pid=7) step:4 - a:1 [repeated 2x across cluster]")
    assert pinned.step == 4 and pinned.values == {"a": 1.0}
    rlhf = AUTO.parse("(PPOTrainer pid=7, ip=10.0.0.5) Global step 12: {'kl': 0.01} [repeated 2x across cluster]")
    assert rlhf.fmt == "openrlhf" and rlhf.step == 12 and rlhf.values == {"kl": 0.01}
    assert AUTO.parse("{'loss': 0.5} [repeated 2x across cluster]").values == {"loss": 0.5}


def test_a_log_pasted_inside_a_markdown_code_fence(tmp_path) -> None:
    body = "".join(hf_record(s) + "\n" for s in range(10, 51, 10))
    plain = exporter_of(tmp_path, body, name="plain.log")
    fenced = exporter_of(tmp_path, "Here is my log:\n\n```text\n" + body + "```\n", name="fenced.log")
    assert steps_of(fenced) == steps_of(plain) == [1, 2, 3, 4, 5]
    assert fenced.stats["r"].lines["none", "unmatched"] == 3  # the sentence and the two fences


# --- 5. steps when the log has no usable bar (issue 24) -----------------------------------------------------------

TRAINER_FACTS = """[INFO|trainer.py:2243] 2026-03-14 09:10:02,118 >> ***** Running training *****
[INFO|trainer.py:2244] 2026-03-14 09:10:02,118 >>   Num examples = 2,712
[INFO|trainer.py:2245] 2026-03-14 09:10:02,118 >>   Num Epochs = 2
[INFO|trainer.py:2246] 2026-03-14 09:10:02,118 >>   Instantaneous batch size per device = 4
[INFO|trainer.py:2249] 2026-03-14 09:10:02 >>   Total train batch size (w. parallel, distributed & accumulation) = 32
[INFO|trainer.py:2250] 2026-03-14 09:10:02,118 >>   Gradient Accumulation steps = 8
[INFO|trainer.py:2251] 2026-03-14 09:10:02,118 >>   Total optimization steps = 170
"""


def step_sources(ex: Exporter) -> dict[str, float]:
    out = scrape(ex)
    return {s: sample(out, "posttrain_exporter_step_sources_total", source=s) for s in ("epoch", "checkpoint",
                                                                                          "ordinal", "bar")}


def test_a_log_that_states_its_scale_gives_steps_from_epochs(tmp_path) -> None:
    """LLaMA-Factory-like: no training bar (loading bars only), the Trainer's facts, records every 10 steps with
    their epoch (2 decimals): steps 10..170, not the ordinals 1..17; the counter says the epoch gave them."""
    text = loading_bars() + TRAINER_FACTS + "".join(hf_record(s, 170, 2) + "\n" for s in range(10, 171, 10))
    ex = exporter_of(tmp_path, text)
    assert steps_of(ex) == list(range(10, 171, 10))
    assert step_sources(ex) == {"epoch": 17, "checkpoint": 0, "ordinal": 0, "bar": 0}
    assert sample(scrape(ex), "posttrain_exporter_step_disagreements_total", reason="epoch") == 0


def test_examples_and_batch_size_give_the_steps_per_epoch(tmp_path) -> None:
    """Only `Num examples` and the total batch size stated (3,200 / 32 = 100 steps per epoch); an evaluation's own
    `Num examples` later changes nothing."""
    facts = "  Num examples = 3,200\n  Total train batch size (w. parallel, distributed & accumulation) = 32\n"
    records = [hf_record(s, 300, 3) + "\n" for s in range(5, 301, 5)]
    evaluation = "***** Running Evaluation *****\n  Num examples = 50\n"
    text = facts + "".join(records[:20]) + evaluation + "".join(records[20:])
    ex = exporter_of(tmp_path, text)
    assert steps_of(ex) == list(range(5, 301, 5))


def test_deepspeed_global_step_lines_continue_the_steps_at_the_interval_they_show(tmp_path) -> None:
    """No bar, no facts, records without an epoch every 10 steps, and DeepSpeed's checkpoint lines every 50 steps:
    the first five records take ordinals (nothing known yet), the rest go on from each global_step line at the
    interval the records before it show (50 / 5 = 10); the counters say which."""
    ds = "[2026-03-14 09:10:09,377] [INFO] [engine.py:3500:_save_zero_checkpoint] zero checkpoint saved " \
         "out/checkpoint-{0}/global_step{0}/zero_pp_rank_0_mp_rank_00_optim_states.pt\n"
    lines = []
    for step in range(10, 201, 10):
        lines.append(f"{{'loss': {1 / step:.4f}, 'grad_norm': 0.8, 'learning_rate': 2e-05}}\n")
        if step % 50 == 0:
            lines.append(ds.format(step))
    ex = exporter_of(tmp_path, "".join(lines))
    assert steps_of(ex) == [1, 2, 3, 4, 5, *range(60, 201, 10)]
    assert step_sources(ex) == {"epoch": 0, "checkpoint": 15, "ordinal": 5, "bar": 0}
