"""The verdict on a finished (or running) run, from the same detectors as the live alerts: text, JSON, HTML."""
