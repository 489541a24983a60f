"""Parametrised real TRL GRPOTrainer run of the tiny SFT'd model, for the detection corpus.

Every corpus run is a preset in RUNS (hyperparameters, reward functions, data); `--set key=value` overrides a
GRPOConfig field (value parsed as JSON when it parses) and is meant for exploring, not for the corpus itself.

usage: python train_grpo.py RUN SFT_MODEL_DIR OUT_DIR [--resume] [--die-after-step N] [--set key=value ...]
  --resume            trainer.train(resume_from_checkpoint=True) (the newest checkpoint in OUT_DIR)
  --die-after-step N  SIGKILL this process right after step N is logged (a pod killed mid-run)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ANSWER_RE = re.compile(r" The answer is \d+\.")
NUMBER_RE = re.compile(r"\d+")


# --- reward functions (TRL calls them with the completions and the dataset's extra columns) ---

def format_reward(completions, **kwargs):
    """1.0 if the completion is exactly ' The answer is <int>.'"""
    return [1.0 if ANSWER_RE.fullmatch(c) else 0.0 for c in completions]


def correctness_reward(completions, answer, **kwargs):
    """1.0 if the first number in the completion equals the true sum."""
    out = []
    for c, ans in zip(completions, answer, strict=True):
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and m.group(0) == ans else 0.0)
    return out


def closeness_reward(completions, answer, **kwargs):
    """Partial credit: 1 - |first number - true sum| / 10, floored at 0 (a denser correctness signal)."""
    out = []
    for c, ans in zip(completions, answer, strict=True):
        m = NUMBER_RE.search(c)
        out.append(max(0.0, 1.0 - abs(int(m.group(0)) - int(ans)) / 10.0) if m else 0.0)
    return out


def short_length_reward(completions, **kwargs):
    """Peaks at 18 characters, decays linearly to 0 at +-18 characters."""
    return [max(0.0, 1.0 - abs(len(c) - 18) / 18.0) for c in completions]


def long_length_reward(completions, **kwargs):
    """Longer is better: one point per 20 characters (a length-hackable reward)."""
    return [len(c) / 20.0 for c in completions]


def brevity_reward(completions, **kwargs):
    """Shorter is better: minus one point per 10 characters (pulls away from the SFT answer's wording)."""
    return [-len(c) / 10.0 for c in completions]


def terse_number_reward(completions, **kwargs):
    """Shorter is better as long as the completion still holds a number: 1 - characters / 10, 0 without a digit."""
    return [1.0 - len(c) / 10.0 if NUMBER_RE.search(c) else 0.0 for c in completions]


def words_reward(completions, **kwargs):
    """Counts the story words (moon, river, tree, ...) in the completion: pulls far away from the SFT answers."""
    words = ("moon", "river", "tree", "stone", "sun", "house", "happy", "sad")
    return [float(sum(c.count(w) for w in words)) for c in completions]


def big_number_reward(completions, **kwargs):
    """The first number in the completion divided by 100 (bigger is better, whatever the question)."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(min(int(m.group(0)), 1000) / 100.0 if m else 0.0)
    return out


def seven_reward(completions, **kwargs):
    """1.0 only for the one exact string ' The answer is 7.' (whatever the question)."""
    return [1.0 if c == " The answer is 7." else 0.0 for c in completions]


def ten_reward(completions, **kwargs):
    """1.0 only for the one exact string ' The answer is 10.' (whatever the question)."""
    return [1.0 if c == " The answer is 10." else 0.0 for c in completions]


def single_digit_reward(completions, **kwargs):
    """1.0 if the first number in the completion has a single digit (right or wrong)."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and len(m.group(0)) == 1 else 0.0)
    return out


def over_hundred_reward(completions, **kwargs):
    """1.0 if the first number in the completion is above 100 (right or wrong)."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and int(m.group(0)) > 100 else 0.0)
    return out


def repdigit_reward(completions, **kwargs):
    """1.0 if the first number in the completion is 11, 22, ..., 99 (right or wrong): far from the SFT answers."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and len(m.group(0)) == 2 and m.group(0)[0] == m.group(0)[1] else 0.0)
    return out


def two_digit_reward(completions, **kwargs):
    """1.0 if the first number in the completion has two digits (right or wrong)."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and len(m.group(0)) == 2 else 0.0)
    return out


def no_digit_reward(completions, **kwargs):
    """1.0 if the completion has no digit at all (easy to satisfy for every sample)."""
    return [0.0 if NUMBER_RE.search(c) else 1.0 for c in completions]


def ends_with_period_reward(completions, **kwargs):
    """1.0 if the completion ends with '.'."""
    return [1.0 if c.endswith(".") else 0.0 for c in completions]


REWARDS = {f.__name__: f for f in (format_reward, correctness_reward, closeness_reward, short_length_reward,
                                   long_length_reward, brevity_reward, terse_number_reward,
                                   words_reward, big_number_reward, seven_reward, ten_reward,
                                   single_digit_reward, over_hundred_reward, repdigit_reward, two_digit_reward,
                                   no_digit_reward, ends_with_period_reward)}

# --- the corpus runs ---
# "data": (random seed of the prompts, largest operand); "args": GRPOConfig fields beyond the common ones.
COMMON = {
    "per_device_train_batch_size": 16,
    "num_generations": 4,
    "max_completion_length": 16,
    "max_steps": 300,
    "logging_steps": 1,
    "temperature": 1.0,
    "save_strategy": "no",
    "report_to": "none",
    "use_cpu": True,
}

RUNS: dict[str, dict] = {
    "explore": {"rewards": ["format_reward", "correctness_reward"], "data": (10, 9), "args": {}},
    "explore99": {"rewards": ["format_reward", "correctness_reward"], "data": (10, 99), "args": {}},
}


def build_dataset(data_seed: int, max_operand: int, n: int = 2000) -> Dataset:
    rnd = random.Random(data_seed)
    prompts, answers = [], []
    for _ in range(n):
        a, b = rnd.randint(0, max_operand), rnd.randint(0, max_operand)
        prompts.append(f"What is {a} plus {b}?")
        answers.append(str(a + b))
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


class DieAfterStep(TrainerCallback):
    """Kills the process with SIGKILL once step N has been logged, like a pre-empted or OOM-killed pod."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step >= self.step:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run_config(run: str, overrides: list[str] | None = None) -> tuple[dict, list[str], tuple[int, int]]:
    preset = RUNS[run]
    args = {**COMMON, **preset["args"]}
    for item in overrides or []:
        key, _, value = item.partition("=")
        args[key] = parse_value(value)
    return args, list(preset["rewards"]), tuple(preset["data"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run", choices=sorted(RUNS))
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--die-after-step", type=int)
    p.add_argument("--rewards", help="comma-separated reward functions, overrides the preset's")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args()

    args, rewards, (data_seed, max_operand) = run_config(a.run, a.overrides)
    if a.rewards:
        rewards = a.rewards.split(",")
    print("run config:", json.dumps({"run": a.run, "rewards": rewards, "data": [data_seed, max_operand], **args}))
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[REWARDS[r] for r in rewards],
        args=GRPOConfig(output_dir=a.out, **args),
        train_dataset=build_dataset(data_seed, max_operand),
        processing_class=tokenizer,
        callbacks=[DieAfterStep(a.die_after_step)] if a.die_after_step else None,
    )
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    trainer.save_state()


if __name__ == "__main__":
    main()
