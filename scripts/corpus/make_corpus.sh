#!/usr/bin/env bash
# Rebuilds the labelled corpus of real TRL runs (tests/fixtures/corpus/) from scratch, on CPU, without the hub.
#
# usage: scripts/corpus/make_corpus.sh WORK_DIR [RUN ...]
#   WORK_DIR  scratch folder outside the repo (venv, tiny models, run outputs, checkpoints), e.g. /tmp/corpus-build
#   RUN       only these runs (default: all); the tiny models are rebuilt only when WORK_DIR/sft is missing
# env: JOBS=2 (runs in parallel; each is pinned to one CPU thread, so results do not depend on JOBS),
#      PYTHON (default WORK_DIR/venv/bin/python; the venv is created with pinned versions when missing),
#      NO_COLLECT=1 (train only, do not copy into tests/fixtures/corpus).
set -euo pipefail

WORK=$(mkdir -p "${1:?usage: make_corpus.sh WORK_DIR [RUN ...]}" && cd "$1" && pwd)
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-$WORK/venv/bin/python}

GRPO_RUNS=(grpo_kl_blowup grpo_kl_blowup_2 grpo_reward_std_collapse grpo_reward_std_collapse_2
           grpo_length_hacking grpo_length_hacking_2 grpo_entropy_collapse grpo_entropy_collapse_2
           grpo_healthy grpo_healthy_resumed grpo_healthy_logging5 grpo_healthy_2 grpo_healthy_noisy_kl
           grpo_samples_healthy grpo_template_collapse grpo_brevity_collapse
           grpo_dead_signal grpo_length_collapse grpo_healthy_logging10
           grpo_peak_decline grpo_kl_rise_reward_flat grpo_lr_step grpo_no_trend grpo_healthy_rising
           grpo_healthy_converged)
DPO_RUNS=(dpo_displacement dpo_displacement_2 dpo_healthy dpo_healthy_2 dpo_saturated)
RESUME_KILL_STEP=130  # grpo_healthy_resumed: SIGKILLed after this step (checkpoint at 100), then resumed

if [[ ! -x $PYTHON ]]; then
    python3.11 -m venv "$WORK/venv"
    PYTHON=$WORK/venv/bin/python
    "$PYTHON" -m pip install -q torch==2.13.0
    "$PYTHON" -m pip install -q trl==1.16.0 transformers==5.23.0 accelerate==1.15.0 datasets==5.2.0 tensorboard
fi

ENVS="HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1"
export $ENVS
cd "$WORK"

if [[ ! -d $WORK/sft/final_model ]]; then
    echo "== tiny model + SFT"
    "$PYTHON" "$HERE/build_tiny.py" "$WORK/models/tiny-model" > "$WORK/build_tiny.log" 2>&1
    "$PYTHON" "$HERE/train_sft.py" "$WORK/models/tiny-model" "$WORK/sft" > "$WORK/sft.log" 2>&1
fi
SFT=$WORK/sft/final_model

# run_one NAME SCRIPT [ARGS...]: one training, stdout+stderr of the trainer in runs/NAME/combined.log
run_one() {
    local name=$1 script=$2
    shift 2
    local dir=$WORK/runs/$name
    rm -rf "$dir"
    mkdir -p "$dir"
    local start rc=0
    start=$(date +%s)
    if [[ $name == grpo_healthy_resumed ]]; then
        local cmd1="$ENVS $PYTHON $HERE/$script $name $SFT $dir/out --die-after-step $RESUME_KILL_STEP"
        local cmd2="$ENVS $PYTHON $HERE/$script $name $SFT $dir/out --resume"
        echo "$cmd1 > $dir/combined.log 2>&1" > "$dir/command.txt"
        echo "$cmd2 >> $dir/combined.log 2>&1" >> "$dir/command.txt"
        "$PYTHON" "$HERE/$script" "$name" "$SFT" "$dir/out" --die-after-step $RESUME_KILL_STEP \
            > "$dir/combined.log" 2>&1 || rc=$?
        echo "first part exited $rc (137 = SIGKILL, expected)" > "$dir/exit.txt"
        rc=0
        "$PYTHON" "$HERE/$script" "$name" "$SFT" "$dir/out" --resume >> "$dir/combined.log" 2>&1 || rc=$?
        echo "resumed part exited $rc" >> "$dir/exit.txt"
    else
        echo "$ENVS $PYTHON $HERE/$script $name $SFT $dir/out > $dir/combined.log 2>&1" > "$dir/command.txt"
        "$PYTHON" "$HERE/$script" "$name" "$SFT" "$dir/out" > "$dir/combined.log" 2>&1 || rc=$?
        echo "exited $rc" > "$dir/exit.txt"
    fi
    echo $(( $(date +%s) - start )) > "$dir/seconds.txt"
    echo "== $name: rc=$rc, $(cat "$dir/seconds.txt") s"
    return $rc
}

if [[ $# -gt 0 ]]; then
    SELECTED=("$@")
else
    SELECTED=("${GRPO_RUNS[@]}" "${DPO_RUNS[@]}")
fi

failed=0
for name in "${SELECTED[@]}"; do
    case $name in
        grpo_*) script=train_grpo.py ;;
        dpo_*) script=train_dpo.py ;;
        *) echo "unknown run $name" >&2; exit 2 ;;
    esac
    while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n || failed=1; done
    run_one "$name" "$script" &
done
while [[ $(jobs -rp | wc -l) -gt 0 ]]; do wait -n || failed=1; done
[[ $failed == 0 ]] || { echo "some runs failed" >&2; exit 1; }

if [[ ${NO_COLLECT:-0} != 1 ]]; then
    "$PYTHON" "$HERE/collect.py" "$WORK" "$REPO/tests/fixtures/corpus" "${SELECTED[@]}"
fi
