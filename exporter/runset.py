"""One exporter's runs by name: a RunState and its IngestStats each, made when a run is first named, and where a
console log's records go when `run` launched the trainer (launch.py: a log that turns out to be the trainer's feed
joins the trainer's run, and its own run goes)."""

from __future__ import annotations

from exporter.config import Config, LogSpec
from exporter.instruments.keymap import KeyMap
from exporter.launch import ConsoleBesideFeed, Launch, MaybeFeed
from exporter.pipeline import IngestStats
from exporter.runstate import RunState


class RunSet:
    def __init__(self, cfg: Config, launch: Launch | None = None) -> None:
        self.cfg = cfg
        self.launch = launch  # `run`: the trainer it started, whose feed joins its console's run
        self.keymap = KeyMap(cfg.aliases)
        self.runs: dict[str, RunState] = {}
        self.stats: dict[str, IngestStats] = {}

    def get(self, name: str) -> RunState:
        """The run `name`, made (with its counters) the first time it is asked for."""
        if name not in self.runs:
            self.runs[name] = RunState(name, self.keymap, self.cfg.limits, self.cfg.derived)
            self.stats[name] = IngestStats()
        return self.runs[name]

    def console_sink(self, spec: LogSpec) -> RunState | ConsoleBesideFeed | MaybeFeed:
        """What a console log's records go to: its run; under `run`, the trainer's own output beside its feed, and any
        other log its own run until a training line of this launch makes it the trainer's."""
        run = self.get(spec.run)
        launch = self.launch
        if launch is None:
            return run
        if spec.path == "-" and spec.run == launch.run:  # the trainer's own output
            return ConsoleBesideFeed(run, launch)
        return MaybeFeed(run, lambda: self.get(launch.run), launch, self._merged)

    def _merged(self, run: RunState) -> None:
        """A log of `run` turned out to be its trainer's feed: the log's own run (earlier trainings only) goes; what
        its stream counts (lines, errors, drops, before and after) is the trainer's run's from now on."""
        if self.runs.get(run.name) is run:
            del self.runs[run.name]
            stats = self.stats.pop(run.name)
            if self.launch is not None:
                self.stats[self.launch.run].merged.append(stats)
