"""The loop the GPU sampler, the trainer's GPU feed and the sidecar's feed reader share (exporter/periodic.py)."""

from __future__ import annotations

import itertools
import threading
import time

from exporter.periodic import Periodic


def test_a_slow_call_skips_the_ticks_it_missed_instead_of_bursting() -> None:
    at: list[float] = []

    def tick() -> None:
        at.append(time.monotonic())
        if len(at) == 2:
            time.sleep(0.25)  # five intervals

    loop = Periodic(tick, 0.05, "test-periodic")
    loop.start()
    deadline = time.monotonic() + 3.0
    while len(at) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.stop()
    assert len(at) >= 6
    after_slow = [b - a for a, b in itertools.pairwise(at[2:])]
    # made up in a burst, the four missed ticks would come back to back
    assert min(after_slow) > 0.03, after_slow
    assert at[2] - at[1] >= 0.25 + 0.03


def test_stop_wakes_the_wait_at_once_and_a_second_start_runs_again() -> None:
    calls: list[int] = []
    loop = Periodic(lambda: calls.append(1), 60.0, "test-periodic")
    assert loop.start() and not loop.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    assert loop.stop(timeout=5.0)
    assert time.monotonic() - t0 < 1.0 and not loop.running
    assert loop.start()  # the stop is cleared: it ticks again
    deadline = time.monotonic() + 2.0
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.stop() and len(calls) == 2


def test_a_call_stuck_past_the_timeout_is_left_running_and_said() -> None:
    release = threading.Event()
    loop = Periodic(lambda: release.wait(5.0), 0.01, "test-periodic")
    loop.start()
    time.sleep(0.05)
    assert loop.stop(timeout=0.1) is False
    assert loop.running  # the caller must not tear down what the call uses
    release.set()
    assert loop.stop(timeout=2.0) and not loop.running
