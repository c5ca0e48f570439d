"""The HTTP/1.1 format rules the three hand-driven connections share (``http1``)."""

from __future__ import annotations

import pytest

from resource_controller import http1


def test_a_request_head_ends_with_the_blank_line() -> None:
    head = http1.request_head(
        "POST", "/v1/jobs?x=1", [(b"Host", b"h:1"), (b"Content-Length", b"2")]
    )
    assert head == b"POST /v1/jobs?x=1 HTTP/1.1\r\nHost: h:1\r\nContent-Length: 2\r\n\r\n"


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        (b"HTTP/1.1 200 OK\r\n", (11, 200, "OK")),
        (b"HTTP/1.0 404 Not Found\r\n", (10, 404, "Not Found")),
        (b"HTTP/1.1 204\r\n", (11, 204, "")),
    ],
)
def test_status_lines(line: bytes, parsed: tuple[int, int, str]) -> None:
    assert http1.status_line(line) == parsed


@pytest.mark.parametrize(
    "line", [b"", b"garbage\r\n", b"HTTP/2 200 OK\r\n", b"HTTP/1.1 20 OK\r\n", b"HTTP/1.1 2x0\r\n"]
)
def test_a_malformed_status_line_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(http1.ProtocolError):
        http1.status_line(line)


def test_a_head_joins_repeated_fields_and_keeps_the_raw_lines() -> None:
    head = http1.Head()
    lines = [b"Content-Type: a\r\n", b"X-A: 1\r\n", b"x-a: 2\r\n", b"\r\n"]
    assert [head.feed(line) for line in lines] == [False, False, False, True]
    assert head.fields == {"content-type": "a", "x-a": "1, 2"}
    assert head.raw == [(b"Content-Type", b"a"), (b"X-A", b"1"), (b"x-a", b"2")]


@pytest.mark.parametrize(
    "line",
    [b"no colon\r\n", b": no name\r\n", b"Cut-Off: val", b"X: " + b"y" * http1.MAX_LINE + b"\r\n"],
    ids=["no-colon", "no-name", "cut", "too-long"],
)
def test_a_malformed_header_line_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(http1.ProtocolError):
        http1.Head().feed(line)


def test_too_many_header_lines_are_refused() -> None:
    head = http1.Head()
    for i in range(http1.MAX_HEADERS):
        head.feed(b"X-%d: 1\r\n" % i)
    with pytest.raises(http1.ProtocolError, match="more than"):
        head.feed(b"X-last: 1\r\n")


@pytest.mark.parametrize(
    ("method", "version", "status", "fields", "length", "chunked", "keep_alive"),
    [
        ("GET", 11, 200, {"content-length": "5"}, 5, False, True),
        ("GET", 11, 200, {"transfer-encoding": "chunked"}, None, True, True),
        ("GET", 11, 200, {}, None, False, False),  # to the end of the connection
        ("GET", 11, 204, {"content-length": "9"}, 0, False, True),
        ("HEAD", 11, 200, {"content-length": "9"}, 0, False, True),
        ("GET", 11, 200, {"content-length": "2", "connection": "close"}, 2, False, False),
        ("GET", 10, 200, {"content-length": "2"}, 2, False, False),
        ("GET", 10, 200, {"content-length": "2", "connection": "keep-alive"}, 2, False, True),
    ],
    ids=["sized", "chunked", "to-close", "204", "head", "close", "1.0", "1.0-keep-alive"],
)
def test_framing(
    method: str,
    version: int,
    status: int,
    fields: dict[str, str],
    length: int | None,
    chunked: bool,
    keep_alive: bool,
) -> None:
    framing = http1.Framing(method, version, status, fields)
    assert (framing.length, framing.chunked, framing.keep_alive) == (length, chunked, keep_alive)


@pytest.mark.parametrize("value", ["ten", "-1"])
def test_a_bad_content_length_is_a_protocol_error(value: str) -> None:
    with pytest.raises(http1.ProtocolError, match="Content-Length"):
        http1.Framing("GET", 11, 200, {"content-length": value})


def test_chunk_sizes() -> None:
    assert http1.chunk_size(b"1a\r\n") == 26
    assert http1.chunk_size(b"3;ext=1\r\n") == 3
    assert http1.chunk_size(b"0\r\n") == 0
    with pytest.raises(http1.IncompleteRead):
        http1.chunk_size(b"")
    with pytest.raises(http1.ProtocolError):
        http1.chunk_size(b"zz\r\n")


@pytest.mark.parametrize(
    ("body", "parsed"),
    [
        (b'{"error": "not_found", "message": "no job x"}', ("not_found", "no job x")),
        (b'{"error": "conflict"}', ("conflict", "")),
        (b'{"error": 3, "message": []}', ("", "")),
        (b"[1]", ("", "")),
        (b"<html>", ("", "")),
        (b"", ("", "")),
    ],
)
def test_error_bodies(body: bytes, parsed: tuple[str, str]) -> None:
    assert http1.error_body(body) == parsed
