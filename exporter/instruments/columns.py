"""A batch of records turned into one column per canonical series.

Records are buffered and applied in batches (runstate.py): moving values into the series
and running the per-record checks one key of one record at a time costs a Python loop iteration
per key, which was most of the exporter's time on a large log. Here the records of each shape
(the same keys in the same order, which a trainer repeats) become one 2-D numpy array, its
columns are the series, and a series fed by several shapes is merged back into record order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from exporter.parsers.record import Record, RecordKind

SeriesKey = tuple[str, str | None]  # (instrument, sub-label value)
Shape = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShapePlan:
    """Which position of a record shape feeds which series, and which keys of it are exported at all."""

    series: tuple[SeriesKey, ...]
    positions: tuple[int, ...]
    exported: tuple[int, ...] | None = None  # positions of the keys exported as pass-through (None: all)
    dropped: tuple[tuple[str, int], ...] = ()  # (reason, keys) each record of the shape loses to a limit


@dataclass(frozen=True, slots=True)
class Column:
    """One series' values in a batch, in record order: NaN and inf included, `finite` marks the rest."""

    rows: np.ndarray  # index of each value's record in the batch
    steps: np.ndarray
    values: np.ndarray
    finite: np.ndarray

    @property
    def all_finite(self) -> bool:
        return bool(self.finite.all())

    def where(self, mask: np.ndarray) -> Column:
        """The values at `mask`'s positions, rows still indexing the whole batch."""
        return Column(self.rows[mask], self.steps[mask], self.values[mask], self.finite[mask])

    def finite_values(self) -> np.ndarray:
        return self.values if self.all_finite else self.values[self.finite]

    def finite_steps(self) -> np.ndarray:
        return self.steps if self.all_finite else self.steps[self.finite]

    def last_finite(self) -> float | None:
        v = self.finite_values()
        return float(v[-1]) if len(v) else None

    def paired_with(self, other: Column, nrows: int) -> tuple[np.ndarray, np.ndarray]:
        """This series' and another's values in the records that logged both, finite, in record order."""
        a, b = np.full(nrows, np.nan), np.full(nrows, np.nan)
        a[self.rows[self.finite]] = self.values[self.finite]
        b[other.rows[other.finite]] = other.values[other.finite]
        both = np.isfinite(a) & np.isfinite(b)
        return a[both], b[both]


def rows_by_shape(records: Sequence[Record]) -> dict[Shape, list[int]]:
    """The batch's row indices of each record shape, in order."""
    out: dict[Shape, list[int]] = {}
    for i, rec in enumerate(records):
        rows = out.get(rec.shape)
        if rows is None:
            out[rec.shape] = [i]
        else:
            rows.append(i)
    return out


def batch_columns(records: Sequence[Record], shapes: dict[Shape, list[int]],
                  plan_of: Callable[[Shape], ShapePlan]) -> dict[SeriesKey, Column]:
    """Columns of every series the batch's training records feed. Records carry their step."""
    parts: dict[SeriesKey, list[tuple[np.ndarray, np.ndarray]]] = {}
    for shape, rows in shapes.items():
        plan = plan_of(shape)
        if not plan.series or records[rows[0]].kind is not RecordKind.TRAIN:
            continue
        table = np.array([records[i].numbers for i in rows], dtype=np.float64)
        rows_a = np.array(rows, dtype=np.int64)
        for sk, pos in zip(plan.series, plan.positions, strict=True):
            parts.setdefault(sk, []).append((rows_a, table[:, pos]))
    steps = np.fromiter([r.step for r in records], dtype=np.int64, count=len(records))
    out: dict[SeriesKey, Column] = {}
    for sk, pieces in parts.items():
        if len(pieces) == 1:
            rows_a, vals = pieces[0]
        else:  # the series comes from several shapes: back into record order
            rows_a = np.concatenate([r for r, _ in pieces])
            vals = np.concatenate([v for _, v in pieces])
            order = np.argsort(rows_a, kind="stable")
            rows_a, vals = rows_a[order], vals[order]
        out[sk] = Column(rows_a, steps[rows_a], vals, np.isfinite(vals))
    return out
