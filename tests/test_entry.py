"""The process `posttrain-exporter` runs in (exporter/entry.py): numpy's BLAS without a thread pool, and an
environment left as it was for a trainer that `run` starts."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import os
from exporter.entry import load_numpy_single_threaded
load_numpy_single_threaded()
print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))
"""


def _probe(env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_numpy_loads_without_blas_threads_and_the_environment_is_left_as_found() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                            "MKL_NUM_THREADS")}
    assert os.cpu_count() and os.cpu_count() > 1, "OpenBLAS starts no pool on one core: nothing to check here"
    threads, openblas, omp = _probe(env)
    assert threads == "1"  # plain `import numpy` starts a BLAS thread per further core
    assert (openblas, omp) == ("None", "None")  # a trainer started by `run` inherits no thread limit


def test_a_thread_count_the_environment_names_is_kept() -> None:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "3"}
    threads, openblas, omp = _probe(env)
    assert (openblas, omp) == ("2", "3") and threads == "2"
