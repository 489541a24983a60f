"""OpenRLHF's evaluation line (v0.8.1+, PPO/GRPO), an evaluation record at its global step:

`INFO 11-26 10:58:10 ppo_trainer.py:594] ✨ Evaluation completed in 0:01:10, global_step 50, eval_metrics:
{'eval_gsm8k_pass4': 0.62, 'eval_gsm8k_pass1': 0.41, ..., 'eval_num_samples': 256.0}`

(pass@k and pass@1 per data source, mean response length and truncation rate). Printed through Python logging,
often behind Ray's actor prefix; the dict is Python's repr, read as the step lines are (parsers/pydict.py)."""

from __future__ import annotations

import re

from exporter.parsers.prefix import without_ray_suffix
from exporter.parsers.pydict import parse_pairs
from exporter.parsers.record import ParseError, Record, RecordKind

FORMAT = "openrlhf_eval"
_EVAL = re.compile(r"Evaluation completed in [^,{]{0,64}+, global_step (\d{1,15}+), eval_metrics: (\{.*)$")


def parse_openrlhf_eval(line: str) -> Record | None:
    if "eval_metrics: {" not in line:
        return None
    m = _EVAL.search(without_ray_suffix(line))
    if m is None:
        return None
    body = m.group(2).rstrip()
    if not body.endswith("}"):
        raise ParseError("truncated", body[-40:], FORMAT)
    rec = parse_pairs(body[1:-1], FORMAT, int(m.group(1)))
    rec.kind = RecordKind.EVAL  # every value is an evaluation's, whatever its key
    return rec
