"""Every input is decided and built here: `open_input(spec, runs)` looks at what the spec names (a pod's log, a
Trainer's checkpoints, TensorBoard event files, TRL's completions folder, standard input, a console log;
sources/detect.py tells them apart) and returns a ready Source: its reader, the pipeline its text or records take,
and its run (from runset.py). The exporter (app.py) only holds what it gets and polls it; no input reaches back
into it.

One module per kind of input, named as the module of its reader in sources/ (trainer_state.py beside
sources/trainer_state.py, ...); console.py builds the console pipeline that files and streams share."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from exporter.config import LogSpec
from exporter.pipeline import IngestStats
from exporter.runset import RunSet
from exporter.runstate import RunState
from exporter.sources.base import ChunkReader, Source
from exporter.sources.detect import COMPLETIONS, TENSORBOARD, TRAINER_STATE, input_kind
from exporter.sources.inputs.completions import CompletionsInput
from exporter.sources.inputs.console import console_stream
from exporter.sources.inputs.file import FileInput
from exporter.sources.inputs.pending import PendingInput
from exporter.sources.inputs.stream import StreamInput
from exporter.sources.inputs.tensorboard import TensorBoardInput
from exporter.sources.inputs.trainer_state import TrainerStateInput
from exporter.sources.kubernetes import KubernetesLogReader, KubernetesSourceError, is_kubernetes_path
from exporter.sources.stdin import StdinReader

log = logging.getLogger(__name__)

# The kinds whose reader yields records (or sample sets) of its own, not console text: kind -> its input.
RECORD_INPUTS: dict[str, Callable[[LogSpec, RunState, IngestStats], Source]] = {
    TRAINER_STATE: TrainerStateInput,
    TENSORBOARD: TensorBoardInput,
    COMPLETIONS: CompletionsInput,
}


def open_input(spec: LogSpec, runs: RunSet, reader: ChunkReader | None = None) -> Source:
    """The input reading `spec` into its run in `runs`: its path's kind, or `reader` (a stream the caller made:
    the trainer child's output, standard input copied through, the demo's replay). A path that cannot say yet
    what it is is decided at the first poll that can."""
    runs.get(spec.run)  # the run is there (and scraped) before its log is
    if reader is not None:
        source: Source = StreamInput(spec, console_stream(spec, runs), reader)
    else:
        source = input_for(spec, runs) or PendingInput(spec, functools.partial(input_for, runs=runs))
    log.debug("run %s reads %s through %s (format %s)", spec.run, spec.path, type(source).__name__, spec.format)
    return source


def input_for(spec: LogSpec, runs: RunSet) -> Source | None:
    """The input reading `spec` as what its path holds, or None while that cannot be told."""
    if is_kubernetes_path(spec.path):  # a container's log through the Kubernetes API: a console stream
        return _kubernetes(spec, runs)
    kind = input_kind(spec.path, spec.format)
    if kind is None:
        return None
    if kind in RECORD_INPUTS:
        return RECORD_INPUTS[kind](spec, runs.get(spec.run), runs.stats[spec.run])
    if spec.path == "-":
        return StreamInput(spec, console_stream(spec, runs), StdinReader())
    return FileInput(spec, console_stream(spec, runs))


def _kubernetes(spec: LogSpec, runs: RunSet) -> Source:
    """k8s://: bad paths, a missing POD_NAMESPACE/POD_NAME, package or credentials stop the start here."""
    if spec.format in (TRAINER_STATE, TENSORBOARD):
        raise KubernetesSourceError(f"{spec.path}: a container's log is console text, not {spec.format}")
    return StreamInput(spec, console_stream(spec, runs), KubernetesLogReader.from_path(spec.path))
