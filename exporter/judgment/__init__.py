"""The practitioner's judgment of a whole run: what its course says and what to do next.

The detectors say what is wrong now, one alert each; the judgment reads them together with the whole course of the
run (instruments/trajectory.py) and says what an experienced RL engineer would: where the reward went, how the KL
moved with it, whether the groups still carry a learning signal, what the loss and the completions did, the story
in order of onset, and one recommendation (continue, stop, stop now, investigate, not judged) with the checkpoint
to keep. It reads only the run's state, so `report` and /api/v1/verdict say the same."""
