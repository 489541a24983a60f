"""Each line format the exporter reads, as trainers print it (formats.md), and bad input."""

from __future__ import annotations

import math
import re

import pytest
from conftest import TRL

from exporter.parsers.chain import LineParserChain
from exporter.parsers.katib import parse_katib_anywhere, parse_katib_strict
from exporter.parsers.pydict import parse_hf_dict, parse_pairs
from exporter.parsers.record import ParseError, RecordKind
from exporter.parsers.userregex import RegexFormat
from exporter.parsers.values import Skip, to_float

AUTO = LineParserChain()


@pytest.mark.parametrize(
    ("token", "expected"),
    [("'6.176'", 6.176), ("0.25", 0.25), ("'1.461e+04'", 14610.0), ("'0'", 0.0), ("np.float64(0.1)", 0.1),
     ("numpy.float32(2.5)", 2.5), ("np.int64(7)", 7.0), ("tensor(0.5)", 0.5), ("tensor(0.5, device='cuda:0')", 0.5),
     ("-3", -3.0), ("'-inf'", -math.inf)],
)
def test_values(token: str, expected: float) -> None:
    assert to_float(token) == expected


def test_nan_values_are_numbers() -> None:
    assert math.isnan(to_float("nan")) and math.isnan(to_float("'nan'")) and math.isnan(to_float("np.float64(nan)"))


@pytest.mark.parametrize(("token", "reason"), [("None", "none"), ("'abc'", "non_numeric"), ("True", "non_numeric"),
                                                ("[1", "non_numeric")])
def test_non_numbers_are_skipped_with_a_reason(token: str, reason: str) -> None:
    with pytest.raises(Skip) as e:
        to_float(token)
    assert e.value.reason == reason


def test_transformers5_line_quoted_values() -> None:
    rec = AUTO.parse("{'loss': '6.176', 'kl': '0.1361', 'grad_norm': None, 'epoch': '0.001667'}")
    assert rec is not None and rec.fmt == "hf_dict" and rec.step is None
    assert rec.values == {"loss": 6.176, "kl": 0.1361, "epoch": 0.001667}
    assert rec.skipped == {"none": 1}


def test_transformers4_line_bare_numbers_and_numpy_reprs() -> None:
    rec = AUTO.parse("{'loss': 0.6931, 'rewards/chosen': np.float64(-0.01), 'lr': 5e-07, 'kl': nan, 'epoch': 0.02}")
    assert rec is not None
    assert rec.values["rewards/chosen"] == -0.01 and rec.values["lr"] == 5e-07 and math.isnan(rec.values["kl"])


def test_line_prefixed_by_a_launcher_and_after_bar_text() -> None:
    rec = AUTO.parse("[default0]:{'loss': '0.5', 'epoch': '1'}")
    assert rec is not None and rec.values["loss"] == 0.5
    rec = AUTO.parse("  4%|▍   | 13/300 [00:01<00:36,  7.95it/s]{'loss': '0.25'}")
    assert rec is not None and rec.values == {"loss": 0.25}


def test_input_is_never_evaluated() -> None:
    marker = "__import__('os').system('touch /tmp/posttrain-pwned')"
    rec = AUTO.parse("{'loss': " + marker + ", 'kl': '0.1'}")
    assert rec is not None and rec.values == {"kl": 0.1}


def test_truncated_dict_is_a_parse_error() -> None:
    with pytest.raises(ParseError) as e:
        parse_hf_dict("{'loss': '0.5', 'kl': '0.")
    assert e.value.reason == "truncated" and e.value.fmt == "hf_dict"


def test_eval_and_summary_records_are_classified() -> None:
    ev = AUTO.parse("{'eval_loss': '0.01826', 'eval_runtime': '0.4544', 'epoch': '0.5'}")
    summary = AUTO.parse("{'train_runtime': '40.41', 'train_loss': '0.007518', 'epoch': '0.5'}")
    train = AUTO.parse("{'loss': '0.01807', 'epoch': '0.5'}")
    assert (ev.kind, summary.kind, train.kind) == (RecordKind.EVAL, RecordKind.SUMMARY, RecordKind.TRAIN)


def test_json_lines_flat_and_verl_file_logger() -> None:
    flat = AUTO.parse('{"step": 12, "loss": 0.5, "kl": NaN, "note": "x", "rewards/f/mean": 1}')
    assert flat is not None and flat.fmt == "jsonl" and flat.step == 12
    assert flat.values["loss"] == 0.5 and math.isnan(flat.values["kl"]) and flat.values["rewards/f/mean"] == 1.0
    assert "step" not in flat.values and flat.skipped == {"non_numeric": 1}
    verl = AUTO.parse('{"step": 3, "data": {"actor/kl_loss": 0.01, "critic/score/mean": 0.4}}')
    assert verl is not None and verl.fmt == "verl_jsonl" and verl.step == 3
    assert verl.values == {"actor/kl_loss": 0.01, "critic/score/mean": 0.4}


def test_broken_json_is_counted_not_fatal() -> None:
    with pytest.raises(ParseError) as e:
        AUTO.parse('{"step": 3, "loss": 0.')
    assert e.value.fmt == "jsonl"


@pytest.mark.parametrize("prefix", ["", "(TaskRunner pid=87031) ", "(main_task pid=12) "])
def test_verl_console(prefix: str) -> None:
    line = f"{prefix}step:7 - actor/pg_loss:np.float64(-0.012) - actor/ppo_kl:0.001 - response_length/mean:212.5"
    rec = AUTO.parse(line)
    assert rec is not None and rec.fmt == "verl_console" and rec.step == 7
    assert rec.values == {"actor/pg_loss": -0.012, "actor/ppo_kl": 0.001, "response_length/mean": 212.5}


