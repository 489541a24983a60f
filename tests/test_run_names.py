"""Distinct sources never merge into one run silently: two files with the same name get names from their folders;
two sources given the same run name, or an empty run name, stop the exporter at start."""

from __future__ import annotations

import shutil

import pytest
from conftest import TRL, run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.commands.base import UsageError
from exporter.commands.specs import log_specs
from exporter.config import Config, LogSpec, default_run_name, parse_config


def samples(text: str, name: str) -> dict[str, float]:
    return {s.labels["run"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


def test_two_trainer_states_with_the_same_name_stay_two_runs(tmp_path) -> None:
    """`a/trainer_state.json` and `b/trainer_state.json` (two real runs, 300 and 200 steps): two runs, whole,
    without a reset; before, they merged into one run `trainer_state` with a reset where the other began."""
    for folder, run in (("a", "grpo"), ("b", "dpo")):
        (tmp_path / folder).mkdir()
        shutil.copy(TRL / run / "trainer_state.json", tmp_path / folder / "trainer_state.json")
    res = run_cli("dump", "--no-gpu", str(tmp_path / "a" / "trainer_state.json"),
                  str(tmp_path / "b" / "trainer_state.json"))
    assert res.returncode == 0, res.stderr.decode()
    out = res.stdout.decode()
    assert samples(out, "posttrain_step") == {"a/trainer_state": 300.0, "b/trainer_state": 200.0}
    assert samples(out, "posttrain_exporter_history_resets_total") in ({}, {"a/trainer_state": 0.0,
                                                                            "b/trainer_state": 0.0})
    assert "naming this one 'a/trainer_state'" in res.stderr.decode()


def test_same_stem_in_deeper_folders_takes_as_many_folders_as_it_needs(tmp_path) -> None:
    paths = [str(tmp_path / "x" / "ckpt" / "grpo.log"), str(tmp_path / "y" / "ckpt" / "grpo.log")]
    specs = log_specs(Config(), paths, None, "auto")
    assert [s.run for s in specs] == ["x/ckpt/grpo", "y/ckpt/grpo"]


def test_a_named_run_keeps_its_name_and_the_other_is_renamed(tmp_path) -> None:
    cfg = parse_config({"logs": [{"path": str(tmp_path / "a.log"), "run": "grpo"}]})
    specs = log_specs(cfg, [str(tmp_path / "sub" / "grpo.log")], None, "auto")
    assert [s.run for s in specs] == ["grpo", "sub/grpo"]


def test_the_same_file_twice_is_read_once(tmp_path) -> None:
    path = str(tmp_path / "grpo.log")
    cfg = parse_config({"logs": [path]})
    assert log_specs(cfg, [path], None, "auto") == [LogSpec(path, "grpo")]


# --- generic file names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["combined.log", "train.log", "stdout", "stderr.txt", "output.log", "log.txt",
                                  "logs", "training.log", "console.log", "out.log", "Train.LOG"])
def test_a_generic_file_name_gives_its_folders_name(tmp_path, name) -> None:
    (tmp_path / "runs" / "qwen2.5-7b-grpo" / "logs").mkdir(parents=True)
    path = tmp_path / "runs" / "qwen2.5-7b-grpo" / "logs" / name  # logs/: generic too, passed over
    assert default_run_name(str(path)) == "qwen2.5-7b-grpo"
    assert default_run_name(str(tmp_path / "dpo-run3" / name)) == "dpo-run3"
    assert default_run_name("qwen2.5-7b-grpo.log") == "qwen2.5-7b-grpo"  # a name that says something stays


def test_generic_names_all_the_way_up_keep_the_stem() -> None:
    assert default_run_name("/logs/train.log") == "train"
    assert default_run_name("/out/logs/output/stdout") == "stdout"


def test_the_cli_names_the_run_after_the_folder_and_run_still_wins(tmp_path) -> None:
    """The bundled GRPO log as `grpo-7b/combined.log`: run grpo-7b; `--run` and the config's `run` still win;
    two generic logs of one folder are told apart by their stems."""
    (tmp_path / "grpo-7b").mkdir()
    log = tmp_path / "grpo-7b" / "combined.log"
    shutil.copy(TRL / "grpo" / "combined.log", log)
    res = run_cli("dump", "--no-gpu", str(log))
    assert res.returncode == 0, res.stderr.decode()
    assert set(samples(res.stdout.decode(), "posttrain_step")) == {"grpo-7b"}
    assert [s.run for s in log_specs(Config(), [str(log)], "mine", "auto")] == ["mine"]
    assert [s.run for s in log_specs(Config(run="cfg"), [str(log)], None, "auto")] == ["cfg"]
    cfg = parse_config({"logs": [{"path": str(log), "run": "named"}]})
    assert [s.run for s in log_specs(cfg, [], None, "auto")] == ["named"]
    both = [str(tmp_path / "grpo-7b" / "stdout.log"), str(tmp_path / "grpo-7b" / "stderr.log")]
    assert [s.run for s in log_specs(Config(), both, None, "auto")] == ["grpo-7b/stdout", "grpo-7b/stderr"]


