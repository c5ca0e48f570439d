"""The sans-I/O core of ``h1``: what a request puts on the wire, how an answer is read,
when a connection may carry another request, and how each failure is named.

The bytes the core writes are read back by h11's server side, and the answers it reads
are bytes written here, so both directions are checked without a socket.
"""

from __future__ import annotations

import h11
import pytest

from resource_controller import errors
from resource_controller.h1 import core

END = core.Endpoint("http", "c.test", 8080, "/rc")


def served(sent: bytes) -> list[object]:
    """The events h11's server side reads from ``sent``."""
    server = h11.Connection(h11.SERVER)
    server.receive_data(sent)
    events: list[object] = []
    while (event := server.next_event()) is not h11.NEED_DATA:
        events.append(event)
        if isinstance(event, h11.EndOfMessage):
            break
    return events


def answer(wire: core.Wire, raw: bytes, *more: bytes) -> list[core.Head | bytes]:
    """Everything ``wire`` reads from ``raw`` (then each of ``more``, ``b""`` for EOF)."""
    got: list[core.Head | bytes] = []
    feeds = [raw, *more]
    while True:
        item = wire.next()
        if item is None:
            if not feeds:
                return got
            wire.feed(feeds.pop(0))
            continue
        got.append(item)
        if item == core.END:
            return got


def test_a_request_with_a_body_and_one_without() -> None:
    wire = core.Wire(END.authority)
    request, data, end = served(wire.start("POST", "/rc/v1/jobs", [(b"X-A", b"1")], b'{"a":1}'))
    assert isinstance(request, h11.Request) and request.target == b"/rc/v1/jobs"
    fields = dict(request.headers)
    assert fields[b"host"] == b"c.test:8080"
    assert fields[b"content-length"] == b"7" and fields[b"x-a"] == b"1"
    assert isinstance(data, h11.Data) and data.data == b'{"a":1}'
    assert isinstance(end, h11.EndOfMessage)
    # A POST without a body says so (as http.client); a GET says nothing.
    bare = served(core.Wire(END.authority).start("POST", "/x", []))
    assert dict(bare[0].headers)[b"content-length"] == b"0"  # type: ignore[attr-defined]
    get = served(core.Wire(b"h").start("GET", "/x", []))
    assert b"content-length" not in dict(get[0].headers)  # type: ignore[attr-defined]


def test_the_host_header_leaves_out_the_default_port() -> None:
    assert core.Endpoint("https", "c.test", 443, "").authority == b"c.test"
    assert core.Endpoint("http", "::1", 80, "").authority == b"[::1]"
    assert core.endpoint("https://c.test:8443/rc/") == ("https", "c.test", 8443, "/rc")
    with pytest.raises(ValueError, match="is not an http"):
        core.endpoint("c.test:8080")


def test_full_duplex_the_answer_is_read_while_the_body_is_still_open() -> None:
    """The relay: a chunked body written piece by piece, its 200 read before it ends."""
    wire = core.Wire(END.authority)
    sent = wire.start("POST", "/tty/out", [], open_body=True)
    sent += wire.write(b"first")
    head, piece = answer(wire, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nkey\r\n")
    assert isinstance(head, core.Head) and head.status == 200
    assert piece == b"key"
    sent += wire.write(b"second") + wire.finish()
    assert wire.finish() == b""  # ended once
    events = served(sent)
    assert dict(events[0].headers)[b"transfer-encoding"] == b"chunked"  # type: ignore[attr-defined]
    assert [e.data for e in events if isinstance(e, h11.Data)] == [b"first", b"second"]
    assert isinstance(events[-1], h11.EndOfMessage)


@pytest.mark.parametrize(
    ("raw", "body", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", b"ok", True),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"ok",
            True,
        ),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
    ],
    ids=["sized", "204", "chunked", "interim-100", "connection-close", "http-1.0"],
)
def test_keep_alive_follows_the_answer(raw: bytes, body: bytes, reusable: bool) -> None:
    wire = core.Wire(b"h")
    wire.start("GET", "/x", [])
    head, *pieces = answer(wire, raw)
    assert isinstance(head, core.Head) and head.status in (200, 204)
    assert b"".join(p for p in pieces if isinstance(p, bytes)) == body
    assert wire.recycle() is reusable
    if reusable:  # the next request goes on the same connection
        assert served(wire.start("GET", "/y", []))[0].target == b"/y"  # type: ignore[attr-defined]


