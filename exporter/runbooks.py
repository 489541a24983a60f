"""Where the runbooks live: the alert rules and the report's findings link here (a module of its own, so that
the command line's options do not import the rules generator)."""

RUNBOOK_BASE = "https://github.com/posttrain-exporter/posttrain-exporter/blob/main/docs/runbooks.md"
