"""The `posttrain-exporter` process (and `python -m exporter`): set up before the program loads, then cli.main().

A sidecar must not take CPU from its trainer: numpy's OpenBLAS starts a thread per core when it loads, and those
threads spun for about 0.1 s of CPU at every start (the exporter does no linear algebra worth a thread). So numpy
is loaded with one BLAS thread, and the variables that say so are removed again at once: a trainer that `run`
starts inherits the environment as it was."""

from __future__ import annotations

import contextlib
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


_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def one_malloc_arena() -> None:
    """glibc gives a thread that allocates while another does an arena of its own (up to eight per core), and
    memory freed in one arena serves no other: in `serve`, a scrape's thread judging a catch-up's waiting batches
    while the reader parsed took peak RSS from 69 to 107 MiB (bench/README.md). One arena: the GIL serialises
    nearly every allocation anyway. Other C libraries (musl) keep one heap and are left alone."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), an unknown name (macOS), EINVAL (musl)
        return
    if not glibc:
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # a C library without mallopt: nothing to set
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)


def tune_gc() -> None:
    """The cyclic garbage collector, set for a process that makes records by the million and cycles hardly
    ever (refcounting frees them): what start-up loaded (modules, numpy, the catalog) is frozen out of every
    later collection, and the youngest generation is collected every 50,000 allocations instead of 700.
    Collections were 15-25% of `dump`'s time on a 200k-line log (bench/README.md)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def main() -> int:
    one_malloc_arena()  # before any thread starts
    load_numpy_single_threaded()
    from exporter.cli import main as cli_main

    tune_gc()
    return cli_main()
