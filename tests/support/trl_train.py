"""Real TRL trainings of a tiny model on CPU with the exporter's callback, run as a subprocess by
tests/test_trl_callback.py (a training's torch, threads and seeds stay out of the test process).

    python trl_train.py build MODEL_DIR
        the tiny random-init Qwen2 (~107k parameters) and its locally trained BPE tokenizer
        (scripts/corpus/build_tiny.py: no hub access)
    python trl_train.py sft MODEL_DIR OUT_DIR --feed FEED [--max-steps N] [--logging-steps K] [--eval-steps E]
        SFTTrainer with disable_tqdm=True and an evaluation set (eval records and the end-of-training summary)
    python trl_train.py grpo MODEL_DIR OUT_DIR --feed FEED [--stop-file F] [--verdict-url U] [--max-steps N]
                        [--learning-rate LR]
        GRPOTrainer of the random-init model on a brevity reward at a high learning rate: completions shrink to
        a bare end-of-text, and KL to the reference passes 1 (the KL page) within ~40 steps; at --learning-rate
        1e-6 the same training is a healthy one (KL stays near 0)

    python trl_train.py ranks STOP_FILE
        two processes (torch.distributed, gloo) each stepping the callback through 10 steps; the stop file
        appears after step 4 for the main process only (the other one's stop_file never appears): each prints
        `rank R stopped at step N`

Each training ends with trainer.save_state() (OUT_DIR/trainer_state.json) and prints `stopped_by: <reason>`
when the callback stopped it."""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def build(model_dir: str) -> None:
    """scripts/corpus/build_tiny.py's model, loaded from its file (the scripts are not on the import path)."""
    spec = importlib.util.spec_from_file_location("build_tiny", REPO / "scripts" / "corpus" / "build_tiny.py")
    build_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_tiny)
    build_tiny.main(model_dir)


def _common(out: str, max_steps: int, logging_steps: int, seed: int) -> dict:
    return {"output_dir": out, "max_steps": max_steps, "logging_steps": logging_steps, "disable_tqdm": True,
            "save_strategy": "no", "report_to": "none", "use_cpu": True, "seed": seed}


def sft(a: argparse.Namespace, callback) -> object:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rnd = random.Random(0)
    pairs = [(rnd.randint(0, 99), rnd.randint(0, 99)) for _ in range(240)]
    data = {"prompt": [f"What is {x} plus {y}?" for x, y in pairs],
            "completion": [f" The answer is {x + y}." for x, y in pairs]}
    train = Dataset.from_dict({k: v[:224] for k, v in data.items()})
    evaluation = Dataset.from_dict({k: v[224:] for k, v in data.items()})
    args = SFTConfig(**_common(a.out, a.max_steps, a.logging_steps, 0), per_device_train_batch_size=8,
                     per_device_eval_batch_size=16, eval_strategy="steps", eval_steps=a.eval_steps,
                     learning_rate=3e-3, max_length=32)
    return SFTTrainer(model=AutoModelForCausalLM.from_pretrained(a.model), args=args, train_dataset=train,
                      eval_dataset=evaluation, processing_class=AutoTokenizer.from_pretrained(a.model),
                      callbacks=[callback])


def brevity_reward(completions, **kwargs):
    """Shorter is better: pulls the policy to a bare end-of-text, far from the reference (the KL page)."""
    return [-len(c) / 10.0 for c in completions]


def grpo(a: argparse.Namespace, callback) -> object:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rnd = random.Random(10)
    prompts = [f"What is {rnd.randint(0, 9)} plus {rnd.randint(0, 9)}?" for _ in range(4 * a.max_steps)]
    args = GRPOConfig(**_common(a.out, a.max_steps, a.logging_steps, 11), per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=16, temperature=1.0, beta=0.04,
                      learning_rate=a.learning_rate, warmup_steps=5, lr_scheduler_type="constant_with_warmup")
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(a.model), reward_funcs=[brevity_reward],
                       args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
                       processing_class=AutoTokenizer.from_pretrained(a.model), callbacks=[callback])


def _rank(rank: int, stop_file: str, port: int) -> None:
    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from exporter.integrations.trl import ExporterFeedCallback
    from exporter.stopsignal import write_atomically

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    folder = Path(stop_file).parent
    own = stop_file if rank == 0 else str(folder / "never.json")  # only the main process sees the signal
    callback = ExporterFeedCallback(folder / f"feed-{rank}.jsonl", stop_file=own)
    state, control = TrainerState(is_world_process_zero=rank == 0), TrainerControl()
    callback.on_train_begin(None, state, control)
    for step in range(1, 11):
        state.global_step = step
        callback.on_log(None, state, control, logs={"loss": 1.0 / step})
        callback.on_step_end(None, state, control)
        if control.should_training_stop:
            break
        if step == 4 and rank == 0:
            write_atomically(stop_file, '{"run": "r", "step": 4, "alerts": [], "reason": "test"}')
        dist.barrier()
    print(f"rank {rank} stopped at step {state.global_step if control.should_training_stop else None}", flush=True)
    dist.destroy_process_group()


def ranks(stop_file: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(stop_file, port), nprocs=2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["build", "sft", "grpo", "ranks"])
    p.add_argument("model")
    p.add_argument("out", nargs="?")
    p.add_argument("--feed")
    p.add_argument("--stop-file")
    p.add_argument("--verdict-url")
    p.add_argument("--max-steps", type=int, default=13)
    p.add_argument("--logging-steps", type=int, default=3)
    p.add_argument("--eval-steps", type=int, default=5)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    a = p.parse_args()
    if a.what == "build":
        build(a.model)
        return
    if a.what == "ranks":
        ranks(a.model)  # the stop file, here
        return
    import torch

    torch.set_num_threads(1)
    from exporter.integrations.trl import ExporterFeedCallback

    callback = ExporterFeedCallback(a.feed, stop_file=a.stop_file, verdict_url=a.verdict_url,
                                    verdict_interval_seconds=0.2)
    trainer = (sft if a.what == "sft" else grpo)(a, callback)
    trainer.train()
    trainer.save_state()
    print(f"training: {callback.training.id}", flush=True)
    if callback.stopped is not None:
        print(f"stopped_by: {callback.stopped.reason}", flush=True)


if __name__ == "__main__":
    main()
