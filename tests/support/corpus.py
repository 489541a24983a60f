"""The labelled runs the detectors are judged on: the detection corpus (tests/fixtures/corpus, real TRL runs
made to show one pathology each, or none) and the repository's first fixtures (tests/fixtures/trl).

Each run's onsets come from labels.py, applied to its trainer_state.json; a run without onsets is healthy.
Which alerts count as catching a pathology is said here, by the `instrument` label of the alert."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from support.labels import load_records, onsets

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CORPUS = FIXTURES / "corpus"
TRL = FIXTURES / "trl"

# The instruments (alert label `instrument`) whose alerts catch each pathology.
CAUGHT_BY: dict[str, frozenset[str]] = {
    "kl_blowup": frozenset({"kl"}),
    "reward_std_collapse": frozenset({"reward_std"}),
    "length_hacking": frozenset({"completion_length"}),
    "truncation": frozenset({"completion_truncated"}),
    "entropy_collapse": frozenset({"entropy"}),
    "dpo_displacement": frozenset({"dpo_reward"}),
    "template_collapse": frozenset({"completion_diversity"}),  # labelled from the printed tables (sample_labels.py)
    "length_collapse": frozenset({"completion_length"}),
    "dead_signal": frozenset({"reward_std", "reward_zero_std"}),  # the same state, read from either
    "dpo_saturation": frozenset({"dpo_accuracy"}),
    "component_silent": frozenset({"reward_component"}),
}
# The stop signs: these must page, not only warn. A dead learning signal is a reward-std collapse read from the
# groups that tie.
PAGE_WORTHY = frozenset({"kl_blowup", "reward_std_collapse", "dead_signal"})
WITHIN_STEPS = 10  # a pathology must be caught this many logged steps after its onset at the latest ...
# ... except a reward-std collapse, whose onset is dated from the first of a run of steps without signal.
# With 4 prompt groups per batch and 0/1 rewards, a healthy run logs reward std 0 on half of its steps (the
# grpo fixture: 8 of 10 in a row at step 101); telling a collapse (95% of steps without signal) from that
# with few false pages takes about 15 points (docs/derived.md#reward-std-collapse). Within one label span.
WITHIN: dict[str, int] = {"reward_std_collapse": 20, "dead_signal": 20}


def within(pathology: str) -> int:
    return WITHIN.get(pathology, WITHIN_STEPS)


@dataclass(frozen=True)
class LabelledRun:
    name: str
    source: str  # "corpus" or "fixture"
    log: Path  # what a sidecar reads: the trainer's stdout and stderr in one stream
    trainer_state: Path
    onsets: dict[str, int]  # pathology -> onset step (labels.py); empty for a healthy run
    intent: tuple[str, ...] | None  # what the corpus run was made to show (None for the first fixtures)

    @property
    def healthy(self) -> bool:
        return not self.onsets


def _run(name: str, source: str, folder: Path, intent: tuple[str, ...] | None,
         sample_onsets: dict[str, int] | None = None) -> LabelledRun:
    """sample_onsets: the onsets of the samples labelling rule (support/sample_labels.py), computed from the trainer's
    parquet rows when the corpus was collected (run.json)."""
    log = next(folder / n for n in ("combined_unbuffered.log", "combined.log") if (folder / n).exists())
    state = folder / "trainer_state.json"
    return LabelledRun(name, source, log, state, {**onsets(load_records(state)), **(sample_onsets or {})}, intent)


# A run without pathology made for one of these judgment patterns (run.json's judgment_intent) is scored by the judgment
# labels (support/judgment_labels.py), not by the detectors: they are neither required to find it nor to keep silent.
# A converged reward (reward_plateau) is a healthy run's end, and stays in the detection corpus.
JUDGMENT_ONLY = frozenset({"reward_peak_decline", "kl_rise_reward_flat", "loss_discontinuity", "reward_no_trend"})


def labelled_runs() -> list[LabelledRun]:
    runs = []
    for folder in sorted(p for p in CORPUS.iterdir() if (p / "run.json").exists()) if CORPUS.is_dir() else []:
        meta = json.loads((folder / "run.json").read_text())
        if not meta["intent"] and JUDGMENT_ONLY & set(meta.get("judgment_intent", ())):
            continue
        runs.append(_run(folder.name, "corpus", folder, (*meta["intent"], *meta.get("sample_intent", ())),
                         meta.get("sample_onsets")))
    runs += [_run(name, "fixture", TRL / name, None) for name in ("grpo", "grpo_saturated", "dpo", "sft")]
    return runs
