"""Parametrised real TRL DPOTrainer run of the tiny SFT'd model, for the detection corpus.

Every corpus run is a preset in RUNS (data, hyperparameters); `--set key=value` overrides a DPOConfig field (value
parsed as JSON when it parses) and is meant for exploring, not for the corpus itself.

usage: python train_dpo.py RUN SFT_MODEL_DIR OUT_DIR [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer


def pairs_offformat(rnd: random.Random, a: int, b: int) -> tuple[str, str]:
    """chosen = the correct sum; rejected = a wrong sum or an off-format answer (as in the fixture dpo run)."""
    wrong = a + b + rnd.choice([-11, -3, -1, 1, 2, 7, 10])
    return f" The answer is {a + b}.", rnd.choice([f" The answer is {wrong}.", " no", f" sad moon {wrong} river"])


def pairs_swapped(rnd: random.Random, a: int, b: int) -> tuple[str, str]:
    """chosen = the sum, rejected = the same sentence with the digits of a two-digit sum swapped, or +-10."""
    s = a + b
    wrong = int(str(s)[::-1]) if s >= 10 and str(s)[::-1] != str(s) and s % 10 else s + rnd.choice([-10, 10])
    return f" The answer is {s}.", f" The answer is {wrong}."


def pairs_easy(rnd: random.Random, a: int, b: int) -> tuple[str, str]:
    """chosen = the correct sum; rejected = always off-format text: pairs a model can tell apart at once."""
    return f" The answer is {a + b}.", rnd.choice([" no", f" sad moon {a + b + 7} river", " ok ok ok"])


PAIRS = {f.__name__: f for f in (pairs_offformat, pairs_swapped, pairs_easy)}

COMMON = {
    "per_device_train_batch_size": 8,
    "max_steps": 200,
    "logging_steps": 1,
    "beta": 0.1,
    "max_length": 64,
    "save_strategy": "no",
    "report_to": "none",
    "use_cpu": True,
}

# "data": (pair builder, random seed of the data, largest operand, number of pairs)
RUNS: dict[str, dict] = {
    "dpo_displacement": {
        "data": ("pairs_swapped", 2, 99, 400),
        "args": {"learning_rate": 5e-4, "warmup_steps": 30, "max_steps": 250, "seed": 63},
    },
    "dpo_displacement_2": {
        "data": ("pairs_swapped", 6, 99, 400),
        "args": {"learning_rate": 2e-3, "warmup_steps": 60, "max_steps": 250, "seed": 66},
    },
    "dpo_saturated": {  # only easy pairs, 24 epochs of 200: every pair is separated and the margins keep growing
        "data": ("pairs_easy", 4, 99, 200),
        "args": {"learning_rate": 1e-3, "warmup_steps": 20, "max_steps": 600, "seed": 85},
    },
    "dpo_healthy": {
        "data": ("pairs_offformat", 3, 99, 1000),
        "args": {"learning_rate": 5e-4, "seed": 64},
    },
    "dpo_healthy_2": {
        "data": ("pairs_swapped", 7, 99, 1000),
        "args": {"learning_rate": 1e-4, "seed": 67},
    },
}


def build_dataset(pairs: str, data_seed: int, max_operand: int, n: int) -> Dataset:
    rnd = random.Random(data_seed)
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(n):
        a, b = rnd.randint(0, max_operand), rnd.randint(0, max_operand)
        chosen, rejected = PAIRS[pairs](rnd, a, b)
        rows["prompt"].append(f"What is {a} plus {b}?")
        rows["chosen"].append(chosen)
        rows["rejected"].append(rejected)
    return Dataset.from_dict(rows)


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run_config(run: str, overrides: list[str] | None = None) -> tuple[dict, tuple]:
    preset = RUNS[run]
    args = {**COMMON, **preset["args"]}
    for item in overrides or []:
        key, _, value = item.partition("=")
        args[key] = parse_value(value)
    return args, tuple(preset["data"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run", choices=sorted(RUNS))
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--data", help="pairs,seed,max_operand,n: overrides the preset's data")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args()

    args, data = run_config(a.run, a.overrides)
    if a.data:
        name, *nums = a.data.split(",")
        data = (name, *(int(x) for x in nums))
    print("run config:", json.dumps({"run": a.run, "data": data, **args}))
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    trainer = DPOTrainer(model=model, args=DPOConfig(output_dir=a.out, **args), train_dataset=build_dataset(*data),
                         processing_class=tokenizer)
    trainer.train()
    trainer.save_state()


if __name__ == "__main__":
    main()
