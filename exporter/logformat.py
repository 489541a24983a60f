"""The exporter's own log: logfmt or JSON lines on standard error, as Prometheus' exporters write them."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

LOG_LEVELS = ("debug", "info", "warn", "warning", "error")  # warn as Prometheus' exporters spell it
LOG_FORMATS = ("logfmt", "json")
_LEVEL_NAMES = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}
_LOGFMT_PLAIN = re.compile(r"^[^\s=\"\\]+$")


def _log_fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    fields = {"ts": ts, "level": _LEVEL_NAMES.get(record.levelname, record.levelname.lower()),
              "logger": record.name, "caller": f"{record.filename}:{record.lineno}", "msg": record.getMessage()}
    if record.exc_info:
        fields["err"] = formatter.formatException(record.exc_info)
    return fields


class LogfmtFormatter(logging.Formatter):
    """`ts=2026-01-02T03:04:05.678Z level=info logger=posttrain-exporter caller=cli.py:12 msg="..."`, as the
    exporters built on Prometheus' go-kit/slog log."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={v if _LOGFMT_PLAIN.match(v) else json.dumps(v, ensure_ascii=False)}"
                        for k, v in _log_fields(record, self).items())


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, the same fields as logfmt (for log pipelines that parse JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_log_fields(record, self), ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()  # standard error: standard output may carry the trainer's output (run)
    handler.setFormatter(JsonLogFormatter() if fmt == "json" else LogfmtFormatter())
    logging.basicConfig(level="WARNING" if level == "warn" else level.upper(), handlers=[handler], force=True)
    # the file watcher's own debug lines (every inotify event) say nothing about the exporter: its warnings only
    logging.getLogger("watchdog").setLevel(logging.WARNING)
