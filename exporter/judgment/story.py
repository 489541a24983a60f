"""The lines of a run's story, and the recommendations they call for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# The recommendations, most urgent first.
STOP_NOW, INVESTIGATE, STOP, CONTINUE, NOT_JUDGED = "stop_now", "investigate", "stop", "continue", "not_judged"
RECOMMENDATIONS = (STOP_NOW, INVESTIGATE, STOP, CONTINUE, NOT_JUDGED)
# What a line of the story is: a sign that decides the recommendation (the story's first sign is the earliest),
# a warning that came with it, the course of the progress measure, or a note of what passed without an alert.
SIGN, WARNING, COURSE, NOTE = "sign", "warning", "course", "note"


@dataclass(frozen=True)
class Event:
    step: int
    text: str
    kind: str = WARNING
    recommends: str | None = None  # for a sign: what it calls for
    page: bool = False  # a sign that pages (a critical finding, the trainer's death)
    reason: str = ""  # for a sign: what it says, short (the headline's reason)

    @property
    def sign(self) -> bool:
        return self.kind == SIGN

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "text": self.text, "kind": self.kind}


class FindingLike(Protocol):
    """What the judgment reads of a finding (report/verdict.py's Finding)."""

    alert: str
    detector: str
    severity: str
    component: str | None
    first_step: int
    summary: str

    @property
    def onset(self) -> int: ...
