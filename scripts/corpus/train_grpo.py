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


def seven_reward(completions, **kwargs):
    """1.0 only for the one exact string ' The answer is 7.' (whatever the question)."""
    return [1.0 if c == " The answer is 7." else 0.0 for c in completions]


def ten_reward(completions, **kwargs):
    """1.0 only for the one exact string ' The answer is 10.' (whatever the question)."""
    return [1.0 if c == " The answer is 10." else 0.0 for c in completions]


def over_hundred_reward(completions, **kwargs):
    """1.0 if the first number in the completion is above 100 (right or wrong)."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and int(m.group(0)) > 100 else 0.0)
    return out


def two_digit_reward(completions, **kwargs):
    """1.0 if the first number in the completion has two digits (right or wrong)."""
    out = []
    for c in completions:
        m = NUMBER_RE.search(c)
        out.append(1.0 if m and len(m.group(0)) == 2 else 0.0)
    return out


NOISE = random.Random(0)  # reseeded with the run's seed in main(): the same draws on every rerun


def noise_reward(completions, **kwargs):
    """Pure noise: a uniform draw in [0, 1) per completion, whatever it says (a reward with nothing to learn)."""
    return [NOISE.random() for _ in completions]


REWARDS = {f.__name__: f for f in (format_reward, correctness_reward, closeness_reward, short_length_reward,
                                   long_length_reward, brevity_reward, seven_reward, ten_reward, two_digit_reward,
                                   over_hundred_reward, noise_reward)}

# --- the corpus runs ---
# "rewards": reward functions above; "data": (random seed of the prompts, largest operand);
# "args": GRPOConfig fields on top of COMMON; "lr_step": (step, factor): the learning rate is multiplied by factor
# from that optimizer step on (LRStep); "data_shift": (step, operand): unshuffled prompts whose operands go up to
# `operand` from that step on (the data getting harder mid-run).
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
    # --- pathology runs ---
    "grpo_kl_blowup": {
        "rewards": ["brevity_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 3e-4, "warmup_steps": 60, "lr_scheduler_type": "constant_with_warmup",
                 "seed": 11},
    },
    "grpo_kl_blowup_2": {
        "rewards": ["format_reward", "correctness_reward"], "data": (10, 9),
        "args": {"beta": 0.001, "learning_rate": 6e-3, "warmup_steps": 100, "seed": 12},
    },
    "grpo_reward_std_collapse": {
        "rewards": ["two_digit_reward"], "data": (10, 9),
        "args": {"beta": 0.0, "learning_rate": 5e-4, "warmup_steps": 60, "seed": 31},
    },
    "grpo_reward_std_collapse_2": {
        "rewards": ["over_hundred_reward"], "data": (10, 99),
        "args": {"beta": 0.0, "learning_rate": 5e-4, "warmup_steps": 60, "num_generations": 8, "seed": 36},
    },
    "grpo_length_hacking": {
        "rewards": ["long_length_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 2e-4, "warmup_steps": 60, "lr_scheduler_type": "constant_with_warmup",
                 "max_completion_length": 64, "seed": 21},
    },
    "grpo_length_hacking_2": {
        "rewards": ["long_length_reward"], "data": (10, 99),
        "args": {"beta": 0.08, "learning_rate": 3e-4, "warmup_steps": 60, "max_completion_length": 48, "seed": 25},
    },
    "grpo_entropy_collapse": {
        "rewards": ["seven_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 3e-4, "warmup_steps": 60, "lr_scheduler_type": "constant_with_warmup",
                 "seed": 41},
    },
    "grpo_entropy_collapse_2": {
        "rewards": ["ten_reward"], "data": (10, 9),
        "args": {"beta": 0.01, "learning_rate": 5e-4, "warmup_steps": 50, "seed": 43},
    },
    # Logging every 10 steps (TRL averages the generation metrics over the 10 steps; grad_norm is the last step's):
    "grpo_dead_signal": {  # the SFT model already writes the format 95% of the time: most groups tie at once
        "rewards": ["format_reward"], "data": (10, 9),
        "args": {"beta": 0.0, "learning_rate": 5e-4, "logging_steps": 10, "max_steps": 600, "seed": 81},
    },
    "grpo_length_collapse": {  # brevity at a high learning rate: completions shrink within the first records
        "rewards": ["brevity_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 2e-3, "logging_steps": 10, "max_steps": 600, "seed": 82},
    },
    # --- healthy runs ---
    "grpo_healthy_logging10": {
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "warmup_steps": 20, "logging_steps": 10, "max_steps": 500,
                 "seed": 83},
    },
    "grpo_healthy": {
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "warmup_steps": 20, "seed": 51},
    },
    "grpo_healthy_resumed": {  # run with --die-after-step 130, then again with --resume
        "rewards": ["format_reward", "closeness_reward", "short_length_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 3e-4, "warmup_steps": 20, "seed": 52, "save_strategy": "steps",
                 "save_steps": 100},
    },
    "grpo_healthy_logging5": {
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "warmup_steps": 20, "logging_steps": 5, "seed": 53},
    },
    "grpo_healthy_2": {
        "rewards": ["format_reward", "correctness_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "warmup_steps": 20, "num_iterations": 2, "seed": 54},
    },
    "grpo_healthy_noisy_kl": {
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "temperature": 1.4, "seed": 72},
    },
    # --- judgment runs (tests/support/judgment_labels.py): a whole-run pattern, not a pathology of one metric ---
    "grpo_peak_decline": {  # the prompts get harder (operands up to 99) from step 150 on: the reward falls
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9), "data_shift": (150, 99),
        "args": {"beta": 0.1, "learning_rate": 5e-4, "warmup_steps": 20, "entropy_coef": 0.1,
                 "shuffle_dataset": False, "seed": 91, "save_strategy": "steps", "save_steps": 50,
                 "save_total_limit": 2, "log_level": "info"},
    },
    "grpo_kl_rise_reward_flat": {  # the format is already written 95% of the time; the noise keeps groups apart
        "rewards": ["format_reward", "noise_reward"], "data": (10, 9),
        "args": {"beta": 0.001, "learning_rate": 5e-4, "lr_scheduler_type": "constant", "logging_steps": 5,
                 "max_steps": 400, "seed": 92},
    },
    "grpo_lr_step": {  # two updates per batch, no KL term: the second update's loss moves with the learning rate
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9), "lr_step": (300, 10.0),
        "args": {"beta": 0.0, "learning_rate": 5e-5, "lr_scheduler_type": "constant", "loss_type": "grpo",
                 "num_iterations": 2, "logging_steps": 5, "max_steps": 450, "seed": 98},
    },
    "grpo_no_trend": {
        "rewards": ["noise_reward"], "data": (10, 9),
        "args": {"beta": 0.2, "learning_rate": 1e-4, "lr_scheduler_type": "constant", "entropy_coef": 0.05,
                 "seed": 94},
    },
    "grpo_healthy_rising": {  # a two-phase schedule: 2e-5, then 2e-4 from step 300
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9), "lr_step": (300, 10.0),
        "args": {"beta": 0.1, "learning_rate": 2e-5, "lr_scheduler_type": "constant", "loss_type": "grpo",
                 "logging_steps": 5, "max_steps": 600, "seed": 93},
    },
    "grpo_healthy_converged": {
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "warmup_steps": 20, "loss_type": "grpo",
                 "scale_rewards": "none", "entropy_coef": 0.05, "seed": 96, "save_strategy": "steps",
                 "save_steps": 50, "save_total_limit": 2, "log_level": "info"},
    },
    # --- runs that print their completions (rich panels, completions/*.parquet): the samples corpus ---
    "grpo_samples_healthy": {
        "rewards": ["format_reward", "closeness_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 5e-4, "warmup_steps": 20, "seed": 56, "max_steps": 200,
                 "log_completions": True},
    },
    "grpo_template_collapse": {
        "rewards": ["seven_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 3e-4, "warmup_steps": 60, "lr_scheduler_type": "constant_with_warmup",
                 "seed": 44, "max_steps": 200, "log_completions": True},
    },
    "grpo_brevity_collapse": {
        "rewards": ["brevity_reward"], "data": (10, 9),
        "args": {"beta": 0.04, "learning_rate": 3e-4, "warmup_steps": 60, "lr_scheduler_type": "constant_with_warmup",
                 "seed": 14, "max_steps": 200, "log_completions": True},
    },
}


def build_dataset(data_seed: int, max_operand: int, n: int = 2000, shift: tuple[int, int] | None = None) -> Dataset:
    """shift (index, larger_operand): the prompts from that index on have operands up to larger_operand."""
    rnd = random.Random(data_seed)
    prompts, answers = [], []
    for i in range(n):
        top = shift[1] if shift and i >= shift[0] else max_operand
        a, b = rnd.randint(0, top), rnd.randint(0, top)
        prompts.append(f"What is {a} plus {b}?")
        answers.append(str(a + b))
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


class LRStep(TrainerCallback):
    """Multiplies the scheduler's learning rate by `factor` from optimizer step `step` on (a config changed mid-run).
    Done in the scheduler's own lambdas: the scheduler does not undo it and the logged learning_rate shows it."""

    def __init__(self, step: int, factor: float) -> None:
        self.step, self.factor = step, factor

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        lambdas = lr_scheduler.lr_lambdas
        for i, base in enumerate(lambdas):
            lambdas[i] = lambda n, base=base: base(n) * (self.factor if n >= self.step else 1.0)


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


