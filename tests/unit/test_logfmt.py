"""The log formatter behind ``--log-format`` (EXT-METRICS-2)."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from resource_controller import logfmt

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logfmt.formatter("json"))
    log = logging.getLogger("rc.test.logfmt")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        yield log, stream
    finally:
        log.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    out = stream.getvalue()
    assert out.endswith("\n")
    return [json.loads(line) for line in out.splitlines()]


def test_the_fixed_fields_and_extras(logger: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = logger
    log.warning("job %s: %s", "j1", "started", extra={"action": "job_start", "job_id": "j1"})
    [record] = lines(stream)
    assert RFC3339_UTC.match(str(record.pop("time")))
    assert record == {
        "level": "WARNING",
        "logger": "rc.test.logfmt",
        "message": "job j1: started",
        "action": "job_start",
        "job_id": "j1",
    }


def test_an_exception_is_one_string_field(logger: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = logger
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("it broke")
    [record] = lines(stream)  # the traceback's newlines stay inside the JSON string
    assert record["message"] == "it broke"
    assert record["level"] == "ERROR"
    exc = record["exc_info"]
    assert isinstance(exc, str)
    assert exc.startswith("Traceback") and "ValueError: bad\nthing" in exc


def test_non_ascii_and_unserialisable_extras(logger: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = logger
    log.info("gerät %s ✓", "ü", extra={"path": logfmt, "note": "日本"})
    [record] = lines(stream)
    assert record["message"] == "gerät ü ✓"
    assert record["note"] == "日本"
    assert "日本" in stream.getvalue()  # written as is, not \\u-escaped
    assert isinstance(record["path"], str)


def test_text_is_the_readable_default() -> None:
    fmt = logfmt.formatter("text")
    record = logging.LogRecord("rc.x", logging.INFO, __file__, 1, "hi %s", ("there",), None)
    assert fmt.format(record).endswith(" INFO rc.x: hi there")


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="xml"):
        logfmt.formatter("xml")


def test_configure_leaves_existing_handlers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    existing = logging.StreamHandler(sys.stderr)
    monkeypatch.setattr(root, "handlers", [existing])
    logfmt.configure("json", logging.INFO)
    assert root.handlers == [existing]
