"""The `posttrain-exporter` process (and `python -m exporter`): set up before the program loads, then cli.main().

A sidecar must not take CPU from its trainer: numpy's OpenBLAS starts a thread per core when it loads, and those
threads spun for about 0.1 s of CPU at every start (the exporter does no linear algebra worth a thread). So numpy
is loaded with one BLAS thread, and the variables that say so are removed again at once: a trainer that `run`
starts inherits the environment as it was."""

from __future__ import annotations

import gc
import os

_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def load_numpy_single_threaded() -> None:
    """Import numpy with one BLAS thread, unless the environment names a number; leave the environment as found."""
    added = [name for name in _BLAS_THREADS if name not in os.environ]
    os.environ.update(dict.fromkeys(added, "1"))
    try:
        import numpy  # noqa: F401  (BLAS reads its thread count once, when it loads)
    finally:
        for name in added:
            os.environ.pop(name, None)


def tune_gc() -> None:
    """The cyclic garbage collector, set for a process that makes records by the million and cycles hardly
    ever (refcounting frees them): what start-up loaded (modules, numpy, the catalog) is frozen out of every
    later collection, and the youngest generation is collected every 50,000 allocations instead of 700.
    Collections were 15-25% of `dump`'s time on a 200k-line log (bench/README.md)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def main() -> int:
    load_numpy_single_threaded()
    from exporter.cli import main as cli_main

    tune_gc()
    return cli_main()