def test_openrlhf_step_line() -> None:
    line = ("INFO 05-12 10:01:02 ppo_trainer.py:201] ✨ Global step 42: {'policy_loss': -0.02, 'kl': 0.013, "
            "'reward': 0.61, 'response_length': 233.1, 'actor_lr': 1e-06}")
    rec = AUTO.parse(line)
    assert rec is not None and rec.fmt == "openrlhf" and rec.step == 42 and rec.values["kl"] == 0.013


def test_katib_strict_in_auto_mode_and_anywhere_when_pinned() -> None:
    rec = AUTO.parse("2026-11-01T10:00:00Z loss=0.3 accuracy=.98 Score=-7.53e-05")
    assert rec is not None and rec.values == {"loss": 0.3, "accuracy": 0.98, "Score": -7.53e-05}
    nan = parse_katib_strict("loss=nan step=4")
    assert nan is not None and math.isnan(nan.values["loss"]) and nan.step == 4
    sentence = "Initializing process group with world_size=8 and rank=0"
    assert AUTO.parse(sentence) is None and parse_katib_strict(sentence) is None
    assert parse_katib_anywhere("epoch 3 done: loss=0.25") is not None


def test_user_regex_formats() -> None:
    per_group = RegexFormat("mine", re.compile(r"it (?P<step>\d+) loss (?P<loss>\S+) kl (?P<kl>\S+)"))
    pairwise = RegexFormat("pairs", re.compile(r"(?P<key>[a-z_]+): (?P<value>[-\d.e]+)"))
    chain = LineParserChain("auto", [per_group, pairwise])
    rec = chain.parse("it 12 loss 0.5 kl 0.01")
    assert rec is not None and rec.fmt == "regex:mine" and rec.step == 12 and rec.values == {"loss": 0.5, "kl": 0.01}
    rec = LineParserChain("pairs", [per_group, pairwise]).parse("loss: 0.4 reward: 1.5")
    assert rec is not None and rec.values == {"loss": 0.4, "reward": 1.5}


def test_unmatched_lines_return_none() -> None:
    for line in ["Loading weights: 100%", "  warnings.warn(", "", "step 3 done", "{not a dict}"]:
        assert AUTO.parse(line) is None


def test_quoted_shapes_reuse_a_pattern_and_fall_back_on_anything_else() -> None:
    """transformers 5's all-quoted lines: the second line of a shape is read by that shape's pattern
    (sharing its keys tuple); a line that only looks like a known shape goes to the general parser."""
    from exporter.parsers.quoted import QuotedShapes

    shapes = QuotedShapes()
    first = shapes.parse("{'loss': '0.5', 'kl': '0.1'}")
    second = shapes.parse("{'loss': '0.25', 'kl': 'nan'}")
    assert first.values == {"loss": 0.5, "kl": 0.1} and second.shape is first.shape
    assert second.values["loss"] == 0.25 and math.isnan(second.values["kl"])
    assert shapes.parse("{'loss': 'None', 'kl': '0.1'}") is None  # not a number: the general path counts it
    assert shapes.parse("{'loss': 'it's', 'kl': '0.1'}") is None  # a quote inside a value
    longer = shapes.parse("{'loss': '0.5', 'kl': '0.1', 'entropy': '1.5'}")  # a new shape, not a prefix match
    assert longer.values == {"loss": 0.5, "kl": 0.1, "entropy": 1.5}
    for i in range(40):  # more shapes than the cache keeps: each still reads right
        assert shapes.parse(f"{{'k{i}': '{i}', 'loss': '1'}}").values == {f"k{i}": float(i), "loss": 1.0}
    assert shapes.parse("{'loss': '0.75', 'kl': '0.2'}").values == {"loss": 0.75, "kl": 0.2}


def fixture_dict_lines() -> list[str]:
    lines = []
    for run in ("sft", "dpo", "grpo", "grpo_saturated"):
        text = (TRL / run / "stdout.log").read_text()
        lines += [ln for ln in text.splitlines() if ln.startswith("{'")]
    return lines


def test_fast_path_reads_every_fixture_line_as_the_general_parser_does() -> None:
    lines = fixture_dict_lines()
    assert len(lines) > 1000
    parser = LineParserChain()
    for line in lines:
        fast = parser.parse(line)
        general = parse_pairs(line.strip()[1:-1], "hf_dict")
        assert fast.shape == general.shape and fast.kind == general.kind, line
        assert list(map(repr, fast.numbers)) == list(map(repr, general.numbers)), line  # NaN reads as NaN


@pytest.mark.parametrize(("line", "values", "skipped"), [
    ("{'loss': 'None', 'kl': '0.1'}", {"kl": 0.1}, {"none": 1}),  # not a number: counted, not lost
    ("{'loss': '0.5', 'note': 'it, is'}", {"loss": 0.5}, {"non_numeric": 1}),
    ("{'loss': 0.5, 'kl': '0.1'}", {"loss": 0.5, "kl": 0.1}, {}),  # mixed quoting
    ("{'loss': 'nan', 'kl': 'inf'}", {"loss": math.nan, "kl": math.inf}, {}),
    ("{'a': '1', 'b': '2' }", {"a": 1.0, "b": 2.0}, {}),  # a space before the brace
])
def test_lines_off_the_fast_path_still_parse(line: str, values: dict, skipped: dict) -> None:
    rec = LineParserChain().parse(line)
    assert str(rec.values) == str(values) and rec.skipped == skipped
