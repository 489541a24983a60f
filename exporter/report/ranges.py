"""Step ranges a person can read on a long run: a finding's episodes merged where the gaps between them are small
next to the run's length, and the regime spans as shares and as a short timeline of majorities."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from exporter.report.verdict import Episode

MERGE_GAP = 0.01  # episodes closer than this fraction of the run read as one stretch
SHOWN = 6  # stretches printed before "and N more"
TIMELINE_BLOCKS = 12  # the regime timeline: the run cut into this many equal parts before equal ones are joined


@dataclass(frozen=True)
class Stretch:
    start: int
    end: int | None  # None: still active at the last step
    episodes: int  # how many episodes it joins
    firing: int  # steps the alert fired within it (the gaps left out)

    def text(self, dash: str = "-") -> str:
        end = "end" if self.end is None else str(self.end)
        span = str(self.start) if self.end == self.start else f"{self.start}{dash}{end}"
        return span if self.episodes == 1 else f"{span} ({self.episodes} episodes)"


def stretches(episodes: list[Episode], first_step: int, last_step: int) -> list[Stretch]:
    """`episodes` (in step order) joined where the gap between two is under MERGE_GAP of the run's steps."""
    gap = max(1, round((last_step - first_step) * MERGE_GAP))
    out: list[Stretch] = []
    for e in episodes:
        end = e.end if e.end is not None else last_step
        firing = end - e.start + 1
        if out and out[-1].end is not None and e.start - out[-1].end <= gap:
            prev = out[-1]
            out[-1] = Stretch(prev.start, e.end, prev.episodes + 1, prev.firing + firing)
        else:
            out.append(Stretch(e.start, e.end, 1, firing))
    return out


def shown(items: list[str], limit: int = SHOWN) -> str:
    """The first `limit` items, then how many more."""
    head = ", ".join(items[:limit])
    return head if len(items) <= limit else f"{head} and {len(items) - limit} more"


def _covered(regimes: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Each span as the steps it stands for: from its first step to the next span's first (its own last + 1 at
    the end)."""
    out = []
    for i, (a, b, name) in enumerate(regimes):
        end = regimes[i + 1][0] if i + 1 < len(regimes) else b + 1
        out.append((a, end, name))
    return out


def regime_shares(regimes: list[tuple[int, int, str]]) -> list[tuple[str, float]]:
    """Each regime's share of the judged steps, largest first."""
    steps: dict[str, int] = defaultdict(int)
    for a, end, name in _covered(regimes):
        steps[name] += end - a
    total = sum(steps.values()) or 1
    return sorted(((n, s / total) for n, s in steps.items()), key=lambda x: -x[1])


def regime_timeline(regimes: list[tuple[int, int, str]],
                    blocks: int = TIMELINE_BLOCKS) -> list[tuple[int, int, str, float]]:
    """(first step, last step, regime, its share there): the run cut into `blocks` equal parts, each named by
    the regime that held most of its steps, neighbours of the same name joined. Spans that fit are kept as
    they are."""
    if not regimes:
        return []
    cov = _covered(regimes)
    if len(cov) <= blocks:
        return [(a, end - 1, name, 1.0) for a, end, name in cov]
    x0, x1 = cov[0][0], cov[-1][1]
    size = max(1, -(-(x1 - x0) // blocks))
    held: list[dict[str, int]] = [defaultdict(int) for _ in range(blocks)]
    for a, end, name in cov:
        while a < end:
            k = min((a - x0) // size, blocks - 1)
            cut = min(end, x0 + (k + 1) * size) if k < blocks - 1 else end
            held[k][name] += cut - a
            a = cut
    out: list[tuple[int, int, str, int, int]] = []  # first, last, name, its steps, all steps
    for k, h in enumerate(held):
        if not h:
            continue
        name = max(h, key=lambda n: h[n])
        lo, hi = x0 + k * size, min(x1, x0 + (k + 1) * size) - 1
        if out and out[-1][2] == name:
            p = out[-1]
            out[-1] = (p[0], hi, name, p[3] + h[name], p[4] + sum(h.values()))
        else:
            out.append((lo, hi, name, h[name], sum(h.values())))
    return [(a, b, name, mine / total) for a, b, name, mine, total in out]
