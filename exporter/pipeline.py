"""One console stream's path from text to a run: framing, parsing, step attribution, ingest."""

from __future__ import annotations

import logging
import time
from collections import Counter

from exporter.console.framing import MAX_LINE_LENGTH, ConsoleFramer
from exporter.console.postfix import FORMAT as POSTFIX_FORMAT
from exporter.console.postfix import PostfixReader
from exporter.console.steps import StepClock
from exporter.parsers import fastpath
from exporter.parsers.chain import LineParserChain
from exporter.parsers.checkpoints import checkpoint_event
from exporter.parsers.failures import Failure, FailureWatch, trainer_log_line
from exporter.parsers.record import ParseError, Record
from exporter.runstate import RunState
from exporter.samples.diversity import diversity_record
from exporter.samples.reader import DROP_REASONS as SAMPLE_DROP_REASONS
from exporter.samples.reader import PanelError, SampleReader
from exporter.samples.sampleset import SampleSet
from exporter.sources.tensorboard import DROP_REASONS as EVENT_DROP_REASONS
from exporter.sources.trainer_state import DROP_REASONS as STATE_DROP_REASONS

log = logging.getLogger(__name__)

# One warning per run and kind of bad input (format and reason): a broken stream must not flood the
# sidecar's own log.
# Reasons a line is dropped unread (posttrain_exporter_lines_dropped_total), all exported from the start.
# (the file readers' too: trainer_state.json's entries, TensorBoard's records and scalars)
LINE_DROP_REASONS = ("too_long", *SAMPLE_DROP_REASONS, *STATE_DROP_REASONS, *EVENT_DROP_REASONS)
# Reasons a console record's step is doubted (posttrain_exporter_step_disagreements_total), exported from the start.
# epoch: a fallback step that the record's epoch contradicts; cut_line: a record lost to a cut line made the pairing
# of the records after it with the bar's redraws a guess (checked against their epoch); late_redraw: a record took
# its fallback step while its redraw was due (the stream paused past the wait), and the redraw showed another step;
# stale_redraw: a redraw that a line which is no record took (tqdm.write of a message) was left out; refused_bar: a
# bar of another total than the training bar's, drawn from 0 before that one ended, was left out while training
# records took fallback steps (a new training's bar that nothing told apart from an evaluation's; once per such bar).
STEP_DISAGREEMENT_REASONS = ("epoch", "cut_line", "late_redraw", "stale_redraw", "refused_bar")
# A record from a longer line may hold many or long keys: the run's limits are applied before it waits
# for its step or its batch, so that waiting records stay small.
_WIDE_LINE = 16 * 1024
_NEXT_DRAW = object()  # the count a sign's bar moves on from is the next draw's (a record waits for it)


class IngestStats:
    """Counters of what the exporter read, for its self-metrics (per run)."""

    def __init__(self) -> None:
        self.lines: Counter[tuple[str, str]] = Counter()  # (format, outcome)
        self.parse_errors: Counter[tuple[str, str]] = Counter()  # (format, reason)
        self.lines_dropped: Counter[str] = Counter()  # by reason
        self.bar_draws = 0  # counted apart: one per progress-bar draw is the hottest path
        self.step_disagreements: Counter[str] = Counter()  # console records whose step disagrees, by reason
        self.step_sources: Counter[str] = Counter()  # console records without their own step, by its source
        self._warned: set[tuple[str, ...]] = set()  # what was logged once already, for this run alone
        # the counts of a log that turned out to be this run's feed (runset.py): its stream counts there still
        self.merged: list[IngestStats] = []

    def total(self) -> IngestStats:
        """This run's counts with those of the streams merged into it (what is exported and reported)."""
        if not self.merged:
            return self
        out = IngestStats()
        for part in (self, *(m.total() for m in self.merged)):
            for mine, theirs in ((out.lines, part.lines), (out.parse_errors, part.parse_errors),
                                 (out.lines_dropped, part.lines_dropped),
                                 (out.step_disagreements, part.step_disagreements),
                                 (out.step_sources, part.step_sources)):
                mine.update(theirs)
            out.bar_draws += part.bar_draws
        return out

    def first_time(self, *what: str) -> bool:
        """True the first time `what` happens to this run: bad input is counted, and logged only once."""
        if what in self._warned:
            return False
        self._warned.add(what)
        return True

    def warn_once(self, run: str, what: tuple[str, ...], message: str, *args: object) -> None:
        """Logs `message % args` the first time `what` happens to `run` (this stats' run)."""
        if self.first_time(*what):
            log.warning("run %s: " + message, run, *args)

    def error(self, run: str, fmt: str, reason: str, n: int, message: str, *args: object) -> None:
        """`n` inputs of format `fmt` skipped for `reason`: counted (lines by outcome, parse errors by reason),
        and said once per run and reason; `message % args` ends with what is left to the counters."""
        self.lines[fmt, "error"] += n
        self.parse_errors[fmt, reason] += n
        self.warn_once(run, (fmt, reason), message + "; further ones are only counted in "
                       "posttrain_exporter_parse_errors_total", *args)

    @property
    def bars_seen(self) -> int:
        """Progress-bar draws read, nested bars' included: with no record, a run whose metrics were not found."""
        return self.bar_draws + self.lines["tqdm", "nested"]

    def line_counts(self) -> dict[tuple[str, str], int]:
        counts = dict(self.lines)
        if self.bar_draws:
            counts["tqdm", "progress"] = self.bar_draws
        return counts


