"""Where the runbooks live: the alert rules and the report's findings link here (a module of its own, so that
the command line's options do not import the rules generator)."""

from exporter.buildinfo import DOCS

# This version's runbooks: the alerts of a release link to the text written for them.
RUNBOOK_BASE = f"{DOCS}/runbooks.md"
