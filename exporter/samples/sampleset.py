"""One logged step's completions: the unit every sample reader produces."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Sample:
    prompt: str
    completion: str
    rewards: dict[str, float] = field(default_factory=dict)  # per reward function (TRL), or the score (verl)
    advantage: float | None = None


@dataclass(frozen=True, slots=True)
class SampleSet:
    step: int
    source: str  # "trl_panel", "trl_parquet", "verl"
    samples: tuple[Sample, ...]


def normal(text: str) -> str:
    """The text as compared for diversity: runs of whitespace as one space, ends stripped (a printed table wraps
    cells at spaces, so spacing is the one thing a reader cannot recover)."""
    return " ".join(text.split())
