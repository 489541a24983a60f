"""Copy the corpus runs from a make_corpus.sh work folder into tests/fixtures/corpus/, write each run.json, check
every run against its intent with the labelling rules (tests/support/labels.py, and for the runs made for a
judgment pattern tests/support/judgment_labels.py), and write the README's run table.

usage: python collect.py WORK_DIR DEST_DIR [RUN ...]   (default: every run in RUN_META)
       python collect.py --relabel DEST_DIR [RUN ...]  (recompute the labels of runs already in DEST_DIR from their
                                                        trainer_state.json, without a work folder)
Exits 1 when a run's onsets do not match its intent (the files are still written, to look at).
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))
labels = importlib.import_module("support.labels")
judgment_labels = importlib.import_module("support.judgment_labels")
sample_labels = importlib.import_module("support.sample_labels")

MIN_ONSET = 30  # a run starts normally (a run whose meta says "from_start": its collapse is its start)
MIN_AFTER = 40  # logged steps after the onset (a run's "min_after": fewer, still above the detection bound of 20)
MIN_JUDGMENT_ONSET = 20  # a judgment label of a run made for one: not dated in the run's first 20 logged steps ...
FROM_START = frozenset({"reward_no_trend"})  # ... except the one dated at the first step by its rule

# intent: the pathologies the run shows by the labelling rules (the one it was made for first); notes: what happens.
# judgment_intent: the judgment labels (judgment_labels.py) a run made after those rules shows, the one it was made
# for first; runs made before them have none and their judgment labels are recorded, not checked.
RUN_META: dict[str, dict] = {
    "grpo_kl_blowup": {
        "intent": ["kl_blowup", "entropy_collapse", "reward_std_collapse", "length_collapse"],
        "notes": "A brevity reward (-characters/10) pulls the policy away from the SFT answer ' The answer is N.': it "
                 "drops words, KL passes 1 and climbs to ~9 once completions shrink to a bare EOS; entropy then "
                 "collapses and, with every completion empty, reward_std goes to 0.",
    },
    "grpo_kl_blowup_2": {
        "intent": ["kl_blowup", "reward_std_collapse", "length_hacking", "truncation"],
        "notes": "Format+correctness rewards, a learning rate warmed up to 6e-3 and beta=0.001: the policy diverges "
                 "around step 80-100, KL jumps to 4-10, completions become random tokens that run to "
                 "max_completion_length (length and truncation rules fire, not from a length reward) and the reward "
                 "falls to 0 for every sample.",
    },
    "grpo_reward_std_collapse": {
        "intent": ["reward_std_collapse", "dead_signal"],
        "notes": "A reward for any two-digit answer (right or wrong), beta=0: the policy saturates it within the "
                 "warm-up, reward_std falls to 0 on most steps and, once the last one-digit answers die out, stays "
                 "there; entropy, length and format stay as they were.",
    },
    "grpo_reward_std_collapse_2": {
        "intent": ["reward_std_collapse", "length_hacking", "truncation", "dead_signal"],
        "notes": "Prompts with operands up to 99, a reward for any answer above 100, 8 generations, beta=0: the reward "
                 "saturates and reward_std collapses; with no KL anchor the policy drifts into padding its "
                 "completions to max_completion_length (length and truncation rules fire before the std collapse "
                 "is dated).",
    },
    "grpo_length_hacking": {
        "intent": ["length_hacking", "truncation", "kl_blowup"],
        "notes": "A reward of characters/20 with max_completion_length=64: completions grow slowly from ~7 tokens "
                 "(steps 60-100) and then run away to the 64-token limit, clipped_ratio goes to ~1 and KL to 1.3-2.",
    },
    "grpo_length_hacking_2": {
        "intent": ["length_hacking", "truncation", "kl_blowup"],
        "notes": "The same length reward on operands up to 99, beta=0.08, max_completion_length=48: completions grow "
                 "to the limit around step 60-80, fall back once near step 100 and grow again to stay truncated; "
                 "KL settles just above 1.",
    },
    "grpo_entropy_collapse": {
        "intent": ["entropy_collapse"],
        "notes": "A reward only for the exact string ' The answer is 7.', whatever the question: the policy slowly "
                 "learns to answer 7 to everything, entropy falls from ~0.45 to ~0.06; a few samples still miss, so "
                 "reward_std does not collapse.",
    },
    "grpo_entropy_collapse_2": {
        "intent": ["entropy_collapse"],
        "notes": "A reward only for ' The answer is 10.', beta=0.01: rare at first (reward_std 0 on some early "
                 "steps), then learnt between steps 40 and 100; entropy falls to ~0.06 and stays.",
    },
    "grpo_healthy": {
        "intent": [],
        "notes": "Format + partial-credit closeness reward, beta=0.04, lr 5e-4: the reward rises from ~1.5 to ~1.7, "
                 "KL stays below 1, entropy drifts down by about a quarter.",
    },
    "grpo_healthy_resumed": {
        "intent": [],
        "notes": "Healthy run (format + closeness + short-length rewards) with a checkpoint every 100 steps, SIGKILLed "
                 "at step 130 (before its metric line) and resumed from checkpoint-100: the log shows the lines of "
                 "steps 101-129 twice. trainer_state.json is the resumed run's; KL spikes to 2.9 once, at step 135.",
    },
    "grpo_healthy_logging5": {
        "intent": [],
        "notes": "Healthy run like grpo_healthy (another seed), logging_steps=5: 60 logged points, each an average "
                 "of 5 steps.",
    },
    "grpo_healthy_2": {
        "intent": [],
        "notes": "Healthy run with three rewards and num_iterations=2: clip_ratio/* is logged and the generation "
                 "metrics (reward, completions/*) only on every other line.",
    },
    "grpo_healthy_noisy_kl": {
        "intent": [],
        "notes": "Healthy run sampled at temperature 1.4: noisier reward and entropy, KL mostly below 0.3 with "
                 "single-step spikes above 1 (steps ~196, ~203, ~241); the reward still rises.",
    },
    "grpo_samples_healthy": {
        "intent": [],
        "notes": "Healthy run like grpo_healthy (another seed, 200 steps) with log_completions=True: every step's "
                 "16 rows printed in a rich panel; answers keep the form ' The answer is N.' and differ in N.",
    },
    "grpo_template_collapse": {
        "intent": ["entropy_collapse"],
        "sample_intent": ["template_collapse"],
        "notes": "The ' The answer is 7.' reward of grpo_entropy_collapse (another seed, 200 steps) with "
                 "log_completions=True: from about step 75 most rows of every table are ' The answer is 7.', "
                 "whatever the prompt; entropy follows ~30 steps later.",
    },
    "grpo_brevity_collapse": {
        "intent": ["kl_blowup", "entropy_collapse", "reward_std_collapse", "length_collapse"],
        "sample_intent": ["template_collapse"],
        "notes": "The brevity reward of grpo_kl_blowup (another seed, 200 steps) with log_completions=True: answers "
                 "shrink to 'The.', then '.', then the empty completion, the same for every prompt.",
    },
    "grpo_dead_signal": {
        "intent": ["dead_signal"],
        "notes": "Format reward alone, beta=0, logging every 10 steps (generation metrics averaged over them, "
                 "grad_norm the last step's): the SFT model already writes the format 95% of the time, so 75-100% "
                 "of groups tie from the first record and grad_norm is exactly 0 on 48 of 60 records, while the "
                 "mean reward_std of the groups that still differ stays at 0.03-0.2 (no reward-std collapse by its "
                 "rule).",
    },
    "grpo_length_collapse": {
        "intent": ["length_collapse", "kl_blowup", "reward_std_collapse", "entropy_collapse"],
        "from_start": True, "min_after": 30,  # 60 records: the late collapses of reward std and entropy fit 30
        "notes": "Brevity reward at lr 2e-3 without warm-up, logging every 10 steps: completions shrink from ~7 "
                 "tokens (SFT) to 4.3 averaged over the first 10 steps and to ~1 by the second record; KL is above 1 "
                 "from the first record (2.7, then 8-9). A baseline of the first 10 records would start at the "
                 "collapse; the labels date it by steps (the first record).",
    },
    "grpo_healthy_logging10": {
        "intent": [],
        "notes": "Healthy run like grpo_healthy (another seed), logging every 10 steps for 500 steps: 50 logged "
                 "points, each an average over 10 steps; length steady at ~7.5 tokens, entropy 0.44 -> 0.29.",
    },
    "grpo_peak_decline": {
        "intent": [], "judgment_intent": ["reward_peak_decline"],
        "notes": "Format + closeness rewards, beta=0.1, entropy_coef=0.1, unshuffled prompts that get harder from step "
                 "150 (operands up to 99 instead of 9): the reward rises from ~1.55 to ~1.65 and falls to ~1.0 once "
                 "the prompts change, for good; KL stays below 0.41 (95% of steps below 0.28), no pathology rule "
                 "fires. Checkpoints every 50 steps, 2 kept (log_level=info: the log has the trainer's 'Saving "
                 "model checkpoint' lines).",
    },
    "grpo_kl_rise_reward_flat": {
        "intent": [], "judgment_intent": ["kl_rise_reward_flat", "reward_no_trend"],
        "notes": "The format reward (already written ~95% of the time) plus a reward of pure noise, beta=0.001, lr "
                 "5e-4, logging every 5 steps for 400 steps: the reward stays at ~1.47 while the noise's advantages "
                 "walk the policy away from its reference, KL ~0.04 -> 0.3-0.5 from step ~150; the flat reward is also "
                 "no trend.",
    },
    "grpo_lr_step": {
        "intent": [], "judgment_intent": ["loss_discontinuity"],
        "notes": "Format + closeness rewards, no KL term, two updates per generation batch (num_iterations=2: the "
                 "second one's loss is its gain, which scales with the step size), logging every 5 steps: the learning "
                 "rate steps from 5e-5 to 5e-4 at step 300 (a callback in the scheduler) and the loss level goes up "
                 "~4x; the rule dates it at step 265, the first point whose 20-point window reaches over the step.",
    },
    "grpo_no_trend": {
        "intent": [], "judgment_intent": ["reward_no_trend"],
        "notes": "A reward of pure noise (uniform in [0, 1), independent of the completion), beta=0.2, lr 1e-4, "
                 "entropy_coef=0.05: the mean reward stays at ~0.5 with no trend, KL below 0.05, completions "
                 "unchanged.",
    },
    "grpo_healthy_rising": {
        "intent": [], "judgment_intent": [],
        "notes": "Healthy run on a two-phase schedule (lr 2e-5, then 2e-4 from step 300), loss_type=grpo, beta=0.1, "
                 "logging every 5 steps for 600 steps: the reward climbs from ~1.47 to ~1.71 and is still rising at "
                 "the end; the loss (beta x KL) changes smoothly at the learning-rate step.",
    },
    "grpo_healthy_converged": {
        "intent": [], "judgment_intent": ["reward_plateau"],
        "notes": "Healthy run with loss_type=grpo, scale_rewards=none, entropy_coef=0.05, lr 5e-4: the reward rises "
                 "from ~1.52 to ~1.6 in the first ~30 steps and stays there (converged); KL mostly below 0.4. "
                 "Checkpoints every 50 steps, 2 kept (log_level=info).",
    },
    "dpo_saturated": {
        "intent": ["dpo_saturation"],
        "notes": "Easy pairs only (rejected answers always off-format), 200 pairs for 600 steps (24 epochs), lr "
                 "1e-3: accuracy is 1 from step ~20, the loss falls below 0.01 around step 280 and stays there, "
                 "margins keep widening to 6-9 while rewards/chosen stays near 0.",
    },
    "dpo_displacement": {
        "intent": ["dpo_displacement"],
        "notes": "Chosen and rejected differ only in the answer's digits (swapped, or +-10), lr 5e-4, ~5 epochs: the "
                 "margin grows but by pushing both answers down; rewards/chosen sinks below -0.5 after ~100 steps "
                 "and stays between -0.6 and -1.4 to the end.",
    },
    "dpo_displacement_2": {
        "intent": ["dpo_displacement"],
        "notes": "The same kind of pairs with lr 2e-3 (warm-up 60): severe likelihood displacement, rewards/chosen "
                 "falls to -3..-11 while the margin stays positive.",
    },
    "dpo_healthy": {
        "intent": [],
        "notes": "Rejected answers are wrong sums or off-format text (as in the fixture dpo run, other data and "
                 "seed), lr 5e-4: rewards/rejected falls, rewards/chosen stays near 0.",
    },
    "dpo_healthy_2": {
        "intent": [],
        "notes": "Near-identical pairs (as in dpo_displacement) but a low lr (1e-4): the margin grows slowly to "
                 "0.5-1, rewards/chosen stays above -0.3.",
    },
}

GRPO_KEYS = ("learning_rate", "beta", "seed", "max_steps", "logging_steps", "num_generations", "num_iterations",
             "max_completion_length", "per_device_train_batch_size", "temperature", "warmup_steps",
             "lr_scheduler_type", "save_steps", "save_total_limit", "loss_type", "scale_rewards", "entropy_coef",
             "shuffle_dataset", "log_level")
DPO_KEYS = ("learning_rate", "beta", "seed", "max_steps", "logging_steps", "per_device_train_batch_size",
            "warmup_steps", "lr_scheduler_type", "max_length")
DEFAULTS = {"num_iterations": 1, "warmup_steps": 0, "lr_scheduler_type": "linear"}


def run_config(name: str) -> dict:
    if name.startswith("grpo_"):
        train = importlib.import_module("train_grpo")
        args, rewards, (data_seed, max_operand) = train.run_config(name)
        cfg = {k: args.get(k, DEFAULTS.get(k)) for k in GRPO_KEYS if k in args or k in DEFAULTS}
        cfg["reward_functions"] = rewards
        cfg["data"] = {"prompts": f"'What is a plus b?' with a, b in 0..{max_operand}", "data_seed": data_seed}
        if "data_shift" in train.RUNS[name]:
            step, operand = train.RUNS[name]["data_shift"]
            cfg["data"]["from_step"] = {"step": step, "prompts": f"a, b in 0..{operand}", "shuffled": False}
        if "lr_step" in train.RUNS[name]:
            step, factor = train.RUNS[name]["lr_step"]
            cfg["lr_step"] = {"step": step, "factor": factor}
        return cfg
    train = importlib.import_module("train_dpo")
    args, (pairs, data_seed, max_operand, n) = train.run_config(name)
    cfg = {k: args.get(k, DEFAULTS.get(k)) for k in DPO_KEYS if k in args or k in DEFAULTS}
    cfg["data"] = {"pairs": pairs, "doc": train.PAIRS[pairs].__doc__, "operands": f"0..{max_operand}",
                   "n_pairs": n, "data_seed": data_seed}
    return cfg


def check(name: str, found: dict[str, int], records: list[dict], intent: list[str],
          min_onset: int = MIN_ONSET, min_after: int = MIN_AFTER) -> list[str]:
    problems = []
    if set(found) != set(intent):
        problems.append(f"onsets {found} != intent {intent}")
    steps = sorted({int(e["step"]) for e in records})
    for pathology, step in found.items():
        after = sum(1 for s in steps if s > step)
        if step < min_onset or after < min_after:
            problems.append(f"{pathology} onset {step} with {after} logged steps after it")
    return [f"{name}: {p}" for p in problems]


def check_judgment(name: str, found: dict[str, int], intent: list[str]) -> list[str]:
    """A run made for a judgment pattern: the labels it was made for, none other, none dated in its first 20 steps
    (but the one whose rule dates it at the first step)."""
    problems = []
    if set(found) != set(intent):
        problems.append(f"judgment onsets {found} != judgment intent {intent}")
    for label, step in found.items():
        if label not in FROM_START and step < MIN_JUDGMENT_ONSET:
            problems.append(f"{label} onset {step} (before logged step {MIN_JUDGMENT_ONSET})")
    return [f"{name}: {p}" for p in problems]


def judged(run: dict, records: list[dict]) -> dict:
    """run.json's judgment fields: the judgment labels and the recommendation of every label the run has."""
    found = judgment_labels.judgment_onsets(records)
    every = {**run["onsets"], **run.get("sample_onsets", {}), **found}
    return {"judgment_onsets": found, "recommendation": judgment_labels.recommendation(every)}


