"""A real SFT training on CPU whose ExporterFeedCallback also samples the trainer's GPUs into a GPU feed, the GPUs
being the fake NVML's (tests/fake_nvml.py): two GPUs alternating a training and a generation power level.
Run by tests/test_gpu_sources.py as a subprocess:

    python gpu_feed_train.py MODEL_DIR OUT_DIR --feed FEED --gpu-feed GPU_FEED"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")]

INTERVAL = 0.5  # the callback's GPU sampling interval: its lower bound


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--feed", required=True)
    p.add_argument("--gpu-feed", required=True)
    a = p.parse_args()
    import torch
    from fake_nvml import FakeGpu, FakeNvml
    from trl_train import sft

    from exporter.integrations.trl import ExporterFeedCallback

    torch.set_num_threads(1)
    nvml = FakeNvml([FakeGpu("GPU-feed-0", utilization=[100] * 4 + [97] * 4, power_mw=[300_000] * 4 + [150_000] * 4),
                     FakeGpu("GPU-feed-1", utilization=[98] * 4 + [100] * 4, power_mw=[140_000] * 4 + [320_000] * 4)])
    stop = threading.Event()

    def ticks() -> None:  # the fake's traces move on in time, cyclically
        while not stop.wait(INTERVAL):
            nvml.advance()
            if nvml.tick >= 8:
                nvml.tick = 0

    threading.Thread(target=ticks, daemon=True).start()
    callback = ExporterFeedCallback(a.feed, gpu_feed=a.gpu_feed, gpu_interval_seconds=0.1, gpu_nvml=nvml)
    a.max_steps, a.logging_steps, a.eval_steps = 30, 5, 10
    trainer = sft(a, callback)
    # a step takes at least 0.1 s, as a GPU step would take longer still: the training lasts several sampling
    # intervals however fast this machine's CPU steps are (a tiny model's step can take a few ms)
    from transformers import TrainerCallback

    class _Pace(TrainerCallback):
        def on_step_end(self, *args, **kwargs) -> None:
            stop.wait(0.1)

    trainer.add_callback(_Pace())
    trainer.train()
    stop.set()


if __name__ == "__main__":
    main()
