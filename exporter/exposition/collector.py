"""Renders the exporter's state as Prometheus metric families on each scrape.

Values are computed when records arrive; a scrape only copies them out under the lock."""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.app import Exporter
from exporter.buildinfo import REVISION
from exporter.console.steps import STEP_SOURCES
from exporter.instruments.derived import threshold_series
from exporter.instruments.families import BY_NAME as FAMILIES
from exporter.instruments.keymap import INSTRUMENTS
from exporter.pipeline import LINE_DROP_REASONS, STEP_DISAGREEMENT_REASONS
from exporter.runstate import KEY_DROP_REASONS


def _labelled_gauge(name: str, doc: str) -> Metric:
    # Series of one family carry different sub-labels (component, bound, ...), so samples are
    # added one by one instead of through a fixed label list.
    return Metric(name, doc, "gauge")


def _labelled_counter(name: str, doc: str) -> Metric:
    return Metric(name, doc, "counter")


class ExporterCollector(Collector):
    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        with self.exporter.lock:
            for run in self.exporter.runs.values():
                run.refresh()
            yield from self._training()
            yield from self._health()

    def _training(self) -> Iterator[Metric]:
        ex = self.exporter
        step = GaugeMetricFamily("posttrain_step", "Last training step logged.", labels=["run"])
        finished = GaugeMetricFamily("posttrain_run_finished",
                                     "1 once the trainer printed its end-of-training summary.", labels=["run"])
        crashed = GaugeMetricFamily("posttrain_run_crashed",
                                    "1 when the trainer died: its output shows a traceback, an abort, a shell's "
                                    "Killed, and then stopped (nothing of the trainer's own after it: its output "
                                    "ended, or has been silent for longer than the run's usual silence; under `run`: "
                                    "the trainer exited), or under `run` it exited non-zero; the verdict crashed. "
                                    "/api/v1/verdict says what it died of.", labels=["run"])
        reward_errors = CounterMetricFamily("posttrain_reward_function_errors",
                                            "Tracebacks printed of code outside the trainer's process (a reward "
                                            "function's sandbox or subprocess: every frame in <string>, <sandbox>, "
                                            "<stdin> or a temporary file): the reward function is failing; no sign "
                                            "that the trainer died. The report says the last reason.",
                                            labels=["run"])
        families: dict[str, Metric] = {}
        last_step = _labelled_gauge("posttrain_instrument_last_step",
                                    "Training step at which each instrument was last logged.")
        passthrough = GaugeMetricFamily("posttrain_metric", "Every numeric key a trainer logged, unchanged, "
                                        "last value (training, evaluation and summary records).",
                                        labels=["run", "key"])
        for name, run in ex.runs.items():
            if run.step >= 0:
                step.add_metric([name], run.step)
            finished.add_metric([name], 1.0 if run.finished else 0.0)
            crashed.add_metric([name], 1.0 if run.crash is not None else 0.0)
            reward_errors.add_metric([name], run.reward_function_errors)
            for (inst_name, label_value), s in sorted(run.series.items(), key=_series_order):
                if s.last_step < 0:
                    continue
                inst = INSTRUMENTS[inst_name]
                fam = families.get(inst_name)
                if fam is None:
                    fam = families[inst_name] = _labelled_gauge(inst.metric, inst.help)
                labels = {"run": name}
                if inst.label:
                    labels[inst.label] = label_value or ""
                fam.add_sample(inst.metric, labels, s.last_value)
                last_step.add_sample(last_step.name, {**labels, "instrument": inst_name}, s.last_step)
            for key, value in run.passthrough.items():
                passthrough.add_metric([name, key], value)
        yield step
        yield finished
        yield crashed
        yield reward_errors
        yield from self._judgments()
        yield from families.values()
        yield last_step
        yield passthrough
        yield from self._derived()

    def _judgments(self) -> Iterator[Metric]:
        from exporter.judgment.story import RECOMMENDATIONS
        from exporter.report.live import judgment_of  # loaded at the first scrape, not at start-up

        rec = GaugeMetricFamily("posttrain_run_recommendation", "The judgment of the run as a whole: 1 for what "
                                "to do next (continue, stop, stop_now, investigate, not_judged), 0 for the others; "
                                "/api/v1/verdict says why.", labels=["run", "recommendation"])
        learning = GaugeMetricFamily("posttrain_run_learning", "1 while the run is learning its task, 0 when the "
                                     "judgment finds it is not (the verdict not_learning); absent while too early "
                                     "to say.", labels=["run"])
        keep = GaugeMetricFamily("posttrain_checkpoint_keep_step", "Step of the checkpoint to keep: the saved one "
                                 "nearest the run's best step (before its first sign of trouble when it must stop "
                                 "now), or the best step itself when the log says nothing of what was saved; absent "
                                 "when no checkpoint is worth keeping (a reward that never rose beyond its noise).",
                                 labels=["run", "saved"])
        for name, run in self.exporter.runs.items():
            if not run.trainer_records:
                continue
            j = judgment_of(run)
            for r in RECOMMENDATIONS:
                rec.add_metric([name, r], 1.0 if r == j.recommendation else 0.0)
            if j.learning is not None:
                learning.add_metric([name], 1.0 if j.learning else 0.0)
            if j.keep is not None:
                saved = j.keep.step is not None
                keep.add_metric([name, "true" if saved else "false"], j.keep.step if saved else j.keep.best_step)
        yield rec
        yield learning
        yield keep

    def _derived(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        breaches = _labelled_counter("posttrain_threshold_breaches", "Records whose value crossed a threshold, by "
                                     "instrument and level: a breach between two scrapes still counts.")
        flips = CounterMetricFamily("posttrain_loss_sign_flips", "Times the smoothed loss went negative after "
                                    "being positive: the update direction reversed.", labels=["run"])
        jumps = CounterMetricFamily("posttrain_loss_discontinuities", "Times the loss magnitude shifted out of "
                                    "the band [0.5, 2] x its median before, beyond its usual swings (suddenly "
                                    "doubled or halved).", labels=["run"])
        thresholds = GaugeMetricFamily("posttrain_threshold", "Threshold in force for this run (the default "
                                       "or the config's), quoted by the alerts and drawn by the boards.",
                                       labels=["run", "instrument", "level"])
        nonfinite = _labelled_counter("posttrain_nonfinite_values", "NaN or infinite values logged, by "
                                      "instrument: a NaN between two scrapes still counts.")
        windows = GaugeMetricFamily("posttrain_window_steps", "Window of the derived series, in logged points: "
                                    "size and min_points.", labels=["run", "instrument", "setting"])
        for name, run in self.exporter.runs.items():
            d = run.derived
            for (metric, labels), value in sorted(d.gauges.items()):
                fam = families.get(metric)
                if fam is None:
                    fam = families[metric] = _labelled_gauge(metric, FAMILIES[metric].help)
                fam.add_sample(metric, {"run": name, **dict(labels)}, value)
            for labels, n in sorted(d.breaches.items()):
                breaches.add_sample(breaches.name + "_total", {"run": name, **dict(labels)}, n)
            for (inst_name, label_value), n in sorted(run.nonfinite.items(), key=_series_order):
                sub = INSTRUMENTS[inst_name].label
                labels = {"run": name, "instrument": inst_name, **({sub: label_value or ""} if sub else {})}
                nonfinite.add_sample(nonfinite.name + "_total", labels, n)
            flips.add_metric([name], d.loss_sign_flips)
            jumps.add_metric([name], d.loss_discontinuities)
            for (inst, level), value in threshold_series(run.settings.thresholds).items():
                thresholds.add_metric([name, inst, level], value)
            specs = {"default": run.settings.window, **run.settings.per_instrument}
            for inst, spec in specs.items():
                windows.add_metric([name, inst, "size"], spec.size)
                windows.add_metric([name, inst, "min_points"], spec.min_points)
        yield from families.values()
        yield from (breaches, nonfinite, flips, jumps, thresholds, windows)
        yield from self._detectors()

    def _detectors(self) -> Iterator[Metric]:
        p = "posttrain_detector_"
        active = _labelled_gauge(p + "active", "1 while a detector's condition has held for its required logged "
                                 "steps (and has not failed for detectors.clear_steps since): what the alerts read.")
        held = _labelled_gauge(p + "held_steps", "Consecutive logged steps the detector's condition has held.")
        required = _labelled_gauge(p + "required_steps", "Logged steps the condition must hold to be active "
                                   "(config detectors.<name>.steps).")
        onsets = _labelled_counter(p + "onsets", "Times the detector became active: one that began and ended "
                                   "between two scrapes still counts.")
        spikes = _labelled_counter(p + "spikes", "Excursions of the logged value beyond the detector's limit "
                                   "that lasted fewer steps than required: counted, never alerted on.")
        since = _labelled_gauge(p + "since_step", "Logged step at which the condition that made the detector "
                                "active began to hold.")
        value = _labelled_gauge(p + "value", "The level the detector judged at its last logged step.")
        limit = _labelled_gauge(p + "limit", "The limit that level was judged against (a threshold, or a "
                                "multiple of the run's baseline).")
        baseline = _labelled_gauge("posttrain_baseline", "The run's own start for an instrument: median of its "
                                   "first baselines.points logged values, or the configured value.")
        for name, run in self.exporter.runs.items():
            for r in run.detectors.readings():
                labels = {"run": name, "detector": r.detector.name}
                if r.sub is not None:
                    labels["component"] = r.sub
                active.add_sample(active.name, {**labels, "severity": r.detector.severity}, float(r.state.active))
                required.add_sample(required.name, labels, r.state.required)
                onsets.add_sample(onsets.name + "_total", labels, r.state.onsets)
                spikes.add_sample(spikes.name + "_total", labels, r.state.spikes)
                if r.step < 0:  # no point judged yet
                    continue
                held.add_sample(held.name, labels, r.state.held)
                value.add_sample(value.name, labels, r.value)
                limit.add_sample(limit.name, labels, r.limit)
                if r.state.since_step >= 0:
                    since.add_sample(since.name, labels, r.state.since_step)
            for (inst, sub), v in run.detectors.baselines():
                labels = {"run": name, "instrument": inst}
                sub_label = INSTRUMENTS[inst].label if inst in INSTRUMENTS else None
                if sub_label:
                    labels[sub_label] = sub or ""
                baseline.add_sample(baseline.name, labels, v)
        yield from (active, held, required, onsets, spikes, since, value, limit, baseline)

    def _health(self) -> Iterator[Metric]:
        ex = self.exporter
        p = "posttrain_exporter_"
        lines = CounterMetricFamily(p + "lines", "Lines (and progress-bar draws) read, by format and outcome "
                                    "(record, progress, unmatched, error; format tqdm: nested, a nested bar's draw "
                                    "left out; format tqdm_postfix, each draw whose bar postfix holds key=value: "
                                    "record, repeat, not_training, superseded, accumulating, no_numbers).",
                                    labels=["run", "format", "outcome"])
        errors = CounterMetricFamily(p + "parse_errors", "Lines that looked like a format but could not be "
                                     "read, by reason.", labels=["run", "format", "reason"])
        records = CounterMetricFamily(p + "records", "Records ingested, by kind (train, eval, summary).",
                                      labels=["run", "kind"])
        last = GaugeMetricFamily(p + "last_record_timestamp_seconds", "Unix time of the last record, read or, for a "
                                 "log file, its modification time if older (a log caught up on after its trainer "
                                 "died is that old; stall detection: time() minus this).", labels=["run"])
        dropped = CounterMetricFamily(p + "keys_dropped", "Values of keys left out, by reason: max_keys (past "
                                      "limits.max_keys distinct keys: not exported as posttrain_metric, nor as a "
                                      "label value such as a reward component), key_too_long (over "
                                      "limits.max_key_length), key_not_utf8.", labels=["run", "reason"])
        lines_dropped = CounterMetricFamily(p + "lines_dropped", "Lines dropped unread, and what the readers "
                                            "leave out to stay in bounded memory, by reason: too_long (over "
                                            "limits.max_line_length characters); of printed completions: "
                                            "panel_unfinished, panel_rows_over_cap (rows past 4096, or past "
                                            "32768 cells), panel_too_wide (over 64 columns), samples_without_step, "
                                            "sample_scores_over_cap (lines), samples_over_cap, "
                                            "sample_without_response (samples); of trainer_state.json: "
                                            "entry_too_large (over 1 MiB), entries_over_cap (past 2^20 entries) "
                                            "(entries); of TensorBoard files: event_too_large (records over 512 "
                                            "KiB), event_tags_over_cap (scalars of a step past 4096).",
                                            labels=["run", "reason"])
        skipped = CounterMetricFamily(p + "values_skipped", "Logged values not exported, by reason: not numbers "
                                      "(none, non_numeric), out of a float's range (out_of_range), or steps that "
                                      "are no non-negative integer below 2**53 (step_*; the record is kept "
                                      "without its step).", labels=["run", "reason"])
        disagreements = CounterMetricFamily(p + "step_disagreements", "Console training records given a "
                                            "fallback step (no redraw of the training progress bar gave one: their "
                                            "ordinal, or the bar's last count) that disagrees, by reason: epoch "
                                            "(with the steps per epoch of the run's other such records); cut_line "
                                            "(a record lost to a cut line made the pairing of the records after it "
                                            "with the bar's redraws a guess, checked by epoch); late_redraw (a "
                                            "record's redraw came after the wait and showed another step); "
                                            "stale_redraw (a redraw that a line which is no record took, a message "
                                            "printed through tqdm.write, was left out, by its place after a clear or "
                                            "by the next record's epoch); refused_bar (a bar of another total, "
                                            "drawn from 0 before the training bar ended, was left out as an "
                                            "evaluation's while training records took fallback steps: a new "
                                            "training's bar that no `Total optimization steps` line or record "
                                            "redraw told apart; once per bar). The step is kept.",
                                            labels=["run", "reason"])
        step_sources = CounterMetricFamily(p + "step_sources", "Console records without a step of their own, by "
                                           "where their step came from: bar (the training bar's redraw), bar_count "
                                           "(the bar's last count, when no redraw came), epoch (the record's epoch "
                                           "times the steps per epoch the log stated), checkpoint (on from a "
                                           "global_stepN line at the logging interval), ordinal (the next number).",
                                           labels=["run", "source"])
        resets = CounterMetricFamily(p + "history_resets", "Times a run's step went backwards (resumed from "
                                     "a checkpoint) and its history was cut back.", labels=["run"])
        stops = CounterMetricFamily(p + "stop_signals", "Stop files written for the trainer (config early_stop; "
                                    "0 when it is off), by outcome: written, or failed (tried again after the next "
                                    "records).", labels=["run", "outcome"])
        signal = ex.stop_signal
        stopper = ex.trainer_stopper
        trainer_signals = CounterMetricFamily(p + "trainer_signals", "Signals sent to stop the trainer (config "
                                              "early_stop.action: signal), by signal and outcome: sent, denied (a "
                                              "process of another user: the sidecar must run as the trainer's user), "
                                              "not_found (no process matched early_stop.process or pid, or the "
                                              "trainer had exited).", labels=["run", "signal", "outcome"])
        if stopper is not None:
            for (sig, outcome), n in sorted(stopper.signals.items()):
                trainer_signals.add_metric([stopper.run, sig, outcome], n)
        for name, run in ex.runs.items():
            st = ex.stats[name].total()
            for (fmt, outcome), n in sorted(st.line_counts().items()):
                lines.add_metric([name, fmt, outcome], n)
            for (fmt, reason), n in sorted(st.parse_errors.items()):
                errors.add_metric([name, fmt, reason], n)
            for kind in ("train", "eval", "summary"):
                records.add_metric([name, kind], run.records[kind])
            if run.last_record_time:
                last.add_metric([name], run.last_record_time)
            for reason in KEY_DROP_REASONS:
                dropped.add_metric([name, reason], run.keys_dropped[reason])
            # the known reasons always (zero from the start), and any other counted: none is counted unexported
            for reason in (*LINE_DROP_REASONS, *sorted(set(st.lines_dropped) - set(LINE_DROP_REASONS))):
                lines_dropped.add_metric([name, reason], st.lines_dropped[reason])
            for reason in STEP_DISAGREEMENT_REASONS:
                disagreements.add_metric([name, reason], st.step_disagreements[reason])
            for source in STEP_SOURCES:
                step_sources.add_metric([name, source], st.step_sources[source])
            for reason, n in sorted(run.values_skipped.items()):
                skipped.add_metric([name, reason], n)
            resets.add_metric([name], run.resets)
            for outcome in ("written", "failed"):
                stops.add_metric([name, outcome], signal.writes[name, outcome] if signal is not None else 0)
        up = GaugeMetricFamily(p + "source_up", "1 when the log source exists and could be read at the last "
                               "poll (a stream: while it is open).", labels=["run", "path"])
        rotations = CounterMetricFamily(p + "source_rotations", "Log files replaced under the same path "
                                        "(rename or delete and recreate).", labels=["run", "path"])
        truncations = CounterMetricFamily(p + "source_truncations", "Log files that shrank or whose start was "
                                          "rewritten (copytruncate) and were read again from the start; and "
                                          "trainer_state.json histories whose entries already read changed (a "
                                          "resumed or new training), read again from where they differ.",
                                          labels=["run", "path"])
        resumed = CounterMetricFamily(p + "source_resumed", "Times a log source was read on after an interruption, "
                                      "not again from its start: a file that came back (moved away and back, put "
                                      "back as a copy, after a read error), a pod log's stream opened again.",
                                      labels=["run", "path"])
        read_errors = CounterMetricFamily(p + "source_read_errors", "Failed reads of a log source.",
                                          labels=["run", "path"])
        read_bytes = CounterMetricFamily(p + "source_read_bytes", "Bytes read from a log source, as read (before "
                                         "decoding).", labels=["run", "path"])
        # right, or loud: what a copied stream (run's trainer, serve --log -) could not pass on, by where it was lost
        dropped_bytes = CounterMetricFamily(p + "source_dropped_bytes", "Bytes of a copied stream (the trainer's "
                                            "output through run or serve --log -) that were not read: reason "
                                            "parser_behind (the exporter fell behind; the copy to the log still "
                                            "has them) or output_failed (the copy to standard output failed past "
                                            "its retries, e.g. disk full); and a log file's NUL bytes, skipped as no "
                                            "text: reason nul (the hole a writer not in append mode leaves when the "
                                            "file is truncated under it, copytruncate).",
                                            labels=["run", "path", "reason"])
        write_errors = CounterMetricFamily(p + "source_write_errors", "Failed writes of a copied stream (the "
                                           "trainer's output through run or serve --log -) to standard output: each "
                                           "is retried, then its bytes are dropped (source_dropped_bytes).",
                                           labels=["run", "path"])
        log_dropped = CounterMetricFamily(p + "source_log_lines_dropped", "The exporter's own log lines that the "
                                          "copier of a trainer's output dropped (too many waited for a gap between "
                                          "the trainer's lines).", labels=["run", "path"])
        for inp in ex.inputs:
            lv = [inp.spec.run, inp.spec.path]
            write_errors.add_metric(lv, inp.follow.output_write_errors)
            log_dropped.add_metric(lv, inp.follow.log_lines_dropped)
            dropped_bytes.add_metric([*lv, "parser_behind"], inp.follow.dropped_bytes)
            dropped_bytes.add_metric([*lv, "output_failed"], inp.follow.output_dropped_bytes)
            dropped_bytes.add_metric([*lv, "nul"], inp.follow.nul_bytes)
            up.add_metric(lv, 1.0 if inp.follow.up else 0.0)
            rotations.add_metric(lv, inp.follow.rotations)
            truncations.add_metric(lv, inp.follow.truncations)
            resumed.add_metric(lv, inp.follow.resumed)
            read_errors.add_metric(lv, inp.follow.read_errors)
            read_bytes.add_metric(lv, inp.follow.bytes_read)
        info = GaugeMetricFamily(p + "build_info", "Version of the exporter and the commit it was built from, value 1.",
                                 labels=["version", "revision", "python"])  # as Prometheus: {version, revision, ...}
        info.add_metric([__version__, REVISION or "unknown", platform.python_version()], 1.0)
        yield from (lines, errors, records, last, dropped, lines_dropped, skipped, disagreements, step_sources, resets,
                    stops, trainer_signals)
        yield from (up, rotations, truncations, resumed, read_errors, read_bytes, dropped_bytes, write_errors,
                    log_dropped, info)


def _series_order(item: tuple[tuple[str, str | None], object]) -> tuple[str, str]:
    (inst, lv), _ = item
    return inst, lv or ""