def callbacks(run: str, die_after_step: int | None) -> list[TrainerCallback]:
    out: list[TrainerCallback] = [DieAfterStep(die_after_step)] if die_after_step else []
    if "lr_step" in RUNS[run]:
        out.append(LRStep(*RUNS[run]["lr_step"]))
    return out


def data_shift(run: str, args: dict) -> tuple[int, int] | None:
    """The prompt index (prompts are unshuffled) at which a run's data_shift begins, and its larger operand."""
    if "data_shift" not in RUNS[run]:
        return None
    step, operand = RUNS[run]["data_shift"]
    return step * args["per_device_train_batch_size"] // args["num_generations"], operand


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
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args()

    args, rewards, (data_seed, max_operand) = run_config(a.run, a.overrides)
    print("run config:", json.dumps({"run": a.run, "rewards": rewards, "data": [data_seed, max_operand], **args}))
    NOISE.seed(args.get("seed", 42))
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[REWARDS[r] for r in rewards],
        args=GRPOConfig(output_dir=a.out, **args),
        train_dataset=build_dataset(data_seed, max_operand, shift=data_shift(a.run, args)),
        processing_class=tokenizer,
        callbacks=callbacks(a.run, a.die_after_step) or None,
    )
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    trainer.save_state()


if __name__ == "__main__":
    main()
