"""Exporter conventions on the command line: --log.level and --log.format before or after the command, logfmt (the
default) or JSON logs, a POSTTRAIN_* environment variable for every flag (the command line wins, a bad value stops
at start naming the variable), and posttrain_exporter_build_info{version, python}."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port, run_cli
from prometheus_client.parser import text_string_to_metric_families
from support.loopback import scrape_until

from exporter import __version__
from exporter.cli import build_parser
from exporter.envflags import ENV_PREFIX, env_name
from exporter.logformat import JsonLogFormatter, LogfmtFormatter

LOGFMT_LINE = re.compile(r'^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(debug|info|warn|error) logger=\S+ '
                         r'caller=\S+\.py:\d+ msg=("(?:[^"\\]|\\.)*"|\S+)( err=.*)?$')


def two_same_named_states(tmp_path: Path) -> list[str]:
    """Two real trainer_state.json files of the same name: the exporter logs (at info) how it names them."""
    paths = []
    for folder, run in (("a", "grpo"), ("b", "dpo")):
        (tmp_path / folder).mkdir()
        shutil.copy(TRL / run / "trainer_state.json", tmp_path / folder / "trainer_state.json")
        paths.append(str(tmp_path / folder / "trainer_state.json"))
    return paths


def run_env(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return subprocess.run(exporter_cmd(*args), capture_output=True, timeout=timeout, cwd=REPO, env=clean | env)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    err = res.stderr.decode().strip()
    assert res.returncode == 2 and "\n" not in err and err.startswith("posttrain-exporter:"), err
    return err


def samples(text: str, name: str) -> dict[str, float]:
    return {s.labels["run"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


# --- --log.level and --log.format ---------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_log_level_before_or_after_the_command(tmp_path, where: str) -> None:
    paths = two_same_named_states(tmp_path)
    flags = ["--log.level", "error"]
    args = [*flags, "dump", "--no-gpu", *paths] if where == "before" else ["dump", "--no-gpu", *flags, *paths]
    res = run_cli(*args)
    assert res.returncode == 0 and res.stderr == b"", res.stderr.decode()
    assert samples(res.stdout.decode(), "posttrain_step") == {"a/trainer_state": 300.0, "b/trainer_state": 200.0}
    # the old spelling still works, in both places; given twice, the one after the command is the one taken
    assert run_cli("dump", "--no-gpu", "--log-level", "warn", *paths).stderr == b""
    res = run_cli("--log.level", "error", "dump", "--no-gpu", "--log.level", "info", *paths)
    assert b"naming this one 'a/trainer_state'" in res.stderr


def test_run_takes_log_flags_after_the_command() -> None:
    res = run_cli("run", "--no-gpu", "--log.level", "error", "--log.format", "json", "--web.listen-address",
                  f"127.0.0.1:{free_port()}", "--", sys.executable, "-c", "print('trainer says hi')")
    assert res.returncode == 0 and res.stderr == b"" and res.stdout == b"trainer says hi\n", res.stderr.decode()


def test_logfmt_by_default_json_on_request(tmp_path) -> None:
    paths = two_same_named_states(tmp_path)
    lines = run_cli("dump", "--no-gpu", *paths).stderr.decode().splitlines()
    assert len(lines) == 2 and all(LOGFMT_LINE.match(line) for line in lines), lines
    assert "level=info logger=posttrain-exporter caller=specs.py:" in lines[0]  # the module that logged it
    assert "naming this one 'a/trainer_state' (set a run to choose)\"" in lines[0]

    lines = run_cli("dump", "--no-gpu", "--log.format", "json", *paths).stderr.decode().splitlines()
    records = [json.loads(line) for line in lines]
    assert [sorted(r) for r in records] == [["caller", "level", "logger", "msg", "ts"]] * 2
    assert records[0]["level"] == "info" and records[0]["logger"] == "posttrain-exporter"
    assert records[1]["msg"].endswith("naming this one 'b/trainer_state' (set a run to choose)")


@pytest.mark.parametrize("args", [
    ["--log.format", "json", "dump", "--no-gpu", "/nonexistent/train.log"],  # a start-up error of the command
    ["--log.format=json", "dump", "--no-such-flag"],                          # the parser's own error
    ["dump", "--no-gpu", "--log.format", "json", "--config", "/nonexistent.yml", "x.log"],  # a config error
])
def test_fatal_errors_follow_log_format_json(args: list[str]) -> None:
    res = run_cli(*args)
    assert res.returncode == 2
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    record = json.loads(lines[0])  # a log pipeline parsing JSON lines reads the error too
    assert record["level"] == "error" and record["logger"] == "posttrain-exporter" and "error" in record["msg"]


def test_fatal_error_takes_json_from_the_environment() -> None:
    res = run_env("dump", "--no-such-flag", env={**os.environ, "POSTTRAIN_LOG_FORMAT": "json"})
    assert res.returncode == 2
    assert json.loads(res.stderr.decode().splitlines()[0])["level"] == "error"
    plain = run_cli("dump", "--no-such-flag")
    assert plain.stderr.decode().startswith("posttrain-exporter: error: ")


def test_debug_log_leaves_out_the_file_watchers_internals(tmp_path) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    port = free_port()
    proc = subprocess.Popen(exporter_cmd("--log.level", "debug", "serve", "--no-gpu", "--log", str(log),
                                         "--web.listen-address", f"127.0.0.1:{port}"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        scrape_until(port, lambda body: "posttrain_exporter_build_info" in body, proc, timeout=30)
        for i in range(20):  # file events: each wakes the watcher, none may print its internals
            with log.open("a") as f:
                f.write(f"{{'loss': {i}.5, 'epoch': 0.{i}}}\n")
        scrape_until(port, lambda body: "posttrain_loss{" in body, proc, timeout=30)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=20)[1].decode()
    assert "logger=posttrain-exporter" in err or "logger=exporter" in err, err[-2000:]
    assert "logger=watchdog" not in err, [ln for ln in err.splitlines() if "watchdog" in ln][:3]


def test_logfmt_quotes_what_would_break_a_line() -> None:
    record = logging.LogRecord("exporter.x", logging.WARNING, "/src/tail.py", 7, 'said "no"\nthen=%s', ("bye",),
                               None)
    line = LogfmtFormatter().format(record)
    assert "\n" not in line and LOGFMT_LINE.match(line), line
    assert line.endswith(' level=warn logger=exporter.x caller=tail.py:7 msg="said \\"no\\"\\nthen=bye"')
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "/a.py", 1, "failed", (), sys.exc_info())
    line = LogfmtFormatter().format(record)
    assert "\n" not in line and line.split(" err=")[1].startswith('"Traceback') and "ValueError: boom" in line
    assert json.loads(JsonLogFormatter().format(record))["err"].endswith("ValueError: boom")


# --- POSTTRAIN_* environment variables ------------------------------------------------------------------------------

def test_every_flag_has_a_variable_listed_in_the_cli_doc() -> None:
    parser = build_parser(environ={})
    commands = next(a for a in parser._actions if a.dest == "command").choices
    readme = (REPO / "docs" / "cli.md").read_text()
    flags = {(None, a.option_strings[0]) for a in parser._actions if a.option_strings
             and a.dest not in ("help", "version")}
    flags |= {(name, a.option_strings[0]) for name, cmd in commands.items() for a in cmd._actions
              if a.option_strings and a.dest != "help" and a.help != argparse.SUPPRESS}
    assert len(flags) > 20
    for command, flag in flags:
        var = env_name(command, flag)
        row = re.search(rf"^\|[^\n]*`{re.escape(flag)}[ `][^\n]*`{var}`", readme, re.M)
        assert row, f"docs/cli.md's flag table has no row for {flag} ({command or 'global'}) with {var}"


def test_report_output_format_and_its_older_name() -> None:
    """report's output is --output.format; its older --format still gives the output, with a warning naming the new
    flag, since every other command's --format pins the input's line format."""
    args = [str(TRL / "grpo" / "trainer_state.json")]
    new = run_cli("report", *args, "--output.format", "json")
    assert new.returncode == 0 and json.loads(new.stdout)["runs"], new.stderr
    assert b"--output.format" not in new.stderr
    old = run_cli("report", *args, "--format", "json")
    assert old.returncode == 0 and json.loads(old.stdout) == json.loads(new.stdout)
    assert b"say --output.format json" in old.stderr
    parser = build_parser(environ={})
    report = next(a for a in parser._actions if a.dest == "command").choices["report"]
    assert not re.search(r"(?<![.\w])--format\b", report.format_help())  # the old name is not offered
    assert "--output.format" in report.format_help()


def test_variables_fill_flags_and_the_command_line_wins() -> None:
    env = {"POSTTRAIN_LOG": " /logs/train.log, /logs/trainer_state.json,,", "POSTTRAIN_RUN": "grpo-7b",
           "POSTTRAIN_WEB_LISTEN_ADDRESS": "[::]:9900", "POSTTRAIN_NO_GPU": "TRUE", "POSTTRAIN_LOG_LEVEL": "debug",
           "POSTTRAIN_LOG_FORMAT": "json", "POSTTRAIN_FORMAT": "hf", "POSTTRAIN_REPORT_FORMAT": "json",
           "POSTTRAIN_LINGER": "2.5", "POSTTRAIN_STEPS_PER_SECOND": "40", "POSTTRAIN_ONCE": "yes"}
    args = build_parser(environ=env).parse_args(["serve"])
    assert (args.logs, args.run, args.listen_address, args.no_gpu, args.format, args.log_level, args.log_format) == \
        (["/logs/train.log", "/logs/trainer_state.json"], "grpo-7b", "[::]:9900", True, "hf", "debug", "json")
    assert set(args.from_env) >= {"POSTTRAIN_LOG", "POSTTRAIN_RUN", "POSTTRAIN_NO_GPU", "POSTTRAIN_LOG_LEVEL"}

    args = build_parser(environ=env).parse_args(["--log.level", "warn", "serve", "--log", "a.log", "--log", "b.log",
                                                 "--run", "x", "--listen-address", "127.0.0.1:1", "--log.format",
                                                 "logfmt"])
    assert (args.logs, args.run, args.listen_address, args.log_level, args.log_format) == \
        (["a.log", "b.log"], "x", "127.0.0.1:1", "warn", "logfmt")
    assert "POSTTRAIN_LOG" not in args.from_env and "POSTTRAIN_RUN" not in args.from_env

    args = build_parser(environ=env).parse_args(["report", "x.log"])  # report's --format is its own variable
    assert args.out_format == "json"
    args = build_parser(environ=env).parse_args(["run", "--", "python", "train.py"])
    assert (args.linger, args.child, args.logs) == (2.5, ["python", "train.py"],
                                                    ["/logs/train.log", "/logs/trainer_state.json"])
    args = build_parser(environ=env).parse_args(["demo"])
    assert (args.steps_per_second, args.once, args.listen_address) == (40.0, True, "[::]:9900")
    assert build_parser(environ={"POSTTRAIN_NO_GPU": "false"}).parse_args(["dump", "x"]).no_gpu is False
    assert build_parser(environ={"POSTTRAIN_NO_GPU": ""}).parse_args(["dump", "x"]).no_gpu is False  # empty: unset


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"POSTTRAIN_NO_GPU": "maybe"}, ["dump", "x.log"], "POSTTRAIN_NO_GPU='maybe': not a boolean"),
    ({"POSTTRAIN_LOG_LEVEL": "loud"}, ["dump", "x.log"], "POSTTRAIN_LOG_LEVEL='loud': choose from debug"),
    ({"POSTTRAIN_LOG_FORMAT": "xml"}, ["dump", "x.log"], "POSTTRAIN_LOG_FORMAT='xml': choose from logfmt, json"),
    ({"POSTTRAIN_STEPS_PER_SECOND": "fast"}, ["demo"], "POSTTRAIN_STEPS_PER_SECOND='fast': not a valid value"),
    ({"POSTTRAIN_WEB_LISTEN_ADDRESS": "localhost"}, ["serve", "--log", "x.log"],
     "POSTTRAIN_WEB_LISTEN_ADDRESS='localhost': 'localhost' is not HOST:PORT"),
    ({"POSTTRAIN_REPORT_FORMAT": "pdf"}, ["report", "x.log"], "POSTTRAIN_REPORT_FORMAT='pdf': choose from text"),
    ({"POSTTRAIN_CONFIG": "/nonexistent/exporter.yml"}, ["serve", "--log", "x.log"],
     "cannot read config /nonexistent/exporter.yml: No such file or directory (set from the environment: "
     "POSTTRAIN_CONFIG)"),
])
def test_a_bad_variable_stops_at_start_naming_it(env: dict[str, str], args: list[str], message: str) -> None:
    err = one_line_error(run_env(*args, env=env))
    assert message in err, err


def test_serve_configured_by_the_environment_alone(tmp_path) -> None:
    """The sidecar as a Kubernetes env: block would start it: `serve` and nothing else on its command line."""
    config = tmp_path / "exporter.yml"
    config.write_text(f"logs:\n  - path: {TRL / 'dpo' / 'trainer_state.json'}\n    run: dpo-from-config\n")
    port = free_port()
    env = {"POSTTRAIN_CONFIG": str(config), "POSTTRAIN_LOG": str(TRL / "grpo" / "trainer_state.json"),
           "POSTTRAIN_RUN": "grpo-from-env", "POSTTRAIN_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}",
           "POSTTRAIN_NO_GPU": "true", "POSTTRAIN_LOG_LEVEL": "debug", "POSTTRAIN_LOG_FORMAT": "json"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    proc = subprocess.Popen(exporter_cmd("serve"), cwd=REPO, env=clean | env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        body = scrape_until(port, lambda b: len(samples(b, "posttrain_step")) >= 2, proc, 30)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert samples(body, "posttrain_step") == {"grpo-from-env": 300.0, "dpo-from-config": 200.0}
    assert "posttrain_gpu_" not in body  # POSTTRAIN_NO_GPU: not even posttrain_gpu_nvml_up
    levels = {json.loads(line)["level"] for line in err.decode().splitlines()}  # JSON lines only, debug included
    assert "debug" in levels, err.decode()


# --- build_info -----------------------------------------------------------------------------------------------------

def test_build_info_has_version_and_python() -> None:
    res = run_cli("dump", "--no-gpu", str(TRL / "grpo" / "trainer_state.json"))
    info = [s for fam in text_string_to_metric_families(res.stdout.decode()) for s in fam.samples
            if s.name == "posttrain_exporter_build_info"]
    labels = {"version": __version__, "revision": "unknown", "python": platform.python_version()}
    assert [(s.labels, s.value) for s in info] == [(labels, 1.0)]
