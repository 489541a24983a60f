"""Where a run's completions collapse to one template: the labelling rule of the samples corpus runs.

Written before the template-collapse detector, and never changed to suit it (tests/fixtures/corpus/README.md,
"Runs that print their completions"). A table is a logged step's rows (prompt, completion); it shows a template
when one completion (whitespace collapsed) is at least half of its rows and the answer to at least 75 % of its
distinct prompts (at least 2 distinct prompts). The onset is the first step S showing one from which at least 8 of
the 10 tables S..S+9 do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

ROW_SHARE = 0.5
PROMPT_SHARE = 0.75
SPAN = 10
HOLD = 8


def normal(text: str) -> str:
    return " ".join(text.split())


def shows_template(rows: Sequence[tuple[str, str]]) -> bool:
    """rows: (prompt, completion) of one table."""
    prompts = {p for p, _ in rows}
    if len(prompts) < 2 or not rows:
        return False
    counts = Counter(normal(c) for _, c in rows)
    top, n = counts.most_common(1)[0]
    covered = {p for p, c in rows if normal(c) == top}
    return n >= ROW_SHARE * len(rows) and len(covered) >= PROMPT_SHARE * len(prompts)


def template_onset(tables: Iterable[tuple[int, Sequence[tuple[str, str]]]]) -> int | None:
    """tables: (step, rows) in step order. The labelled onset, or None."""
    marks = [(step, shows_template(rows)) for step, rows in tables]
    for i, (step, shows) in enumerate(marks):
        window = marks[i : i + SPAN]
        if shows and len(window) == SPAN and sum(s for _, s in window) >= HOLD:
            return step
    return None
