"""How alike a step's completions are: numbers computed once per sample set, exported as the run's series
(`posttrain_completion_diversity{stat=...}`), never the text.

- distinct_share: distinct completions / completions (1: all differ).
- top_share: the most common completion's share of the rows.
- top_prompts: how many distinct prompts the most common completion answers.
- top_prompt_share: top_prompts / distinct prompts; NaN with fewer than 2 distinct prompts (one prompt's answers
  agreeing is what learning that prompt looks like, not a template).
- distinct_2gram: distinct word bigrams / bigrams, each completion framed by a start and an end mark (so an empty
  or one-word completion still counts once).
- similarity: mean pairwise Jaccard similarity of the completions' word sets, over at most SIMILARITY_ROWS rows.
- rows, prompts: how many rows and distinct prompts the set had.
Completions are compared after collapsing whitespace (sampleset.normal). Cost: linear in the set's text, plus
SIMILARITY_ROWS² / 2 small set intersections (about 2,000 at most)."""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations, pairwise

from exporter.parsers.record import Record, RecordKind
from exporter.samples.sampleset import SampleSet, normal

KEY_PREFIX = "samples/"  # the record's keys: samples/<stat>; instruments/keymap.py maps them
STATS = ("distinct_share", "top_share", "top_prompts", "top_prompt_share", "distinct_2gram", "similarity", "rows",
         "prompts")
SIMILARITY_ROWS = 64
FORMAT = "samples"


def diversity(s: SampleSet) -> dict[str, float]:
    texts = [normal(x.completion) for x in s.samples]
    n = len(texts)
    if not n:
        return {}
    counts = Counter(texts)
    top, top_n = counts.most_common(1)[0]
    prompts = {x.prompt for x in s.samples}
    covered = {x.prompt for x, t in zip(s.samples, texts, strict=True) if t == top}
    bigrams: Counter[tuple[str, str]] = Counter()
    for t in texts:
        words = ["<s>", *t.split(), "</s>"]
        bigrams.update(pairwise(words))
    return {
        "distinct_share": len(counts) / n,
        "top_share": top_n / n,
        "top_prompts": float(len(covered)),
        "top_prompt_share": len(covered) / len(prompts) if len(prompts) >= 2 else math.nan,
        "distinct_2gram": len(bigrams) / sum(bigrams.values()),
        "similarity": _similarity(texts[:SIMILARITY_ROWS]),
        "rows": float(n),
        "prompts": float(len(prompts)),
    }


def _similarity(texts: list[str]) -> float:
    if len(texts) < 2:
        return math.nan
    sets = [frozenset(t.split()) for t in texts]
    total = 0.0
    for a, b in combinations(sets, 2):
        union = len(a | b)
        total += len(a & b) / union if union else 1.0  # two empty completions are alike
    return total / (len(sets) * (len(sets) - 1) / 2)


def diversity_record(s: SampleSet) -> Record | None:
    """The set's numbers as a training record at its step (so they become series, detector input and /metrics the
    way every trainer key does)."""
    values = diversity(s)
    if not values:
        return None
    return Record.of_kind(tuple(KEY_PREFIX + k for k in values), list(values.values()), FORMAT, s.step,
                          RecordKind.TRAIN)
