"""Judgments made once per logged step, counted in steps, read by the alert rules, the report and the boards.

- streams.py: each input's recent points carried from one batch of records to the next, with the
  rolling statistics the detectors read (short medians and means, trend t-statistics) and the run's
  own baseline (its first logged points);
- persistence.py: how many consecutive logged steps a condition has held, when it becomes active
  and when it clears, and the single-step excursions (spikes) that never became a state;
- catalog.py: the detectors as data: what each reads, its condition, its severity and alert;
- engine.py: one run's detectors, fed a batch at a time, and the state they export.
"""
