"""posttrain-exporter: trainer logs and NVML counters in, Prometheus metrics out.

Data flow (one package per stage):

    sources/      follow files, stdin, a child's output, a pod's log    -> text chunks
                  (sources/inputs.py: each source's adapter into the run)
    console/      cut a console stream into lines, progress bars, clears -> lines + step clock
    parsers/      one line (or trainer_state.json) in, one Record out
    pipeline.py   one console stream: frame -> parse -> step -> the run
    runstate.py   one run's state, driving both of:
      instruments/  canonical instruments, histories, derived series
      detectors/    the judgments the alerts, the report and early stop read
    gpu/          NVML sampling and the generation/training phase
    exposition/   the Prometheus collector and the HTTP server
    report/       verdicts of finished or running runs
"""

from exporter.buildinfo import VERSION as __version__

__all__ = ["__version__"]