def check_log(name: str, log: str) -> list[str]:
    problems = []
    if not re.search(r"\{'loss': '[^']*', ", log):
        problems.append(f"{name}: no per-step metric dict in combined.log")
    if not re.search(r"\d+%\|[^|]*\| *\d+/\d+ \[", log):
        problems.append(f"{name}: no tqdm bar in combined.log")
    return problems


REPO = Path(__file__).resolve().parents[2]


def redacted(text: str, work: Path) -> str:
    """`text` without this machine's paths: the scratch folder as $WORK, the repository as its relative paths, so
    that the committed run reads the same on any clone (the trainer's warnings print site-packages paths). A venv
    outside the scratch folder (PYTHON=...) is written as the scratch folder's own venv."""
    text = text.replace(f"{REPO}/", "").replace(str(work.resolve()), "$WORK")
    return re.sub(r"/[^\s'\"$]*/\.venv/", "$WORK/venv/", text)


def relabel(dest: Path, names: list[str]) -> int:
    """Recompute every label of runs already collected (their trainer_state.json and sample_onsets) in run.json."""
    problems: list[str] = []
    for name in names:
        path = dest / name / "run.json"
        run = json.loads(path.read_text())
        records = labels.load_records(dest / name / "trainer_state.json")
        run["onsets"] = labels.onsets(records)
        run.update(judged(run, records))
        path.write_text(json.dumps(run, indent=2) + "\n")
        if "judgment_intent" in RUN_META[name]:
            problems += check_judgment(name, run["judgment_onsets"], RUN_META[name]["judgment_intent"])
        print(f"{name:28s} onsets={run['onsets']} judgment={run['judgment_onsets']} -> {run['recommendation']}")
    write_table(dest)
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


