"""Log lines as operators read them: text, or one JSON object per line.

``bulksync worker`` and ``bulksync coordinator`` call :func:`configure` with
``Settings.log_format`` (``BULKSYNC_LOG_FORMAT``). Log calls about a run pass its ids with
``extra=ids(...)``: a text line says them in its message, a JSON line also carries each as a
field of its own (``run_id``, ``thread_id``, ``step``, ``node``, ``task_id``), so a log
collector can follow one run or one task across the coordinator and every worker.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, Final

ID_FIELDS: Final = ("run_id", "thread_id", "step", "node", "task_id", "message_id")
"""The ids a record may carry (``extra=ids(...)``); a JSON line shows each that is set."""

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


def ids(
    *,
    run_id: str | None = None,
    thread_id: str | None = None,
    step: int | None = None,
    node: str | None = None,
    task_id: str | None = None,
    message_id: str | None = None,
) -> dict[str, Any]:
    """``extra=`` for a log call: the ids that are known, as fields of the record."""
    given = {
        "run_id": run_id,
        "thread_id": thread_id,
        "step": step,
        "node": node,
        "task_id": task_id,
        "message_id": message_id,
    }
    return {key: value for key, value in given.items() if value is not None and value != ""}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line (newlines in it are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as ``{"time", "level", "logger", "message", <ids>, "exc_info"?}``."""
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for field in ID_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(log_format: str, level: str | int) -> None:
    """Send every record at ``level`` or above to stderr, as ``log_format`` says.

    Replaces the root logger's handlers, so a library that configures logging only when the
    root has none (Celery's worker does) leaves these in place; warnings become records.
    """
    handler = logging.StreamHandler(sys.stderr)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # a library's warning is a line like any other


__all__ = ["ID_FIELDS", "JsonFormatter", "configure", "ids"]
