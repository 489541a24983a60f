"""`posttrain-exporter dump` on every real fixture: canonical gauges hold the last logged value with
its step, and promtool accepts the exposition."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import TRL, TRL_RUNS, fixture_captures, require_binary, run_cli, trainer_state
from prometheus_client.parser import text_string_to_metric_families
from test_fixtures import TIMING, close4

# Written out here, independently of exporter/instruments/keymap.py: TRL key -> (metric, labels).
TRL_CANONICAL: dict[str, tuple[str, dict[str, str]]] = {
    "loss": ("posttrain_loss", {}),
    "grad_norm": ("posttrain_grad_norm", {}),
    "learning_rate": ("posttrain_learning_rate", {}),
    "reward": ("posttrain_reward", {}),
    "reward_std": ("posttrain_reward_std", {}),
    "frac_reward_zero_std": ("posttrain_reward_zero_std_ratio", {}),
    "kl": ("posttrain_kl", {}),
    "entropy": ("posttrain_entropy", {}),
    "completions/mean_length": ("posttrain_completion_length_tokens", {"stat": "mean"}),
    "completions/max_length": ("posttrain_completion_length_tokens", {"stat": "max"}),
    "completions/mean_terminated_length": ("posttrain_completion_length_tokens", {"stat": "mean_terminated"}),
    "completions/clipped_ratio": ("posttrain_completion_truncated_ratio", {}),
    "clip_ratio/low_mean": ("posttrain_clip_ratio", {"bound": "low"}),
    "clip_ratio/high_mean": ("posttrain_clip_ratio", {"bound": "high"}),
    "clip_ratio/region_mean": ("posttrain_clip_ratio", {"bound": "region"}),
    "rewards/chosen": ("posttrain_dpo_reward", {"kind": "chosen"}),
    "rewards/rejected": ("posttrain_dpo_reward", {"kind": "rejected"}),
    "rewards/margins": ("posttrain_dpo_reward", {"kind": "margin"}),
    "rewards/accuracies": ("posttrain_dpo_accuracy_ratio", {}),
    "mean_token_accuracy": ("posttrain_token_accuracy_ratio", {}),
    "step_time": ("posttrain_step_time_seconds", {}),
}
COMPONENT = re.compile(r"^rewards/(.+)/(mean|std)$")


def expected_last(run: str) -> dict[tuple[str, frozenset], tuple[float, int]]:
    """From trainer_state: for each canonical series, (last value, its step) over training records."""
    out = {}
    for e in trainer_state(run):
        if "loss" not in e:  # eval and summary entries
            continue
        for key, value in e.items():
            m = COMPONENT.match(key)
            if m:
                metric = "posttrain_reward_component" + ("_std" if m.group(2) == "std" else "")
                target = (metric, {"component": m.group(1)})
            elif key in TRL_CANONICAL:
                target = TRL_CANONICAL[key]
            else:
                continue
            out[target[0], frozenset(target[1].items())] = (value, e["step"])
    return out


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k != "run"}
            out[s.name, frozenset(labels.items())] = s.value
    return out


def dump(path) -> str:
    res = run_cli("dump", str(path))
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout.decode()


@pytest.mark.parametrize(("run", "capture"), [*fixture_captures(), *[(r, "trainer_state.json") for r in TRL_RUNS]])
def test_dump_gives_last_value_and_step_of_every_instrument(run: str, capture: str) -> None:
    got = samples(dump(TRL / run / capture))
    expected = expected_last(run)
    assert expected, f"{run} logs no canonical key?"
    exact = capture == "trainer_state.json"
    for (metric, labels), (value, step) in expected.items():
        assert (metric, labels) in got, f"{metric}{dict(labels)} missing from dump of {run}/{capture}"
        if not TIMING.search(metric):
            v = got[metric, labels]
            assert v == value if exact else close4(v, value), (metric, dict(labels), v, value)
        inst = metric.removeprefix("posttrain_")
        if inst != "clip_ratio":  # the others end in a unit suffix that the instrument name lacks
            inst = inst.removesuffix("_ratio").removesuffix("_seconds").removesuffix("_tokens")
        assert got["posttrain_instrument_last_step", frozenset({*labels, ("instrument", inst)})] == step
    last_train = max(e["step"] for e in trainer_state(run) if "loss" in e)
    assert got["posttrain_step", frozenset()] == last_train


def test_dump_output_passes_promtool_check_metrics() -> None:
    promtool = require_binary("promtool")
    for run, capture in fixture_captures():
        res = subprocess.run([promtool, "check", "metrics"], input=dump(TRL / run / capture).encode(),
                             capture_output=True, timeout=60)
        assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), (run, capture, res)


def test_dump_includes_nvml_health_and_training_metrics_are_unaffected() -> None:
    """On a machine without NVML (CI) the GPU families say so; the training series are all there."""
    with_gpu = samples(dump(TRL / "grpo" / "stdout.log"))
    res = run_cli("dump", str(TRL / "grpo" / "stdout.log"), "--no-gpu")
    without = samples(res.stdout.decode())
    assert with_gpu["posttrain_gpu_nvml_up", frozenset()] in (0.0, 1.0)
    assert not any(name.startswith("posttrain_gpu_") for name, _ in without)
    training = {k: v for k, v in with_gpu.items() if not k[0].startswith(("posttrain_gpu_", "posttrain_exporter_"))}
    assert training and all(without[k] == v or (v != v and without[k] != without[k]) for k, v in training.items())


def test_dump_reads_standard_input() -> None:
    res = run_cli("dump", "-", "--run", "piped", stdin=(TRL / "dpo" / "combined.log").read_bytes())
    assert res.returncode == 0
    assert 'posttrain_step{run="piped"} 200.0' in res.stdout.decode()


_LOADED = """
import contextlib, io, sys
from exporter import cli
with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):
    cli.main(["dump", "--no-gpu", *sys.argv[1:]])
watched = ("yaml", "exporter.report.text", "exporter.report.html", "exporter.alerting.rules")
print(" ".join(sorted(m for m in watched if m in sys.modules)))
"""


def test_dump_without_a_config_loads_no_yaml_nor_the_report_renderers(tmp_path) -> None:
    """Start-up is a tenth of dump's time on a 200k-line log: YAML is read only for a config file, the report's
    renderers and the rules generator's modules only by the commands that use them (the verdict and the judgment are
    a scrape's: the recommendation gauges)."""
    log = str(TRL / "grpo" / "stdout.log")

    def loaded(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", _LOADED, *args, log], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    assert loaded() == ""
    config = tmp_path / "config.yaml"
    config.write_text("limits:\n  max_keys: 400\n")
    assert loaded("--config", str(config)) == "yaml"  # the check sees a module that is loaded