def main() -> int:
    if sys.argv[1] == "--relabel":
        dest = Path(sys.argv[2])
        return relabel(dest, sys.argv[3:] or [n for n in RUN_META if (dest / n / "run.json").exists()])
    work, dest = Path(sys.argv[1]), Path(sys.argv[2])
    names = sys.argv[3:] or list(RUN_META)
    problems: list[str] = []
    for name in names:
        src = work / "runs" / name
        out = dest / name
        out.mkdir(parents=True, exist_ok=True)
        log_bytes = (src / "combined.log").read_bytes()  # redacted as bytes: the capture's other bytes stay as they are
        (out / "combined.log").write_bytes(redacted(log_bytes.decode("latin-1"), work).encode("latin-1"))
        shutil.copyfile(src / "out" / "trainer_state.json", out / "trainer_state.json")
        records = labels.load_records(out / "trainer_state.json")
        found = labels.onsets(records)
        meta = RUN_META[name]
        run = {
            "run": name,
            "trainer": "grpo" if name.startswith("grpo_") else "dpo",
            "intent": meta["intent"],
            "command": redacted((src / "command.txt").read_text(), work).splitlines(),
            "config": run_config(name),
            "notes": meta["notes"],
            "onsets": found,
            "logged_steps": len({int(e["step"]) for e in records}),
            "wall_seconds": int((src / "seconds.txt").read_text()),
        }
        if "judgment_intent" in meta:
            run["judgment_intent"] = meta["judgment_intent"]
        checkpoints = sorted((p.name for p in (src / "out").glob("checkpoint-*") if p.is_dir()),
                             key=lambda n: int(n.rpartition("-")[2]))
        if checkpoints:
            run["checkpoints_on_disk"] = checkpoints  # the folders the run left (not kept here: no weights)
        if (src / "out" / "completions").is_dir():
            run["sample_intent"] = meta.get("sample_intent", [])
            run["sample_onsets"] = sample_onsets(src / "out" / "completions", out)
            if set(run["sample_onsets"]) != set(meta.get("sample_intent", [])):
                problems.append(f"{name}: sample onsets {run['sample_onsets']} != {meta.get('sample_intent', [])}")
        run.update(judged(run, records))
        (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        problems += check(name, found, records, meta["intent"], 0 if meta.get("from_start") else MIN_ONSET,
                          meta.get("min_after", MIN_AFTER))
        if "judgment_intent" in meta:
            problems += check_judgment(name, run["judgment_onsets"], meta["judgment_intent"])
        problems += check_log(name, (out / "combined.log").read_text(errors="replace"))
        print(f"{name:28s} onsets={found} judgment={run['judgment_onsets']} -> {run['recommendation']} "
              f"steps={run['logged_steps']} {run['wall_seconds']}s")
    write_table(dest)
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


KEPT_PARQUET = (1, 100, 200)  # steps whose completions parquet file is kept beside the log (the parquet reader's test)


def sample_onsets(folder: Path, out: Path) -> dict[str, int]:
    """The samples labelling rule (tests/support/sample_labels.py) on the trainer's parquet rows of every step;
    copies the files of KEPT_PARQUET into out/completions/."""
    import pandas as pd  # the corpus venv's (TRL's dependency), not the exporter's

    tables = []
    for path in sorted(folder.glob("completions_*.parquet")):
        df = pd.read_parquet(path)
        step = int(df["step"].iloc[0])
        tables.append((step, list(zip(df["prompt"], df["completion"], strict=True))))
        if step in KEPT_PARQUET:
            (out / "completions").mkdir(exist_ok=True)
            shutil.copyfile(path, out / "completions" / path.name)
    onset = sample_labels.template_onset(tables)
    return {} if onset is None else {"template_collapse": onset}


def write_table(dest: Path) -> None:
    """Rewrites the run table between the README's markers from every run.json in dest."""
    readme = dest / "README.md"
    if not readme.exists():
        return
    rows = ["| run | trainer | intent | onsets (logged step) | judgment labels (logged step) | recommendation "
            "| logged steps | wall s | what happens |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in RUN_META:
        path = dest / name / "run.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        found = {**r["onsets"], **r.get("sample_onsets", {})}
        onsets = ", ".join(f"{k} {v}" for k, v in sorted(found.items(), key=lambda kv: kv[1])) or "none"
        intent = ", ".join(r["intent"] + RUN_META[name].get("sample_intent", [])) or "healthy"
        if RUN_META[name].get("judgment_intent"):
            intent += " (judgment: " + ", ".join(RUN_META[name]["judgment_intent"]) + ")"
        judgment = ", ".join(f"{k} {v}" for k, v in sorted(r["judgment_onsets"].items(), key=lambda kv: kv[1]))
        rows.append(f"| {name} | {r['trainer']} | {intent} | {onsets} | {judgment or 'none'} | {r['recommendation']} "
                    f"| {r['logged_steps']} | {r['wall_seconds']} | {r['notes']} |")
    text = readme.read_text()
    text = re.sub(r"(<!-- runs:begin -->\n).*?(<!-- runs:end -->)", lambda m: m.group(1) + "\n".join(rows) + "\n"
                  + m.group(2), text, flags=re.S)
    readme.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
