"""The Grafana 10+ boards in grafana/ (one per method, plus GPU), generated from plain dicts.

    builders.py   the run selector, queries, panels, variables and the layout, written once
    panels.py     panels several boards show (step, detectors, the regime, fundamentals)
    grpo.py, ppo.py, dpo.py, sft.py, gpu.py   one board each

`python scripts/gen_dashboards.py [--check]` writes (or checks) grafana/*.json from `render()`. The panel layout
puts what decides a run first: GRPO's primary / secondary / tertiary rows (reward std, reward and KL; length,
clipping and entropy; reward components and the loss), reward, KL and clipping first for PPO and DPO, the
fundamentals for SFT, the GPU's phases. Thresholds are drawn from the exported posttrain_threshold series: the
run's own values (the defaults unless the run's config overrides them).

A generator, like exporter/alerting/rules.py: nothing on the exporter's serve path imports it."""

from __future__ import annotations

import json
from collections.abc import Callable

from exporter.dashboards import dpo, gpu, grpo, ppo, sft

BOARDS: dict[str, Callable[[], dict]] = {"grpo": grpo.grpo, "ppo": ppo.ppo, "dpo": dpo.dpo, "sft": sft.sft,
                                         "gpu": gpu.gpu}
# Queries that may legitimately return nothing on the fixtures: (dashboard uid, panel title, refId) -> why.
OPTIONAL: dict[tuple[str, str, str], str] = {**grpo.OPTIONAL}


def render() -> dict[str, str]:
    """{file name in grafana/: its text}."""
    return {f"{name}.json": json.dumps(build(), indent=2, sort_keys=False) + "\n" for name, build in BOARDS.items()}
