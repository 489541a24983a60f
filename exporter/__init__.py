"""posttrain-exporter: trainer logs and NVML counters in, Prometheus metrics out.

Data flow (one package per stage):

    sources/      follow files, stdin, or replay the bundled log        -> text chunks
    console/      cut a console stream into lines, progress bars, clears -> lines + step clock
    parsers/      one line (or trainer_state.json) in, one Record out
    instruments/  per-run state: canonical instruments, histories, derived series
    exposition/   the Prometheus collector and the HTTP server
"""

__version__ = "0.1.0"
