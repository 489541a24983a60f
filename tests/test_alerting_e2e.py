"""End to end on loopback: the exporter serves a log that the test writes record by record from a real TRL
GRPO run; a real Prometheus scrapes it every second and evaluates rules/; a real Alertmanager, configured
from docs/alertmanager.example.yml with its receivers pointed at a webhook in this process, delivers the
page. A healthy log pages nobody; a KL blow-up pages within a bounded time; the KL warning of a run that is
being paged for KL is inhibited while a warning of another run reaches the chat receiver."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port, require_binary
from support.loopback import Processes, http_ready
from support.stack import Stack, Webhook, server_commands, write_configs
from support.stack import webhook as webhook_server

pytestmark = pytest.mark.e2e

RUN = "e2e-grpo"
HEALTHY = 100  # the first 100 records of the grpo run: KL stays under 0.3
PAGE_WITHIN_S = 30.0  # from the first blown-up record written to the page at the webhook
BLOWN_KL = "3.2"


def _grpo_records() -> list[str]:
    return [ln for ln in (TRL / "grpo" / "stdout.log").read_text().splitlines() if ln.startswith("{'loss'")]


# --- the stack ----------------------------------------------------------------------------------------------


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with webhook_server() as hook:
        yield hook


@pytest.fixture
def stack(tmp_path: Path, webhook: Webhook) -> Iterator[Stack]:
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    ports = {name: free_port() for name in ("exporter", "prometheus", "alertmanager")}
    log = tmp_path / "train.log"
    log.write_text("")
    # the repository's rules as they are; Alertmanager's waits in seconds (30s -> 1s)
    write_configs(tmp_path, ports, webhook, scrape_seconds=1.0, am_scale=1 / 30)
    with Processes(tmp_path, REPO) as procs:
        exporter = procs.start("exporter", exporter_cmd(
            "serve", "--log", str(log), "--run", RUN, "--listen-address", f"127.0.0.1:{ports['exporter']}"))
        servers = {name: procs.start(name, cmd) for name, cmd in server_commands(tmp_path, ports).items()}
        s = E2E(tmp_path, ports, log, procs)
        for name, p in servers.items():
            procs.wait(f"{name} ready", lambda n=name, p=p: p.poll() is None and http_ready(ports[n]), 20)
        yield s
        for name, p in {"exporter": exporter, **servers}.items():
            assert p.poll() is None, f"{name} exited with {p.returncode}\n{procs.tails()}"


@dataclass
class E2E(Stack):
    log: Path = Path()
    procs: Processes | None = None

    def wait(self, what: str, pred: Callable[[], Any], timeout: float) -> Any:
        assert self.procs is not None
        return self.procs.wait(what, pred, timeout)


# --- the test -------------------------------------------------------------------------------------------


def _write(log: Path, lines: list[str], per_write: int = 10, pause: float = 0.05) -> None:
    """Append like a trainer: a few records at a time."""
    for i in range(0, len(lines), per_write):
        with log.open("a") as f:
            f.write("".join(ln + "\n" for ln in lines[i:i + per_write]))
        time.sleep(pause)


def _pages(hook: Webhook, alertname: str) -> list[dict]:
    return [a for a in hook.alerts("pager") if a["labels"].get("alertname") == alertname
            and a["labels"].get("run") == RUN and a["status"] == "firing"]


def test_kl_blowup_pages_and_a_healthy_log_does_not(stack: E2E, webhook: Webhook) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    records = _grpo_records()

    # 1. A healthy stretch of a real GRPO run, record by record.
    _write(stack.log, records[:HEALTHY])
    stack.wait(f"Prometheus scraped step {HEALTHY}", lambda: stack.query(
        f'posttrain_step{{run="{RUN}"}} == {HEALTHY}'), 20)
    # The rules are loaded and evaluated on the exporter's series.
    stack.wait("rules loaded", lambda: [g for g in stack.prometheus("/api/v1/rules")["groups"]
                                        if g["name"] == "posttrain.pages" and g["rules"][0]["health"] == "ok"], 10)
    time.sleep(4)  # several evaluations and an Alertmanager group_wait after the last healthy record
    timings["healthy phase"] = time.monotonic() - t0
    critical = stack.query('ALERTS{severity="critical"}')
    assert critical == [], f"a healthy log raised a page: {critical}"
    assert webhook.alerts("pager") == [], "a healthy log paged"

    # 2. KL blows up: the next records of the run, with their KL above the critical threshold.
    blown = [re.sub(r"'kl': '[^']*'", f"'kl': '{BLOWN_KL}'", ln) for ln in records[HEALTHY:HEALTHY + 5]]
    assert all(f"'kl': '{BLOWN_KL}'" in ln for ln in blown)
    t_blowup = time.monotonic()
    _write(stack.log, blown, per_write=1)
    pages = stack.wait("the KL page at the pager webhook", lambda: _pages(webhook, "PostTrainKLCritical"),
                       PAGE_WITHIN_S)
    timings["blow-up to page"] = time.monotonic() - t_blowup
    page = pages[0]
    assert page["labels"]["severity"] == "critical"
    assert page["labels"]["job"] == "posttrain"
    assert page["annotations"]["runbook_url"].endswith("/docs/runbooks.md#posttrainklcritical")
    assert f"Run {RUN} at step" in page["annotations"]["description"]
    # The description says what the exporter's detector saw: the median KL of the last 5 logged steps.
    desc = page["annotations"]["description"]
    assert f"is {BLOWN_KL}, above the stop threshold of 1" in desc, desc
    # A page that says which checkpoint to keep reads the judgment's step by the page's run and instance.
    keep = f'posttrain_checkpoint_keep_step{{run="{RUN}",instance="{page["labels"]["instance"]}"}}'
    assert stack.query(keep), f"{keep}: no such series for a description to read"
    # Warnings go to the chat, pages never: the demo run's correctness reward never fires (its own warning).
    chat = webhook.alerts("chat")
    assert all(a["labels"]["severity"] == "warning" for a in chat), f"a page went to the chat receiver: {chat}"
    assert {a["labels"]["alertname"] for a in chat if a["labels"].get("run") == RUN} <= {
        "PostTrainRewardComponentSilent"}, chat

    # 3. The example's inhibition: the KL warning of the paged run is silenced, another run's warning is not.
    warning = {"severity": "warning", "instrument": "kl", "job": "posttrain"}
    stack.post_alerts([
        {"labels": {"alertname": "PostTrainKLWarning", "run": RUN, **warning},
         "annotations": {"summary": "inhibited by the page"}},
        {"labels": {"alertname": "PostTrainKLWarning", "run": "other-run", **warning},
         "annotations": {"summary": "reaches the chat"}},
    ])
    stack.wait("the other run's warning in the chat", lambda: [
        a for a in webhook.alerts("chat") if a["labels"]["run"] == "other-run"], 15)
    time.sleep(2)  # the inhibited one would have arrived by now (same group_wait, its own group)
    assert [a for a in webhook.alerts("chat") if a["labels"]["run"] == RUN
            and a["labels"]["alertname"] == "PostTrainKLWarning"] == []
    assert webhook.alerts("pager") and all(a["labels"]["severity"] == "critical" for a in webhook.alerts("pager"))
    timings["total"] = time.monotonic() - t0
    print("e2e timings (s):", {k: round(v, 1) for k, v in timings.items()})
    assert timings["total"] < 60, timings
