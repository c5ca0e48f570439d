"""How the long-running processes (``rc serve``, ``rc worker``, ``rc up``) write their
logs under ``--log-format``: text, or JSON lines of ``time``, ``level``, ``logger``,
``message``, every ``extra`` field and ``exc_info``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The attributes every ``LogRecord`` has; anything else came from ``extra=``.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def formatter(fmt: str, text_format: str = TEXT_FORMAT) -> logging.Formatter:
    """The formatter for ``--log-format fmt``; ``ValueError`` for an unknown one."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(text_format)
    raise ValueError(f"unknown log format {fmt!r} (expected one of {', '.join(FORMATS)})")


def configure(
    fmt: str, level: int, text_format: str = TEXT_FORMAT, stream: TextIO | None = None
) -> None:
    """Like ``logging.basicConfig``: a stderr handler on the root logger, unless it has one."""
    handler_formatter = formatter(fmt, text_format)
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(handler_formatter)
    root.addHandler(handler)
    root.setLevel(level)


def say(log_format: str, message: str, level: str = "INFO", logger: str = "rc") -> None:
    """``rc: <message>`` for the person at the terminal, whatever the log level; under
    ``--log-format json`` a JSON record, so stderr stays all JSON."""
    if log_format != "json":
        print(f"rc: {message}", file=sys.stderr, flush=True)
        return
    levelno = logging.getLevelName(level)
    record = logging.makeLogRecord(
        {
            "name": logger,
            "msg": message,
            "levelname": level,
            "levelno": levelno if isinstance(levelno, int) else logging.INFO,
        }
    )
    print(JsonFormatter().format(record), file=sys.stderr, flush=True)
