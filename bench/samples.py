"""What reading the printed completions costs: a real GRPO log with TRL's completion tables
(tests/fixtures/corpus/grpo_template_collapse, 200 steps x 16 rows) read to its end in process, with the sample tap
(exporter/samples) and with it switched off (its reader sees no line), alternated, best of N each.

usage: python bench/samples.py [N]   prints both times, their ratio and the per-set cost; name the machine with it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.app import Exporter  # noqa: E402
from exporter.config import Config, LogSpec  # noqa: E402
from exporter.samples.reader import SampleReader  # noqa: E402

LOG = REPO / "tests" / "fixtures" / "corpus" / "grpo_template_collapse" / "combined.log"


def read_once() -> tuple[float, int]:
    ex = Exporter(Config(), [LogSpec(str(LOG), "r")])
    t = time.perf_counter()
    ex.read_to_end()
    ex.runs["r"].refresh()
    return time.perf_counter() - t, ex.runs["r"].samples.total_sets


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    line = SampleReader.line
    on, off, sets = [], [], 0
    for _ in range(n):
        SampleReader.line = line  # type: ignore[method-assign]
        secs, sets = read_once()
        on.append(secs)
        SampleReader.line = lambda self, text: None  # type: ignore[method-assign,assignment]
        off.append(read_once()[0])
    SampleReader.line = line  # type: ignore[method-assign]
    a, b = min(on), min(off)
    print(f"{LOG.name} ({LOG.stat().st_size / 1e6:.2f} MB, {sets} sets): with samples {a * 1e3:.1f} ms, without "
          f"{b * 1e3:.1f} ms, ratio {a / b:.2f}, {(a - b) / max(sets, 1) * 1e6:.0f} us per set")


if __name__ == "__main__":
    main()
