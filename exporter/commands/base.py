"""What every command shares: the program's name, its logger, and the error that stops a command at start."""

from __future__ import annotations

import logging

PROG = "posttrain-exporter"
log = logging.getLogger(PROG)


class UsageError(Exception):
    """A command line (or its environment) that cannot work: said in one line, exit 2."""
