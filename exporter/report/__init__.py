"""The verdict on a finished (or running) run, from the same detectors as the live alerts: text, JSON, HTML."""

# The report command's choices, here so that the command line's options import none of the report's modules (nor the
# YAML and rules they use): every other command starts without them.
FORMATS = ("text", "json", "html")
# --fail-on levels, loosest first: pages only; pages and a run that is not learning its task; any finding.
FAIL_ON = ("critical", "not_learning", "warning")