def take_samples(run: RunState, stats: IngestStats, s: SampleSet) -> None:
    """A sample set, from whichever source, to its run: its rows kept for the report, its diversity a record at
    its step (the text stays here)."""
    run.samples.add(s)
    rec = diversity_record(s)
    if rec is None:
        return
    if rec.step is not None and rec.step < run.step:
        # A set behind the run (a completions folder read after the console got further): as a training record it
        # would read as a resume and cut the run's history back. Its rows stay for the report; its numbers are
        # counted as left out, not applied.
        stats.lines[rec.fmt, "behind_run"] += 1
        return
    stats.lines[rec.fmt, "record"] += 1
    run.ingest(rec)  # counted in run.sample_records by the RunState that takes it


class ConsoleStream:
    """Text of one stream (a file, stdin) in, records into `run` out. It is the framer's sink."""

    def __init__(self, run: RunState, stats: IngestStats, parsers: LineParserChain,
                 max_line_length: int = MAX_LINE_LENGTH, accumulation: int = 1) -> None:
        self.run = run
        self.stats = stats
        self.parsers = parsers
        self.framer = ConsoleFramer(self, max_line_length)
        self._blocks = parsers.metrics_blocks  # the Trainer's metrics blocks the parsers follow (None: none)
        self.clock = StepClock(stats.step_disagreements, self._refused_bar)
        # lines no metric parser takes: the trainer's printed completions (what they leave out: lines_dropped)
        self.samples = SampleReader(self.stats.lines_dropped)
        self.postfixes = PostfixReader(stats.lines, accumulation)  # metrics in bar postfixes (console/postfix.py)
        self.failures = FailureWatch()  # signs that the trainer died, in lines that are no record
        # A sign was read and no output of the trainer's own has followed yet; the training bar's count then (a redraw
        # at that count, as tqdm draws once more at exit, is no sign of life)
        self._sign_pending = False
        self._sign_bar: int | object | None = None
        self.clock.sources = stats.step_sources  # where each record's step came from, counted for the run
        self.last_data = time.monotonic()
        self._waiting_since: float | None = None  # when records began to wait for a progress-bar redraw

    def feed(self, text: str) -> None:
        self.last_data = now = time.monotonic()
        self.framer.feed(text)
        if not self.clock.waiting:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now

    def finish(self) -> None:
        """End of input (dump, or stdin closed): the unterminated tail is a line; nothing waits."""
        self.framer.flush()
        self._close_block()
        self._waiting_since = None
        self._ingest(self.clock.flush())
        self._release_postfix()
        self.samples.finish()
        self._no_records_after_bars()
        self.run.stream_ended()  # a sign with nothing of the trainer's after it is judged as at the output's end

    def settle(self, wait_seconds: float) -> None:
        """Called at every poll: when the stream has been quiet this long, or records have waited this
        long for a progress-bar redraw while text kept coming (a redraw follows its line at once when it
        comes at all), the waiting records take their fallback step."""
        now = time.monotonic()
        quiet = now - self.last_data >= wait_seconds
        if quiet:
            self._close_block()  # a metrics block is printed at once: quiet after it, it is whole
        if quiet or (self._waiting_since is not None and now - self._waiting_since >= wait_seconds):
            self._waiting_since = None
            self._ingest(self.clock.flush())
        if quiet:
            self._release_postfix()

    # --- the framer's sink ----------------------------------------------------------------------

    def bar(self, n: int, total: str, description: str | None) -> None:
        self.stats.bar_draws += 1
        released = self.clock.bar(n, total, description)
        if released:
            self._ingest(released)
        if self._sign_pending:
            self._bar_moved()

    def clear(self) -> None:
        self.clock.clear()
        self.postfixes.cleared()

    def postfix(self, description: str | None, n: int, total: str, bracket: str, nested: bool) -> None:
        for rec in self.postfixes.draw(description, n, total, bracket, self.run.trainer_records):
            self._ingest(self.clock.record(rec))

    def bar_run(self, draws: list[tuple[str | None, str, str, str]]) -> None:
        """bar() and postfix() of each of `draws`, lines that are one bar draw each (description, count, total,
        bracket text), in one call: a bar with a description costs the clock nothing, and the postfix of a bar
        that is not the training bar is only counted."""
        self.stats.bar_draws += len(draws)
        clock, postfixes, run = self.clock, self.postfixes, self.run
        refused = postfixes.refused
        not_training = 0
        for description, n, total, bracket in draws:
            if not description or description.isspace():
                released = clock.bar(int(n), total, description)
                if released:
                    self._ingest(released)
            if "=" in bracket:
                if description in refused and postfixes.idle:
                    not_training += 1
                    continue
                for rec in postfixes.draw(description, int(n), total, bracket, run.trainer_records):
                    self._ingest(clock.record(rec))
        if not_training:
            self.stats.lines[POSTFIX_FORMAT, "not_training"] += not_training
        if self._sign_pending:
            self._bar_moved()

    def _release_postfix(self) -> None:
        """The postfix record waiting for its bar's next draw, when none is coming (the stream ended or went quiet)."""
        for rec in self.postfixes.release(self.run.trainer_records):
            self._ingest(self.clock.record(rec))

    def nested_bar(self) -> None:
        self.stats.lines["tqdm", "nested"] += 1

    def _no_records_after_bars(self) -> None:
        """Said once: progress bars were read, but no record (their metrics, if any, are in no shape read)."""
        if self.stats.bars_seen and not sum(self.run.records.values()):
            self.stats.warn_once(self.run.name, ("bars_without_records",), "read %d progress-bar draws but no "
                                 "metric record: no line or bar postfix of this log is in a format the exporter "
                                 "reads (posttrain_exporter_lines_total by format and outcome)", self.stats.bars_seen)

    def abandoned(self, text: str) -> None:
        self._error(ParseError("cut_line", text[:60], "unknown"))
        if text.startswith("{'"):  # most likely a record printed through tqdm.write: it would have taken a redraw
            self.clock.lost()

    def complete(self, text: str) -> bool:
        """A dict or JSON object cut from its \\n where a bar draw, a clear or an escape follows it (the framer's
        `complete`): read at once when it is a record; False leaves it to the framer (held open for its rest)."""
        try:
            rec = self.parsers.parse(text)
        except Exception:  # broken (a ParseError) or a parser bug: the rest may yet come; read whole, it is counted
            return False
        finally:
            if self._blocks is not None and self._blocks.ended is not None:
                self._take_block()
        if rec is None:
            return False
        self.stats.lines[rec.fmt, "record"] += 1
        if len(text) > _WIDE_LINE:
            rec = self.run.narrowed(rec)
        self._ingest(self.clock.record(rec))
        return True

    def overlong(self) -> None:
        self.stats.lines_dropped["too_long"] += 1
        self.stats.warn_once(self.run.name, ("too_long",), "dropped a line longer than limits.max_line_length (%d "
                             "characters); further ones are only counted in posttrain_exporter_lines_dropped_total",
                             self.framer.max_line_length)

    def line(self, text: str) -> None:
        try:
            rec = self.parsers.parse(text)
        except ParseError as e:
            self._error(e)
            self._take_samples(self._sample_line(text))  # a panel's top line glued after a cut metric line
            return
        except Exception:  # a parser bug must cost one line, never the sidecar
            self._internal_error(text)
            return
        finally:
            if self._blocks is not None and self._blocks.ended is not None:
                self._take_block()  # the line ended a metrics block: the block's record comes first
        if rec is None:
            if not self.parsers.block_line:
                self.stats.lines["none", "unmatched"] += 1
                self.clock.stated(text)  # what it says of the run's scale, for steps without a bar
                self.clock.text_line()
                self._take_samples(self._sample_line(text))
                failure = self.failures.line(text)
                if failure is not None:
                    self._failed(failure)
                elif self._sign_pending:
                    self._sign_of_life(text)
                self._saved(text)
            return
        if rec.step is not None and self.samples.waiting:
            self._take_samples(self.samples.close(rec.step))
        self.stats.lines[rec.fmt, "record"] += 1
        if len(text) > _WIDE_LINE:
            rec = self.run.narrowed(rec)
        self._ingest(self.clock.record(rec))

    def line_run(self, texts: list[str]) -> None:
        """line(text) for each of `texts`, with the per-line calls of the common case inlined."""
        if not fastpath.ENABLED:
            for text in texts:
                self.line(text)
            return
        parse, run, clock, counts = self.parsers.parse, self.run, self.clock, self.stats.lines
        blocks = self._blocks
        if len(texts) > 1 and max(map(len, texts)) <= _WIDE_LINE:
            recs = self.parsers.parse_run(texts)  # every line a record with its step, read at once
            if recs is not None:
                if self.samples.waiting:
                    self._take_samples(self.samples.close(recs[0].step))
                counts[recs[0].fmt, "record"] += len(recs)
                clock.last_step = recs[-1].step
                run.ingest_many(recs)
                return
        stepped: list[Record] = []  # records that carry their step, for run.ingest_many
        for text in texts:
            try:
                rec = parse(text)
            except ParseError as e:
                self._error(e)
                got = self._sample_line(text)
                if got is not None:  # the records before it first: a set's record must not come before them
                    run.ingest_many(stepped)
                    stepped = []
                    self._take_samples(got)
                continue
            except Exception:  # a parser bug must cost one line, never the sidecar
                self._internal_error(text)
                continue
            finally:
                if blocks is not None and blocks.ended is not None:
                    if stepped:
                        run.ingest_many(stepped)
                        stepped = []
                    self._take_block()
            if rec is None:
                if not self.parsers.block_line:
                    counts["none", "unmatched"] += 1
                    clock.stated(text)
                    clock.text_line()
                    got = self._sample_line(text)
                    if got is not None:
                        run.ingest_many(stepped)
                        stepped = []
                        self._take_samples(got)
                    failure = self.failures.line(text)
                    if failure is not None:  # the records before it reach the run first: they came before it
                        run.ingest_many(stepped)
                        stepped = []
                        self._failed(failure)
                    elif self._sign_pending:
                        self._sign_of_life(text)
                    self._saved(text)
                continue
            if rec.step is not None and self.samples.waiting:
                run.ingest_many(stepped)
                stepped = []
                self._take_samples(self.samples.close(rec.step))
            counts[rec.fmt, "record"] += 1
            if len(text) > _WIDE_LINE:
                rec = run.narrowed(rec)
            if rec.step is not None:  # what clock.record does with a record that carries its step
                clock.last_step = rec.step
                stepped.append(rec)
            elif clock.ordinal(rec):  # no bar: the next ordinal step, at once
                stepped.append(rec)
            else:
                if stepped:
                    run.ingest_many(stepped)
                    stepped = []
                self._ingest(clock.record(rec))
        run.ingest_many(stepped)

    def redrawn_run(self, columns: list[tuple[str, ...]], start: int, stop: int) -> int:
        """tqdm.write's lines (console/framing.py, _LINES), lines `start` to `stop` of one bar total: bar(), clear()
        and line() for each, without a call each, for the leading lines whose metric line is a record (and no wider
        than a line that needs narrowing); the index of the first line left (to the framer's one-by-one path)."""
        counts, totals, further, lasts, texts = columns
        total = totals[start]
        if not self.clock.takes_redraws(total):
            return start
        recs = self.parsers.dict_records(texts, start, stop)
        end = start + len(recs)
        if recs and max(map(len, texts[start:end])) > _WIDE_LINE:
            wide = next(i for i in range(start, end) if len(texts[i]) > _WIDE_LINE)
            del recs[wide - start :]
            end = wide
        if not recs:
            return start
        released = self.clock.redrawn(total, list(map(int, counts[start:end])),
                                      int(lasts[end - 1] or counts[end - 1]), recs)
        self.stats.bar_draws += len(recs) + "".join(further[start:end]).count("\r")
        self.stats.lines[recs[0].fmt, "record"] += len(recs)  # parse_hf_dict's records are all "hf_dict"
        self.run.ingest_many(released)
        return end

    # --- printed completions (exporter/samples) ---------------------------------------------------------------------

    def _sample_line(self, text: str) -> SampleSet | None:
        """A line no metric parser took, to the sample readers: the set it completes, if any. (A metric line closes
        the verl samples printed before it: `self.samples.close(step)`.)"""
        try:
            return self.samples.line(text)
        except PanelError as e:
            self._error(ParseError("broken_panel", str(e), "trl_panel"))
        except Exception:  # a reader bug must cost one line, never the sidecar
            self._internal_error(text)
        return None

    def _take_samples(self, s: SampleSet | None) -> None:
        """The set's rows kept for the report, its diversity a record at its step (the text stays here). The
        records read before it must have reached the run: a record at an earlier step after it is a resume."""
        if s is not None:
            take_samples(self.run, self.stats, s)

    def _take_block(self) -> None:
        rec = self.parsers.ended_block
        if rec is not None:
            self._ingest_block(rec)

    def _close_block(self) -> None:
        rec = self.parsers.close_block()
        if rec is not None:
            self._ingest_block(rec)

    def _ingest_block(self, rec: Record) -> None:
        """A metrics block's record (one per block), less the values that round what the run holds already: the
        Trainer logged them precisely just before (its summary or evaluation dict), and the block prints them
        rounded."""
        self.stats.lines[rec.fmt, "record"] += 1
        tolerance = self.parsers.block_tolerance()
        self.run.refresh()  # once per block: the dict before it reaches the run's values
        known = self.run.passthrough
        keep = [i for i, (key, value) in enumerate(zip(rec.shape, rec.numbers, strict=True))
                if key not in known or not abs(known[key] - value) <= tolerance.get(key, 0.0)]
        if len(keep) < len(rec.shape):
            rec = rec.subset(keep)
        if rec.shape or rec.skipped:
            self._ingest(self.clock.record(rec))

    def _saved(self, text: str) -> None:
        event = checkpoint_event(text)
        if event is not None:
            self.run.saved(event)

    def _failed(self, failure: Failure) -> None:
        """A sign that the trainer died: the run told, with the trainer's records read before it that still wait
        for their step (a bar's redraw, a postfix's next draw); said once per run, once its text says what
        happened. A traceback that turned out to be the reward function's (all its frames outside the trainer's
        process) is counted as such instead, and said once."""
        if failure.kind == "reward_function":
            self.run.reward_function_failed(failure)
            self._sign_pending = self.run.failure is not None
            self.stats.warn_once(self.run.name, ("reward_function",), "the reward function is failing (a traceback "
                                 "whose frames are all outside the trainer's process: %.200s); no sign that the "
                                 "trainer died; further ones are only counted in "
                                 "posttrain_reward_function_errors_total", failure.text)
            return
        self.run.failed(failure, self.clock.waiting_records() + (not self.postfixes.idle))
        # a record waiting for its redraw takes the next one: the count to move on from is that one's
        self._sign_pending = True
        self._sign_bar = _NEXT_DRAW if self.clock.waiting_records() else self.clock.bar_count
        if failure.said and self.stats.first_time("failure"):
            where = f"after step {self.run.step}" if self.run.step >= 0 else "before its first step"
            log.warning("run %s: the trainer's output shows a failure (%s) %s: %.200s; the run is judged crashed "
                        "unless the trainer's own output goes on", self.run.name, failure.kind, where, failure.text)

    def _bar_moved(self) -> None:
        """The training bar drew since the sign: at another count, the trainer lived on."""
        if self._sign_bar is _NEXT_DRAW:
            self._sign_bar = self.clock.bar_count
        elif self.clock.bar_count != self._sign_bar:
            self._lived_on()

    def _sign_of_life(self, text: str) -> None:
        """A line after the sign that no metric parser took: the trainer's own log line or checkpoint save says it
        lived on; anything else (what the model wrote, a launcher's error lines) does not."""
        if trainer_log_line(text) or checkpoint_event(text) is not None:
            self._lived_on()

    def _lived_on(self) -> None:
        self._sign_pending = False
        self.run.lived_on()

    def _refused_bar(self, total: str, training_total: str, count: int) -> None:
        self.stats.warn_once(self.run.name, ("refused_bar",), "training records take fallback steps after step %d "
                             "while a progress bar of %s steps, drawn from 0 before the training bar (%s steps) "
                             "ended, was left out as no training bar; if a new training began (a trainer restarted "
                             "with another max_steps, without its `Total optimization steps` line), their steps are "
                             "guesses; further ones are only counted in "
                             "posttrain_exporter_step_disagreements_total{reason=\"refused_bar\"}",
                             count, total, training_total)

    def _internal_error(self, text: str) -> None:
        self.stats.lines["unknown", "error"] += 1
        self.stats.parse_errors["unknown", "internal_error"] += 1
        if self.stats.first_time("unknown", "internal_error"):
            log.exception("run %s: the parser failed on a line (skipped; further ones are only counted in "
                          "posttrain_exporter_parse_errors_total): %.120r", self.run.name, text)

    def _error(self, e: ParseError) -> None:
        self.stats.error(self.run.name, e.fmt, e.reason, 1, "skipped a line that could not be parsed (%s)", e)

    def _ingest(self, records: list[Record]) -> None:
        for rec in records:
            self.run.ingest(rec)
