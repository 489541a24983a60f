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
# The causes of a sign that no detector names: the judgment's own reading of the course, the loss and the trainer.
# (LR_JUMP: a loss jump beside a step of the learning rate.)
PEAKED, NO_TREND, LOSS_JUMP, LR_JUMP, DIED = "peaked", "no_trend", "loss_jump", "lr_jump", "died"


@dataclass(frozen=True)
class Event:
    step: int
    text: str
    kind: str = WARNING
    recommends: str | None = None  # for a sign: what it calls for
    page: bool = False  # a sign that pages (a critical finding, the trainer's death)
    reason: str = ""  # for a sign: what it says, short (the headline's reason)
    name: str = ""  # for an alert's finding: the alert, with its component ("PostTrainKLWarning [format]")
    cause: str = ""  # what raised it: the detector, or one of PEAKED, NO_TREND, LOSS_JUMP, LR_JUMP, DIED

    @property
    def sign(self) -> bool:
        return self.kind == SIGN

    def as_json(self, followed: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "text": self.text, "kind": self.kind}
        if self.name:
            out["alert"] = self.name
        if followed:
            out["followed"] = True
        return out


def followed(story: list[Event]) -> set[int]:
    """The lines of `story` that follow from its first sign: every alert's finding after it that neither pages nor
    is needed to tell it (an alert that pages is said whole). A run that went wrong raises most detectors in turn
    (a KL blow-up brings entropy, length and truncation alerts behind it); a reader needs the first sign and what
    paged, and only the names and steps of the rest."""
    first = next((i for i, e in enumerate(story) if e.sign), None)
    if first is None:
        return set()
    return {i for i, e in enumerate(story) if i > first and e.name and not e.page and e.kind in (SIGN, WARNING)}


def followed_lines(events: list[Event], first_step: int) -> list[str]:
    """The alerts that followed the first sign, in a line or two: those raised at its own step as coming with it,
    the later ones with their onsets."""
    with_it = [e.name for e in events if e.step <= first_step]
    later = [f"{e.name} (step {e.step})" for e in events if e.step > first_step]
    return ([f"with the first sign: {', '.join(with_it)}"] if with_it else []) + (
        [f"after it: {'; '.join(later)}"] if later else [])


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
