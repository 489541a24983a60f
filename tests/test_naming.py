"""Metric names follow Prometheus' conventions (a unit suffix where the value has a unit) and every HELP text is
written for the user reading a scrape: no reference to the project's internal sources ("the seeds", "002", "Part II
instrument 9"), which a user never sees."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO, TRL, run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.instruments.families import FAMILIES
from exporter.instruments.keymap import INSTRUMENTS

# Words that point at documents a user of the exporter does not have.
INTERNAL = re.compile(r"\bseeds?\b|(?<![.\d])\b00[0-9]\b|\bpart i{1,3}\b|\binstrument \d+\b"
                      r"|practitioner'?s? guide", re.I)


@pytest.fixture(scope="module")
def dumps() -> dict[str, str]:
    return {run: run_cli("dump", str(TRL / run / "combined.log")).stdout.decode() for run in ("grpo", "dpo", "sft")}


def test_internal_reference_pattern() -> None:
    for bad in ("the seeds' callback key", "002: peak followed by decline", "Part II instrument 9",
                "regime of the practitioner's guide", "seed 001"):
        assert INTERNAL.search(bad), bad
    for fine in ("Seconds of the step", "thresholds.reward_std_min", "2**53", "0.002 s", "partial reward"):
        assert not INTERNAL.search(fine), fine


def test_help_of_a_real_dump_names_nothing_internal(dumps: dict[str, str]) -> None:
    helps = {}
    for text in dumps.values():
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name, _, doc = line[len("# HELP "):].partition(" ")
                helps[name] = doc
    assert len(helps) > 80, "the dumps hold the training, derived, detector, health and GPU families"
    bad = {name: doc for name, doc in helps.items() if INTERNAL.search(doc) or not doc.strip()}
    assert not bad, f"HELP texts a user cannot follow: {bad}"


def test_every_declared_help_names_nothing_internal() -> None:
    """Families the fixtures do not reach (PPO, timing keys) too."""
    for inst in INSTRUMENTS.values():
        assert not INTERNAL.search(inst.help), (inst.metric, inst.help)
    for fam in FAMILIES:
        assert not INTERNAL.search(fam.help), (fam.name, fam.help)


def test_unit_suffixes(dumps: dict[str, str]) -> None:
    names = {fam.name for text in dumps.values() for fam in text_string_to_metric_families(text)}
    assert {"posttrain_completion_length_tokens", "posttrain_completion_length_truncation_gap_tokens",
            "posttrain_clip_combined_ratio", "posttrain_step_time_seconds"} <= names
    assert not names & {"posttrain_completion_length", "posttrain_completion_length_truncation_gap",
                        "posttrain_clip_combined"}
    assert INSTRUMENTS["clip_fraction"].metric == "posttrain_clip_fraction_ratio"
    # a length in tokens says so, except where it is divided away (a ratio)
    for name in names:
        if "length" in name and not name.endswith("_ratio"):
            assert name.endswith("_tokens"), name


def test_board_texts_name_nothing_internal() -> None:
    """The boards' titles and panel descriptions are read by the same users as the HELP texts."""
    def texts(node: object) -> list[str]:
        if isinstance(node, dict):
            own = [v for k, v in node.items() if k in ("title", "description", "content") and isinstance(v, str)]
            return own + [t for v in node.values() for t in texts(v)]
        if isinstance(node, list):
            return [t for v in node for t in texts(v)]
        return []

    for path in sorted((REPO / "grafana").glob("*.json")):
        bad = [t for t in texts(json.loads(path.read_text())) if INTERNAL.search(t)]
        assert not bad, f"{path.name}: {bad}"
