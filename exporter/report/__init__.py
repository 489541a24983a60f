"""The verdict on a finished (or running) run, from the same detectors as the live alerts: text, JSON, HTML."""

# The report command's choices, here so that the command line's options import none of the report's modules (nor the
# YAML and rules they use): every other command starts without them.
FORMATS = ("text", "json", "html")
FAIL_ON = ("critical", "warning")