def test_an_answer_framed_by_the_end_of_the_connection_is_read_whole_and_ends_it() -> None:
    wire = core.Wire(b"h")
    wire.start("GET", "/x", [])
    got = answer(wire, b"HTTP/1.1 200 OK\r\n\r\nall ", b"of it", b"")
    assert b"".join(p for p in got[1:] if isinstance(p, bytes)) == b"all of it"
    assert not wire.recycle()


def test_repeated_fields_are_joined_and_names_lowercased() -> None:
    wire = core.Wire(b"h")
    wire.start("GET", "/x", [])
    head = answer(wire, b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n")[0]
    assert isinstance(head, core.Head)
    assert head.headers["x-a"] == "1, 2" and head.reason == "OK"


def test_each_failure_says_whether_an_answer_was_lost() -> None:
    wire = core.Wire(b"h")
    wire.start("GET", "/x", [])
    with pytest.raises(errors.Disconnected, match="without answering"):
        answer(wire, b"")  # nothing came: an idle connection the server had closed
    wire = core.Wire(b"h")
    wire.start("GET", "/x", [])
    with pytest.raises(errors.AnswerLost, match="mid-response"):
        answer(wire, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b"")
    wire = core.Wire(b"h")
    wire.start("GET", "/x", [])
    with pytest.raises(errors.AnswerLost, match="unreadable answer"):
        answer(wire, b"garbage\r\n\r\n")


def test_an_illegal_header_value_never_quotes_it() -> None:
    """A token with a line break cannot be sent; the error must not carry the token."""
    wire = core.Wire(b"h")
    with pytest.raises(errors.TransportError) as info:
        wire.start("GET", "/x", [(b"Authorization", b"Bearer sec\r\nret")])
    assert "sec" not in str(info.value) and "not legal" in str(info.value)
    assert core.bearer("") == "Bearer" and core.bearer("t") == "Bearer t"


@pytest.mark.parametrize(
    ("url", "environ", "named"),
    [
        ("http://c.test", {}, ""),
        ("http://c.test", {"http_proxy": "http://p:3128"}, "http_proxy"),
        ("http://c.test", {"HTTP_PROXY": "http://p:3128", "http_proxy": "x"}, "HTTP_PROXY"),
        ("http://c.test", {"HTTPS_PROXY": "http://p:3128"}, ""),
        ("https://c.test", {"HTTPS_PROXY": "http://p:3128"}, "HTTPS_PROXY"),
        ("https://c.test", {"all_proxy": "socks5://p"}, "all_proxy"),
        ("http://c.test", {"http_proxy": "http://p", "NO_PROXY": "other, c.test"}, ""),
        ("http://a.c.test", {"http_proxy": "http://p", "no_proxy": ".c.test"}, ""),
        ("http://c.test:8080", {"http_proxy": "http://p", "no_proxy": "c.test:8080"}, ""),
        ("http://c.test", {"http_proxy": "http://p", "no_proxy": "*"}, ""),
        ("http://notc.test", {"http_proxy": "http://p", "no_proxy": "c.test"}, "http_proxy"),
    ],
)
def test_a_proxy_meant_for_a_url_is_named(url: str, environ: dict[str, str], named: str) -> None:
    refusal = core.proxy_refusal(core.endpoint(url), environ)
    assert refusal.startswith(f"{named} is set, ") if named else refusal == ""


def test_an_error_body_reads_as_code_and_message() -> None:
    assert core.error_body(b'{"error": "not_found", "message": "no job"}') == (
        "not_found",
        "no job",
    )
    assert core.error_body(b"<html>") == ("", "")
    assert core.error_body(b'["x"]') == ("", "")
