"""The identity of one training, as the TRL callback's feed announces it: a line written at train start,

    {"posttrain_training": {"id": "9c1e4f2a7b3d5e60", "started": "2026-11-26T06:04:02.123Z", "step": 0}}

before any of that training's records. `id` is made at train start (random), `started` is the trainer's start
time (UTC), `step` the trainer's step at its start (0, or the checkpoint's step when it resumed); `launch`, when
the trainer runs under `posttrain-exporter run`, is the token that command gave it (its console and its feed are
then one run). A feed appended to by several trainings holds one such line before each; the exporter judges each
training on its own (exporter/runstate.py), and its verdicts and stop files name the training they are about."""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass

from exporter.parsers.record import ParseError, Record, RecordKind
from exporter.parsers.values import MAX_STEP

TRAINING_KEY = "posttrain_training"
LINE_PREFIX = '{"' + TRAINING_KEY + '"'
# The environment variable `posttrain-exporter run` sets for its trainer: the token its feed repeats.
LAUNCH_ENV = "POSTTRAIN_EXPORTER_LAUNCH"
_TOKEN = re.compile(r"^[0-9A-Za-z._:-]{1,64}$")  # an id or a token: short, printable, no label trouble
_STARTED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z$")


@dataclass(frozen=True)
class Training:
    id: str
    started: str  # ISO 8601, UTC
    step: int = 0  # the trainer's step at its start
    launch: str | None = None

    @classmethod
    def new(cls, step: int = 0, launch: str | None = None, now: float | None = None) -> Training:
        t = time.time() if now is None else now
        started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
        return cls(secrets.token_hex(8), started, step, launch if launch and _TOKEN.match(launch) else None)

    def as_json(self) -> dict[str, object]:
        """As verdicts and stop files carry it."""
        return {"id": self.id, "started": self.started, "step": self.step}

    def line(self) -> str:
        doc: dict[str, object] = self.as_json()
        if self.launch is not None:
            doc["launch"] = self.launch
        return json.dumps({TRAINING_KEY: doc}, separators=(", ", ": ")) + "\n"


class TrainingStart(Record):
    """The record a training's line becomes: no values, the training's start step, and who it is."""

    __slots__ = ("training",)

    @classmethod
    def of_training(cls, training: Training) -> TrainingStart:
        rec = cls.__new__(cls)
        rec._fill((), [], "jsonl", training.step, {}, {}, RecordKind.TRAINING)
        rec.training = training
        return rec


def parse_training(obj: dict) -> TrainingStart:
    """`{"posttrain_training": {...}}` (already loaded) as its record; ParseError `bad_training` when it is not one
    the callback writes (a training with a made-up identity must not reset a run)."""
    t = obj.get(TRAINING_KEY)
    if not isinstance(t, dict) or len(obj) != 1:
        raise ParseError("bad_training", "not {\"posttrain_training\": {id, started, step}}", "jsonl")
    tid, started, step, launch = t.get("id"), t.get("started"), t.get("step", 0), t.get("launch")
    if not (isinstance(tid, str) and _TOKEN.match(tid)):
        raise ParseError("bad_training", "id must be a short token", "jsonl")
    if not (isinstance(started, str) and _STARTED.match(started)):
        raise ParseError("bad_training", "started must be an ISO 8601 UTC time", "jsonl")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ParseError("bad_training", "step must be a non-negative integer", "jsonl")
    if launch is not None and not (isinstance(launch, str) and _TOKEN.match(launch)):
        raise ParseError("bad_training", "launch must be a short token", "jsonl")
    return TrainingStart.of_training(Training(tid, started, step, launch))
