"""The one table that maps each trainer's key names to the canonical instruments.

Rules, dashboards, the chart and docs/metrics.md all depend on the canonical names defined here;
docs/metrics.md is generated from this module (scripts/gen_metrics_doc.py) and a test keeps the two
in step. Keys that look alike but mean different things are mapped apart on purpose:
- verl `actor/ppo_kl`, OpenRLHF `ppo_kl` and TRL PPO `policy/approxkl_avg` compare the policy
  before and after an update; they feed `approx_kl`, never `kl` (KL to the reference policy).
- DPO's `rewards/chosen|rejected|margins|accuracies` are not reward components.
- The same four keys from a reference-free preference trainer (ORPO, CPO, SimPO: a record holding one of
  REFERENCE_FREE_KEYS) are beta x log p of the policy alone, negative by construction: they feed no DPO
  instrument (the DPO detectors assume a reference model) and are exported as pass-through only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Instrument:
    name: str  # short name, used as the `instrument` label of derived series
    help: str
    serves: str  # the question about a run it helps answer (docs/metrics.md's "Serves")
    label: str | None = None  # the sub-label of a family (component, bound, stat, kind)
    unit: str = ""

    @property
    def metric(self) -> str:
        return f"posttrain_{self.name}{'_' + self.unit if self.unit else ''}"


INSTRUMENTS: dict[str, Instrument] = {
    i.name: i
    for i in [
        Instrument("epoch", "Training epoch (fractional) of the last training record.", "fundamentals"),
        Instrument("loss", "Training loss. In GRPO a surrogate objective: not a progress metric, watch it "
                   "only for discontinuities.", "fundamentals; in GRPO only numerical trouble, not progress"),
        Instrument("grad_norm", "Gradient norm before clipping.", "fundamentals: gradient health"),
        Instrument("learning_rate", "Learning rate of the last training step.", "fundamentals"),
        Instrument("reward", "Mean reward of the step's completions (PPO: the reward model's score).",
                   "reward dynamics: is the run improving"),
        Instrument("reward_std", "Standard deviation of rewards within completion groups: the strength of "
                   "the learning signal.", "learning signal: GRPO's group-relative advantages"),
        Instrument("reward_zero_std", "Fraction of completion groups whose rewards all tie (no advantage "
                   "signal).", "learning signal: groups that teach nothing", unit="ratio"),
        Instrument("reward_component", "Mean of one reward function of a composite reward.",
                   "composite rewards: which part moves", label="component"),
        Instrument("reward_component_std", "Standard deviation of one reward function within groups.",
                   "composite rewards: which part still ranks completions", label="component"),
        Instrument("kl", "KL divergence between the policy and the reference policy.",
                   "drift from the reference policy"),
        Instrument("approx_kl", "Approximate KL between the policy before and after an update (not to the "
                   "reference).", "size of each update (trust region)"),
        Instrument("entropy", "Mean token entropy of the policy.", "exploration: entropy collapse"),
        Instrument("clip_ratio", "Fraction of tokens whose probability ratio was clipped, by bound "
                   "(low, high, region, low_min, high_max).", "size of each update: clipping at either bound",
                   label="bound"),
        Instrument("clip_fraction", "PPO clip fraction: share of updates where the ratio clip was active.",
                   "size of each update: PPO's clipped share", unit="ratio"),
        Instrument("policy_ratio", "Mean ratio of current to old policy probabilities (healthy near 1.0).",
                   "size of each update: policy ratio"),
        Instrument("value_loss", "Value-function loss (PPO critic).", "PPO critic health"),
        Instrument("completion_length", "Completion length in tokens, by statistic (mean, min, max, "
                   "mean_terminated, min_terminated, max_terminated, std).",
                   "generation length: length bias, brevity, mode collapse", label="stat",
                   unit="tokens"),
        Instrument("completion_truncated", "Fraction of completions cut at the maximum length.",
                   "generation length: answers cut at the limit", unit="ratio"),
        Instrument("dpo_reward", "DPO implicit reward, by kind (chosen, rejected, margin).",
                   "DPO reward dynamics: margin and likelihood displacement", label="kind"),
        Instrument("dpo_accuracy", "Fraction of pairs where the chosen response is preferred.",
                   "DPO reward dynamics: is the preference learnt", unit="ratio"),
        Instrument("ppo_reward", "PPO reward terms, by kind (rlhf = score + non_score; non_score = the KL "
                   "penalty).", "PPO reward dynamics: score against KL penalty", label="kind"),
        Instrument("token_accuracy", "Mean token accuracy on the training batch (SFT, DPO).",
                   "fundamentals", unit="ratio"),
        Instrument("step_time", "Wall time of one training step as the trainer measured it.",
                   "throughput: step time", unit="seconds"),
        Instrument("generation_time", "Wall time of the step's generation (rollout) phase as the trainer "
                   "measured it.", "throughput: the generation phase's share", unit="seconds"),
        Instrument("completion_diversity", "How alike the step's printed completions are, by statistic "
                   "(distinct_share, top_share, top_prompts, top_prompt_share, distinct_2gram, similarity, rows, "
                   "prompts): read from TRL's log_completions tables or verl's [response] lines, never the text.",
                   "reading the outputs: response diversity, template collapse", label="stat"),
    ]
}


@dataclass(frozen=True)
class KeyRule:
    """One framework key (or key pattern) and where it goes.

    Lower `priority` wins when one record holds several keys for the same series."""

    key: str  # exact key, or a regex when `pattern` is set
    instrument: str
    label_value: str | None = None  # fixed sub-label; a pattern's `v` group otherwise
    frameworks: str = ""
    priority: int = 0
    pattern: bool = False
    note: str = ""


_DPO_REWARD_NAMES = "chosen|rejected|margins|accuracies"
# Keys only reference-free preference trainers log beside `rewards/*`: TRL ORPO (`log_odds_ratio`, `log_odds_chosen`,
# `nll_loss`), CPO and SimPO (`nll_loss`), and ORPO implementations that log `odds_ratio_loss`. (TRL DPO logs
# `nll_loss` too when rpo_alpha is set: such a run is read as reference-free, its DPO detectors silent.)
REFERENCE_FREE_KEYS = frozenset({"log_odds_ratio", "log_odds_chosen", "odds_ratio_loss", "nll_loss"})
# Instruments whose detectors assume a reference model: a reference-free record feeds none of them.
_REFERENCE_INSTRUMENTS = frozenset({"dpo_reward", "dpo_accuracy"})
_REFERENCE_FREE_NOTE = ("not from a record that also holds " + ", ".join(f"`{k}`" for k in sorted(REFERENCE_FREE_KEYS))
                        + ": ORPO, CPO and SimPO have no reference model, their rewards are pass-through only")

KEY_RULES: list[KeyRule] = [
    KeyRule("epoch", "epoch", frameworks="HF Trainer (all TRL trainers)"),
    KeyRule("training/epoch", "epoch", frameworks="verl", priority=1),
    KeyRule("loss", "loss", frameworks="HF Trainer (all TRL trainers)"),
    KeyRule("actor/pg_loss", "loss", frameworks="verl", priority=1),
    KeyRule("policy_loss", "loss", frameworks="OpenRLHF; TRL GRPO (some versions, beside `loss`)", priority=2),
    KeyRule("loss/policy_avg", "loss", frameworks="TRL PPO", priority=3),
    KeyRule("gpt_loss", "loss", frameworks="OpenRLHF SFT (per micro-batch, in the step bar's postfix)", priority=4),
    KeyRule("grad_norm", "grad_norm", frameworks="HF Trainer"),
    KeyRule("actor/grad_norm", "grad_norm", frameworks="verl", priority=1),
    KeyRule("actor_grad_norm", "grad_norm", frameworks="OpenRLHF", priority=2),
    KeyRule("learning_rate", "learning_rate", frameworks="HF Trainer"),
    KeyRule("lr", "learning_rate", frameworks="TRL PPO", priority=1),
    KeyRule("actor/lr", "learning_rate", frameworks="verl", priority=2),
    KeyRule("actor_lr", "learning_rate", frameworks="OpenRLHF", priority=3),
    KeyRule("reward", "reward", frameworks="TRL GRPO, RLOO; OpenRLHF"),
    KeyRule("rollout/reward_mean", "reward", frameworks="OpenRLHF v0.10+ (beside `reward`)", priority=3),
    KeyRule("objective/scores", "reward", frameworks="TRL PPO (raw reward-model score)", priority=1),
    KeyRule("critic/score/mean", "reward", frameworks="verl (sequence score before KL penalty)", priority=2),
    KeyRule("reward_std", "reward_std", frameworks="TRL GRPO, RLOO"),
    KeyRule("group_reward_std", "reward_std", frameworks="OpenRLHF", priority=1),
    KeyRule("frac_reward_zero_std", "reward_zero_std", frameworks="TRL GRPO, RLOO"),
    KeyRule(rf"rewards/(?P<v>(?!(?:{_DPO_REWARD_NAMES})$).+)/mean", "reward_component",
            frameworks="TRL GRPO, RLOO (`rewards/<func>/mean`)", pattern=True),
    KeyRule(rf"rewards/(?P<v>(?!(?:{_DPO_REWARD_NAMES})$)[^/]+)", "reward_component",
            frameworks="TRL GRPO before the /mean suffix (`rewards/<func>`)", pattern=True, priority=1,
            note="DPO's rewards/chosen|rejected|margins|accuracies are excluded"),
    KeyRule(r"rewards/(?P<v>.+)/std", "reward_component_std", frameworks="TRL GRPO, RLOO", pattern=True),
    KeyRule("kl", "kl", frameworks="TRL GRPO (beta > 0), KTO (reference-point estimate); OpenRLHF"),
    KeyRule("objective/kl", "kl", frameworks="TRL PPO", priority=1),
    KeyRule("actor/kl_loss", "kl", frameworks="verl (use_kl_loss)", priority=2),
    KeyRule("policy/approxkl_avg", "approx_kl", frameworks="TRL PPO"),
    KeyRule("actor/ppo_kl", "approx_kl", frameworks="verl", priority=1),
    KeyRule("ppo_kl", "approx_kl", frameworks="OpenRLHF", priority=2),
    KeyRule("entropy", "entropy", frameworks="TRL GRPO, SFT, DPO"),
    KeyRule("objective/entropy", "entropy", frameworks="TRL PPO", priority=1),
    KeyRule("policy/entropy_avg", "entropy", frameworks="TRL PPO", priority=2),
    KeyRule("actor/entropy", "entropy", frameworks="verl", priority=3),
    KeyRule("actor/entropy_loss", "entropy", frameworks="verl (older name)", priority=4),
    KeyRule("entropy_loss", "entropy", frameworks="OpenRLHF", priority=5),
    KeyRule("clip_ratio/low_mean", "clip_ratio", "low", frameworks="TRL GRPO, RLOO"),
    KeyRule("clip_ratio/high_mean", "clip_ratio", "high", frameworks="TRL GRPO, RLOO"),
    KeyRule("clip_ratio/region_mean", "clip_ratio", "region", frameworks="TRL GRPO, RLOO"),
    KeyRule("clip_ratio/low_min", "clip_ratio", "low_min", frameworks="TRL GRPO, RLOO"),
    KeyRule("clip_ratio/high_max", "clip_ratio", "high_max", frameworks="TRL GRPO, RLOO"),
    KeyRule("clip_ratio", "clip_ratio", "region", frameworks="TRL GRPO before the low/high split", priority=1),
    KeyRule("policy/clipfrac_avg", "clip_fraction", frameworks="TRL PPO"),
    KeyRule("actor/pg_clipfrac", "clip_fraction", frameworks="verl", priority=1),
    KeyRule("ppo_clip_ratio", "clip_fraction", frameworks="OpenRLHF", priority=2),
    KeyRule("val/ratio", "policy_ratio", frameworks="TRL PPO"),
    KeyRule("loss/value_avg", "value_loss", frameworks="TRL PPO"),
    KeyRule("critic/vf_loss", "value_loss", frameworks="verl", priority=1),
    KeyRule("critic_loss", "value_loss", frameworks="OpenRLHF", priority=2),
    KeyRule("completions/mean_length", "completion_length", "mean", frameworks="TRL GRPO, RLOO"),
    KeyRule("completions/min_length", "completion_length", "min", frameworks="TRL GRPO, RLOO"),
    KeyRule("completions/max_length", "completion_length", "max", frameworks="TRL GRPO, RLOO"),
    KeyRule("completions/mean_terminated_length", "completion_length", "mean_terminated",
            frameworks="TRL GRPO, RLOO"),
    KeyRule("completions/min_terminated_length", "completion_length", "min_terminated",
            frameworks="TRL GRPO, RLOO"),
    KeyRule("completions/max_terminated_length", "completion_length", "max_terminated",
            frameworks="TRL GRPO, RLOO"),
    KeyRule("completions/length_std", "completion_length", "std",
            frameworks="a custom logging callback (within-group std); TRL 1.16 does not log it"),
    KeyRule("completion_length", "completion_length", "mean", frameworks="TRL GRPO (older name)", priority=1),
    KeyRule("response_length/mean", "completion_length", "mean", frameworks="verl", priority=2),
    KeyRule("response_length/min", "completion_length", "min", frameworks="verl", priority=2),
    KeyRule("response_length/max", "completion_length", "max", frameworks="verl", priority=2),
    KeyRule("response_length", "completion_length", "mean", frameworks="OpenRLHF", priority=3),
    KeyRule("rollout/response_length_mean", "completion_length", "mean", frameworks="OpenRLHF v0.10+ (beside "
            "`response_length`)", priority=4),
    KeyRule("completions/clipped_ratio", "completion_truncated", frameworks="TRL GRPO, RLOO"),
    KeyRule("response_length/clip_ratio", "completion_truncated", frameworks="verl", priority=1),
    KeyRule("rollout/truncated_rate", "completion_truncated", frameworks="OpenRLHF v0.10+", priority=2),
    KeyRule("rewards/chosen", "dpo_reward", "chosen", frameworks="TRL DPO, KTO", note=_REFERENCE_FREE_NOTE),
    KeyRule("rewards/rejected", "dpo_reward", "rejected", frameworks="TRL DPO, KTO", note=_REFERENCE_FREE_NOTE),
    KeyRule("rewards/margins", "dpo_reward", "margin", frameworks="TRL DPO, KTO", note=_REFERENCE_FREE_NOTE),
    KeyRule("rewards/accuracies", "dpo_accuracy", frameworks="TRL DPO", note=_REFERENCE_FREE_NOTE),
    KeyRule("acc_mean", "dpo_accuracy", frameworks="OpenRLHF DPO", priority=1),
    KeyRule("acc", "dpo_accuracy", frameworks="OpenRLHF DPO, RM (per micro-batch, in the step bar's postfix)",
            priority=2),
    KeyRule("chosen_reward", "dpo_reward", "chosen", frameworks="OpenRLHF DPO (implicit reward); RM (the score of "
            "the chosen answer)", priority=1),
    KeyRule("reject_reward", "dpo_reward", "rejected", frameworks="OpenRLHF DPO (implicit reward); RM (the score of "
            "the rejected answer)", priority=1),
    KeyRule("objective/rlhf_reward", "ppo_reward", "rlhf", frameworks="TRL PPO"),
    KeyRule("objective/non_score_reward", "ppo_reward", "non_score", frameworks="TRL PPO"),
    KeyRule("mean_token_accuracy", "token_accuracy", frameworks="TRL SFT, DPO"),
    KeyRule("step_time", "step_time", frameworks="TRL GRPO, RLOO"),
    KeyRule("timing_s/step", "step_time", frameworks="verl", priority=1),
    KeyRule("perf/time_per_step", "step_time", frameworks="verl", priority=2),
    KeyRule("timing/step_total", "step_time", frameworks="OpenRLHF", priority=3),
    KeyRule("timing_s/gen", "generation_time", frameworks="verl"),
    KeyRule("timing/generation", "generation_time", frameworks="OpenRLHF", priority=1),
    KeyRule(r"samples/(?P<v>distinct_share|top_share|top_prompts|top_prompt_share|distinct_2gram|similarity|rows"
            r"|prompts)", "completion_diversity", pattern=True,
            frameworks="the exporter's sample reader (exporter/samples): TRL log_completions=True panels, verl's "
            "printed [prompt]/[response] samples"),
]


@dataclass(frozen=True, slots=True)
class Target:
    """Where one key lands: an instrument series (instrument, sub-label value) and its priority."""

    instrument: str
    label_value: str | None
    priority: int
    label_from_key: bool = False  # the label value is part of the key (a pattern rule): any number of them


class KeyMap:
    """Resolves keys to canonical targets; config aliases come first. Results are cached per key."""

    def __init__(self, aliases: dict[str, tuple[str, str | None]] | None = None) -> None:
        self._aliases = {k: Target(i, lv, -1) for k, (i, lv) in (aliases or {}).items()}
        self._exact = {r.key: r for r in KEY_RULES if not r.pattern}
        self._patterns = [(re.compile(r.key + "$"), r) for r in KEY_RULES if r.pattern]
        self.resolve = lru_cache(maxsize=4096)(self._resolve)

    def resolver(self, shape: tuple[str, ...]) -> Callable[[str], Target | None]:
        """resolve() for the keys of a record of `shape`: a reference-free preference trainer's record (it holds
        one of REFERENCE_FREE_KEYS) feeds no instrument that assumes a reference model, unless a config alias says."""
        return self.resolve if REFERENCE_FREE_KEYS.isdisjoint(shape) else self._resolve_reference_free

    def _resolve_reference_free(self, key: str) -> Target | None:
        t = self.resolve(key)
        if t is not None and t.instrument in _REFERENCE_INSTRUMENTS and key not in self._aliases:
            return None
        return t

    def _resolve(self, key: str) -> Target | None:
        if key in self._aliases:
            return self._aliases[key]
        rule = self._exact.get(key)
        if rule is not None:
            return Target(rule.instrument, rule.label_value, rule.priority)
        for rx, rule in self._patterns:
            m = rx.match(key)
            if m:
                if "v" in rx.groupindex:
                    return Target(rule.instrument, m.group("v"), rule.priority, label_from_key=True)
                return Target(rule.instrument, rule.label_value, rule.priority)
        return None
