"""What the model wrote: completion samples read from the trainer's output, and what they say about diversity.

Data flow: the console framer hands each line that no metric parser takes to `reader.SampleReader`, which runs the
line readers of the trainers' sample printouts (`panels.py`: TRL's rich `Step N` panels; `verl.py`: verl's
`[prompt]/[response]/[score]` groups) and gives back a `SampleSet` (`sampleset.py`) when one is complete.
`parquet.py` reads the same rows from TRL's `completions/*.parquet` files (optional: pyarrow). `diversity.py` turns a
set into numbers (a record at the set's step, so they become series, detector input and /metrics like any trainer
key); `store.py` keeps a few completions per step for the report. The text itself never leaves the run state:
/metrics carries only the numbers."""
