"""A trainer stand-in for the early stop by signals: it prints the console lines of verl, OpenRLHF or TRL (their
shapes, our own values), saves checkpoints as they do, and is built of processes the way each framework's launch
is, so that a signal reaches what it reaches there (docs/early-stop.md, read at their source):

- verl (`python -m verl.trainer.main_ppo`): the driver waits in `ray.get` on a TaskRunner actor, which runs the
  training loop and whose lines Ray prints on the driver's console behind `(TaskRunner pid=N) `. The actor is a
  process of Ray's, not in the driver's process group. Neither has a signal handler: SIGINT raises
  KeyboardInterrupt in the driver, which dies, and Ray kills the actors it owned. Checkpoints: every `save_freq`
  steps (`global_step_N`, and `latest_checkpointed_iteration.txt`).
- openrlhf (`python -m openrlhf.cli.train_ppo_ray`): the same shape (driver, a PPOTrainer actor logging
  `✨ Global step N: {...}`), checkpoints every `save_steps` (`global_stepN`).
- trl (`torchrun train.py`, transformers' Trainer): torchrun's agent turns SIGINT/SIGTERM into an exception, sends
  the same signal to its workers (each in a session of its own), waits for them (30 s by default), kills those
  left, and exits 1. A Trainer has no handler: KeyboardInterrupt. Checkpoints every save_steps (`checkpoint-N`).

`--save-on-signal` adds to the process that runs the loop what docs/early-stop.md shows a training script adding:
a handler that lets the step end, saves, and exits 0.

    standin_trainer.py FRAMEWORK --out DIR [--steps N] [--blowup-at STEP] [--step-seconds S] [--save-every N]
                       [--save-seconds S] [--save-on-signal]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

RAY_PREFIX = {"verl": "(TaskRunner pid={pid}) ", "openrlhf": "\x1b[2m\x1b[36m(PPOTrainer pid={pid})\x1b[0m "}
ACTOR = {"verl": "TaskRunner", "openrlhf": "PPOTrainer"}  # Ray titles an actor's process `ray::<its class>`


def options(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=("verl", "openrlhf", "trl"))
    p.add_argument("--role", default="launcher", choices=("launcher", "loop"))
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--blowup-at", type=int, default=0)  # 0: a healthy run
    p.add_argument("--step-seconds", type=float, default=0.4)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--save-seconds", type=float, default=1.0)
    p.add_argument("--save-on-signal", action="store_true")
    return p.parse_args(argv)


def line(framework: str, step: int, kl: float, rng: random.Random) -> str:
    reward, loss = 0.4 + 0.01 * step + rng.uniform(-0.02, 0.02), rng.uniform(-0.05, 0.05)
    if framework == "verl":
        return (f"step:{step} - actor/pg_loss:{loss!r} - actor/kl_loss:{kl!r} - actor/entropy:"
                f"{rng.uniform(0.6, 0.7)!r} - actor/grad_norm:{rng.uniform(0.3, 0.5)!r} - critic/score/mean:"
                f"{reward!r} - critic/rewards/mean:{reward!r} - response_length/mean:{rng.uniform(300, 320)!r} - "
                f"timing_s/step:{rng.uniform(40, 45)!r}")
    if framework == "openrlhf":
        rec = {"policy_loss": loss, "kl": kl, "reward": reward, "group_reward_std": rng.uniform(0.3, 0.4),
               "response_length": rng.uniform(300, 320), "actor_lr": 1e-06, "actor_grad_norm": rng.uniform(0.3, 0.5)}
        stamp = time.strftime("%m-%d %H:%M:%S")
        return f"INFO {stamp} ppo_trainer.py:547] ✨ Global step {step}: {rec}"
    rec = {"loss": loss, "grad_norm": rng.uniform(0.3, 0.5), "learning_rate": 1e-06, "kl": kl, "reward": reward,
           "reward_std": rng.uniform(0.3, 0.4), "entropy": rng.uniform(0.6, 0.7), "epoch": step / 100}
    return str({k: f"{v:.4g}" for k, v in rec.items()})  # transformers 5: 4 significant digits, quoted


def save(o: argparse.Namespace, step: int) -> None:
    """A checkpoint as the framework names it, whole or not at all (written aside, then renamed)."""
    name = {"verl": f"global_step_{step}", "openrlhf": f"global_step{step}", "trl": f"checkpoint-{step}"}[o.framework]
    final, tmp = os.path.join(o.out, name), os.path.join(o.out, f".{name}.tmp")
    print(f"saving checkpoint to {final}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    time.sleep(o.save_seconds)  # a save takes a while: the grace period must cover it
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    os.replace(tmp, final)
    if o.framework == "verl":
        with open(os.path.join(o.out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(step))


def loop(o: argparse.Namespace, emit) -> int:
    """The training loop: one logged step every step_seconds, a save every save_every steps."""
    asked: list[int] = []
    if o.save_on_signal:  # the training script's hook: note the signal, let the step end, save, exit
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _f: (asked.append(signum),
                                                   print(f"got {signal.Signals(signum).name}", file=sys.stderr)))
    rng = random.Random(7)
    for step in range(1, o.steps + 1):
        time.sleep(o.step_seconds)
        kl = 5.0 + rng.uniform(0, 1) if o.blowup_at and step >= o.blowup_at else 0.02 + rng.uniform(0, 0.01)
        emit(line(o.framework, step, kl, rng))
        if asked or step % o.save_every == 0 or step == o.steps:
            save(o, step)
        if asked:
            emit(f"stopping on {signal.Signals(asked[0]).name} after saving step {step}")
            return 0
    return 0


def actor(o: argparse.Namespace) -> int:
    """verl's TaskRunner or OpenRLHF's PPOTrainer: its lines go to the driver (Ray's log monitor)."""
    prefix = RAY_PREFIX[o.framework].format(pid=os.getpid())
    return loop(o, lambda text: print(prefix + text, flush=True))


def ray_driver(o: argparse.Namespace, argv: list[str]) -> int:
    """The driver: starts the actor (a process of its own session, as Ray's workers are) and waits for it."""
    print("ray init kwargs: {'num_cpus': None, 'runtime_env': {'env_vars': {'TOKENIZERS_PARALLELISM': 'true'}}}",
          flush=True)
    runner = subprocess.Popen([f"ray::{ACTOR[o.framework]}", __file__, *argv, "--role", "loop"],
                              executable=sys.executable, start_new_session=True)
    try:
        while runner.poll() is None:  # ray.get(runner.run.remote(config))
            time.sleep(0.05)
    finally:  # the driver ends (KeyboardInterrupt, or the job is done): Ray kills the actors it owned
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    return runner.returncode


class SignalException(Exception):
    pass


def torchrun(o: argparse.Namespace, argv: list[str]) -> int:
    """torchrun's agent: one worker, in its own session; a signal goes on to it, then 30 s, then SIGKILL."""
    def raise_signal(signum: int, _frame) -> None:
        raise SignalException(f"Process {os.getpid()} got signal: {signum}")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, raise_signal)
    worker = subprocess.Popen([sys.executable, __file__, *argv, "--role", "loop"], start_new_session=True)
    try:
        while worker.poll() is None:
            time.sleep(0.05)
        return worker.returncode
    except SignalException as e:
        sig = signal.SIGINT if "signal: 2" in str(e) else signal.SIGTERM
        print(f"WARNING:torch.distributed.elastic.agent.server.api:Received {sig.name} death signal, shutting down "
              "workers", file=sys.stderr, flush=True)
        worker.send_signal(sig)
        try:
            worker.wait(float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        raise


def main(argv: list[str]) -> int:
    o = options(argv)
    os.makedirs(o.out, exist_ok=True)
    if o.role == "loop":
        return actor(o) if o.framework in RAY_PREFIX else loop(o, lambda text: print(text, flush=True))
    return ray_driver(o, argv) if o.framework in RAY_PREFIX else torchrun(o, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