def test_a_kubernetes_container_with_a_generic_name_gives_the_pods(monkeypatch) -> None:
    assert default_run_name("k8s://team-a/grpo-7b-0/trainer") == "grpo-7b-0"
    assert default_run_name("k8s://team-a/grpo-7b-0/reward-model") == "reward-model"
    monkeypatch.setenv("POD_NAME", "dpo-13b-master-0")
    assert default_run_name("k8s://train") == "dpo-13b-master-0"
    monkeypatch.delenv("POD_NAME")
    assert default_run_name("k8s://train") == "train"


def test_two_logs_given_the_same_run_is_an_error(tmp_path) -> None:
    with pytest.raises(UsageError, match=r"run 'grpo': logs .*a.log and .*b.log would merge into one run"):
        log_specs(Config(), [str(tmp_path / "a.log"), str(tmp_path / "b.log")], "grpo", "auto")
    res = run_cli("dump", "--run", "grpo", str(tmp_path / "a.log"), str(tmp_path / "b.log"))
    assert res.returncode == 2 and b"would merge into one run" in res.stderr


def test_config_logs_with_the_same_run_are_an_error(tmp_path) -> None:
    cfg = parse_config({"logs": [{"path": "/x/a.log", "run": "r"}, {"path": "/x/b.log", "run": "r"}]})
    with pytest.raises(UsageError, match="would merge"):
        log_specs(cfg, [], None, "auto")


@pytest.mark.parametrize("run", ["", " ", "has space", "a{b}"])
def test_empty_or_invalid_run_is_an_error(run) -> None:
    res = run_cli("dump", "--run", run, "x.log")
    assert res.returncode == 2, res.stdout
    assert b"--run:" in res.stderr and b"is not a run label" in res.stderr


def test_run_names_the_trainer_and_files_beside_it_by_their_names() -> None:
    child = LogSpec("-", "grpo-7b")
    specs = log_specs(Config(), ["/out/trainer_state.json"], None, "auto", child=child)
    assert [s.run for s in specs] == ["grpo-7b", "trainer_state"]
    with pytest.raises(UsageError, match="cannot be a log here"):
        log_specs(Config(), ["-"], None, "auto", child=child)


@pytest.mark.parametrize(("path", "run"), [
    ("/runs/qwen2.5-7b-grpo.log", "qwen2.5-7b-grpo"),  # a version's dots stay: only the last extension goes
    ("out/llama-3.1-8b.dpo.jsonl", "llama-3.1-8b.dpo"),
    ("/train.log", "train"),  # generic, and no folder above it to take a name from
    ("/out/", "out"),
    ("/data/qwen2.5-7b/", "qwen2.5-7b"),  # an output folder keeps its whole name
    ("noext", "noext"),
    ("-", "stdin"),
])
def test_the_default_run_name_is_the_file_name_less_its_last_extension(path: str, run: str, tmp_path) -> None:
    assert default_run_name(path) == run
    (tmp_path / "ckpt-1.5b").mkdir()
    assert default_run_name(str(tmp_path / "ckpt-1.5b")) == "ckpt-1.5b"  # an existing folder, without its /


def test_two_dotted_names_stay_apart_without_numbering(tmp_path) -> None:
    """`qwen2.5-7b-grpo.log` and `qwen2.5-7b-dpo.log` were `qwen2-2` and `qwen2-3` (cut at the first dot)."""
    paths = [str(tmp_path / "qwen2.5-7b-grpo.log"), str(tmp_path / "qwen2.5-7b-dpo.log")]
    specs = log_specs(Config(), paths, None, "auto")
    assert [s.run for s in specs] == ["qwen2.5-7b-grpo", "qwen2.5-7b-dpo"]


def test_bytes_read_count_for_a_trainer_state_source(tmp_path) -> None:
    """posttrain_exporter_source_read_bytes_total counts a trainer_state.json's reads too (it stayed 0)."""
    path = tmp_path / "trainer_state.json"
    shutil.copy(TRL / "grpo" / "trainer_state.json", path)
    res = run_cli("dump", "--no-gpu", str(path))
    assert res.returncode == 0, res.stderr.decode()
    assert samples(res.stdout.decode(), "posttrain_exporter_source_read_bytes_total") == {
        "trainer_state": float(path.stat().st_size)}
