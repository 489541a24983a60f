"""Reference-free preference trainers (ORPO, CPO, SimPO; issue 24): their `rewards/chosen` is beta x log p of the
policy alone, negative by construction, so the DPO instruments and their detectors (which assume a reference model)
must not read it. The records are written for this test in TRL's ORPO and CPO shapes, with our own values."""

from __future__ import annotations

import random

import pytest
from conftest import run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.instruments.keymap import KeyMap

DPO_KEYS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected"]
EXTRA = {"orpo": ["log_odds_ratio", "log_odds_chosen", "nll_loss"], "cpo": ["nll_loss"], "dpo": [],
         "orpo_other": ["odds_ratio_loss"]}


def preference_log(kind: str, steps: int = 60) -> str:
    """A console log of HF dicts: chosen reward well below -0.5 and a positive margin, every step (what the DPO
    displacement detector looks for)."""
    rng = random.Random(7)
    lines = []
    for step in range(1, steps + 1):
        values = {"loss": 0.9 - step / 200, "grad_norm": 3.0 + rng.random(),
                  "rewards/chosen": -2.4 + rng.random() * 0.1, "rewards/rejected": -3.1 + rng.random() * 0.1,
                  "rewards/accuracies": 0.7, "rewards/margins": 0.7 + rng.random() * 0.05,
                  "logps/chosen": -240.0 - rng.random(), "logps/rejected": -310.0 - rng.random()}
        values.update({k: -0.6 - rng.random() * 0.1 for k in EXTRA[kind]})
        values["epoch"] = round(step / steps, 2)
        lines.append("{" + ", ".join(f"'{k}': {v!r}" for k, v in values.items()) + "}")
    return "\n".join(lines) + "\n"


def families(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples}


def dumped(tmp_path, kind: str) -> dict[tuple[str, tuple], float]:
    path = tmp_path / f"{kind}.log"
    path.write_text(preference_log(kind))
    res = run_cli("dump", "--no-gpu", "--run", "r", str(path))
    assert res.returncode == 0, res.stderr.decode()
    return families(res.stdout.decode())


def active(fams: dict, detector: str) -> float:
    return max((v for (name, labels), v in fams.items()
                if name == "posttrain_detector_active" and ("detector", detector) in labels), default=0.0)


def test_dpo_reads_its_rewards_and_its_displacement_detector_fires(tmp_path) -> None:
    fams = dumped(tmp_path, "dpo")
    assert fams["posttrain_dpo_reward", (("kind", "chosen"), ("run", "r"))] < -2
    assert active(fams, "dpo_displacement") == 1.0


@pytest.mark.parametrize("kind", ["orpo", "cpo", "orpo_other"])
def test_reference_free_rewards_feed_no_dpo_instrument_or_detector(tmp_path, kind: str) -> None:
    fams = dumped(tmp_path, kind)
    assert not [k for k in fams if k[0].startswith(("posttrain_dpo_reward", "posttrain_dpo_accuracy"))]
    assert active(fams, "dpo_displacement") == 0.0
    chosen = fams["posttrain_metric", (("key", "rewards/chosen"), ("run", "r"))]  # still exported, as logged
    assert chosen < -2
    assert fams["posttrain_loss", (("run", "r"),)] > 0  # the rest of the record is read as usual


def test_a_config_alias_still_routes_a_reference_free_key() -> None:
    keymap = KeyMap({"rewards/chosen": ("dpo_reward", "chosen")})
    assert keymap.resolver(("rewards/chosen", "nll_loss"))("rewards/chosen").instrument == "dpo_reward"
    assert KeyMap().resolver(("rewards/chosen", "nll_loss"))("rewards/chosen") is None
    assert KeyMap().resolver(("rewards/chosen", "loss"))("rewards/chosen").instrument == "dpo_reward"
