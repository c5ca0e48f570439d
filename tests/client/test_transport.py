"""The stdlib HTTP transport against a scripted server (CLI-042, CLI-043, CLI-070)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from resource_controller import errors
from resource_controller.client import transport
from resource_controller.client.calls import Call

Handler = Callable[[BaseHTTPRequestHandler], None]


class Stub:
    """A tiny HTTP/1.1 server: each test maps ``METHOD path`` to a handler."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.seen: list[dict[str, Any]] = []
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                stub.seen.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body,
                        "peer": self.client_address,
                    }
                )
                route = stub.routes.get(f"{self.command} {self.path.split('?')[0]}")
                if route is None:
                    send(self, 404, b"nope", "text/plain")
                else:
                    route(self)

            do_GET = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def send(
    h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "application/json"
) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def send_json(h: BaseHTTPRequestHandler, status: int, value: Any) -> None:
    send(h, status, json.dumps(value).encode())


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    try:
        yield s
    finally:
        s.close()


def test_every_request_carries_bearer_and_json_type(stub: Stub) -> None:
    stub.routes["GET /v1/state"] = lambda h: send_json(h, 200, {"devices": []})
    stub.routes["POST /v1/jobs"] = lambda h: send_json(h, 201, {"id": "j"})
    t = transport.Transport(stub.url, "")
    assert t.request(Call("GET", "/v1/state")) == {"devices": []}
    assert t.request(Call("POST", "/v1/jobs", body={"a": 1})) == {"id": "j"}
    for seen in stub.seen:
        assert seen["headers"]["Authorization"] == "Bearer"  # sent even when empty
        assert seen["headers"]["Content-Type"] == "application/json"
    assert json.loads(stub.seen[1]["body"]) == {"a": 1}


def test_error_body_becomes_code_and_message(stub: Stub) -> None:
    stub.routes["GET /v1/jobs/x"] = lambda h: send_json(
        h, 404, {"error": "not_found", "message": "no job x"}
    )
    with pytest.raises(errors.ApiError) as info:
        transport.Transport(stub.url, "t").request(Call("GET", "/v1/jobs/x"))
    assert str(info.value) == "not_found: no job x"
    assert info.value.status == 404 and info.value.code == "not_found"


def _refuse_every_token(h: BaseHTTPRequestHandler) -> None:
    send_json(h, 401, {"error": "unauthorized", "message": "a valid bearer token is required"})


def test_an_empty_token_refused_says_where_rc_looked(stub: Stub) -> None:
    # CLI-011: the controller refuses an empty token; the client adds where it looked.
    stub.routes["GET /v1/state"] = _refuse_every_token
    stub.routes["GET /v1/jobs/j/logs"] = _refuse_every_token
    looked = "no token was found: RC_TOKEN is not set and /h/c.yaml does not exist"
    t = transport.Transport(stub.url, "", missing_token=lambda: looked)
    with pytest.raises(errors.Unauthorized) as info:
        t.request(Call("GET", "/v1/state"))
    assert str(info.value) == f"unauthorized: a valid bearer token is required; {looked}"
    with pytest.raises(errors.Unauthorized) as info:
        t.stream(Call("GET", "/v1/jobs/j/logs"))
    assert looked in str(info.value)
    # A token that was sent and refused is another problem: nothing is added.
    sent = transport.Transport(stub.url, "wrong", missing_token=lambda: looked)
    with pytest.raises(errors.Unauthorized) as info:
        sent.request(Call("GET", "/v1/state"))
    assert "no token" not in str(info.value)


def test_the_async_transport_says_it_too(stub: Stub) -> None:
    import asyncio

    from resource_controller.client.aio_transport import AsyncTransport

    stub.routes["GET /v1/state"] = _refuse_every_token

    async def ask(token: str) -> str:
        t = AsyncTransport(stub.url, token, missing_token=lambda: "no token was found: here")
        try:
            await t.request(Call("GET", "/v1/state", timeout=10))
        except errors.Unauthorized as e:
            return str(e)
        finally:
            await t.aclose()
        raise AssertionError("not refused")

    assert asyncio.run(ask("")).endswith("; no token was found: here")
    assert "no token" not in asyncio.run(ask("t"))


def test_clients_ask_the_settings_only_for_a_token_they_read_there(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resource_controller.client import api, config

    stub.routes["GET /v1/state"] = _refuse_every_token
    monkeypatch.setenv("RC_CONTROLLER", stub.url)
    config.reset()
    with pytest.raises(errors.Unauthorized) as info:
        api.JsonClient().state(timeout=10)
    assert "no token was found: RC_TOKEN is not set" in str(info.value)
    with pytest.raises(errors.Unauthorized) as info:
        api.JsonClient(stub.url, "").state(timeout=10)  # given by the caller: rc did not look
    assert "no token" not in str(info.value)


@pytest.mark.parametrize(
    ("status", "body", "text"),
    [
        (502, b"<html>bad gateway</html>", "controller returned 502 Bad Gateway"),
        (500, b'{"detail": "oops"}', "controller returned 500 Internal Server Error"),
        (503, b"", "controller returned 503 Service Unavailable"),
    ],
)
def test_non_json_errors_name_the_status(stub: Stub, status: int, body: bytes, text: str) -> None:
    stub.routes["GET /v1/state"] = lambda h: send(h, status, body, "text/html")
    with pytest.raises(errors.ApiError) as info:
        transport.Transport(stub.url, "t").request(Call("GET", "/v1/state"))
    assert str(info.value) == text


def test_connection_is_kept_alive(stub: Stub) -> None:
    stub.routes["GET /v1/state"] = lambda h: send_json(h, 200, {})
    t = transport.Transport(stub.url, "t")
    for _ in range(3):
        t.request(Call("GET", "/v1/state"))
    assert len({s["peer"] for s in stub.seen}) == 1


def test_stale_kept_alive_connection_is_replaced(stub: Stub) -> None:
    def close_after(h: BaseHTTPRequestHandler) -> None:
        send_json(h, 200, {})
        h.close_connection = True  # without saying so: the idle-timeout case

    stub.routes["GET /v1/state"] = close_after
    t = transport.Transport(stub.url, "t")
    t.request(Call("GET", "/v1/state"))
    time.sleep(0.05)
    t.request(Call("GET", "/v1/state"))  # the first attempt hits the closed socket
    assert len(stub.seen) == 2


def test_refused_names_request_and_cause() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = transport.Transport(f"http://127.0.0.1:{port}", "t")
    with pytest.raises(errors.TransportError) as info:
        t.request(Call("POST", "/v1/jobs", body={}))
    assert str(info.value) == f"POST http://127.0.0.1:{port}/v1/jobs: connection refused"


def test_per_request_timeout(stub: Stub) -> None:
    def slow(h: BaseHTTPRequestHandler) -> None:
        time.sleep(1.0)
        with contextlib.suppress(OSError):
            send_json(h, 200, {})

    stub.routes["GET /v1/state"] = slow
    t = transport.Transport(stub.url, "t")
    start = time.monotonic()
    with pytest.raises(errors.TransportError, match="timed out"):
        t.request(Call("GET", "/v1/state", timeout=0.2))
    assert time.monotonic() - start < 0.9


def test_failover_to_the_next_url(stub: Stub) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    stub.routes["GET /v1/state"] = lambda h: send_json(h, 200, {"ok": True})
    t = transport.Transport(f"{dead}, {stub.url}/", "t")
    assert t.request(Call("GET", "/v1/state")) == {"ok": True}
    assert t.base_url == stub.url


def test_a_5xx_moves_to_the_next_url_and_a_read_is_sent_there(stub: Stub) -> None:
    other = Stub()
    try:
        stub.routes["GET /v1/state"] = lambda h: send_json(h, 503, {"error": "unavailable"})
        stub.routes["POST /v1/jobs"] = lambda h: send_json(h, 500, {"error": "internal"})
        other.routes["GET /v1/state"] = lambda h: send_json(h, 200, {"ok": True})
        t = transport.Transport(f"{stub.url},{other.url}", "t")
        assert t.request(Call("GET", "/v1/state")) == {"ok": True}  # EXT-PG-5
        assert t.base_url == other.url
        t = transport.Transport(f"{stub.url},{other.url}", "t")
        with pytest.raises(errors.ApiError):  # a write is never sent twice
            t.request(Call("POST", "/v1/jobs", body={}))
        assert t.base_url == other.url and len(other.seen) == 1
    finally:
        other.close()


def frozen(h: BaseHTTPRequestHandler) -> None:
    """A controller that took the connection and stopped (SIGSTOP, a stalled host)."""
    time.sleep(3)


def test_a_controller_that_does_not_answer_is_left_for_the_next(stub: Stub) -> None:
    # EXT-PG-5: each controller gets the request's bound; a read then goes to the next
    # URL, and the requests after it stay there.
    other = Stub()
    try:
        stub.routes["GET /v1/state"] = frozen
        other.routes["GET /v1/state"] = lambda h: send_json(h, 200, {"ok": True})
        t = transport.Transport(f"{stub.url},{other.url}", "t")
        start = time.monotonic()
        assert t.request(Call("GET", "/v1/state", timeout=0.3)) == {"ok": True}
        assert time.monotonic() - start < 2
        assert t.base_url == other.url
        assert t.request(Call("GET", "/v1/state", timeout=0.3)) == {"ok": True}
        assert len(stub.seen) == 1 and len(other.seen) == 2
    finally:
        other.close()


def test_a_write_that_got_no_answer_is_resent_only_when_it_is_safe(stub: Stub) -> None:
    other = Stub()
    try:
        stub.routes["POST /v1/jobs"] = frozen
        other.routes["POST /v1/jobs"] = lambda h: send_json(h, 201, {"id": "j"})
        t = transport.Transport(f"{stub.url},{other.url}", "t")
        with pytest.raises(errors.TimedOut):  # it may have acted: never sent twice
            t.request(Call("POST", "/v1/jobs", body={}, timeout=0.3))
        assert other.seen == []
        # A submit with its idempotency key is the same request wherever it lands.
        assert t.request(Call("POST", "/v1/jobs", body={}, timeout=0.3, resend=True)) == {"id": "j"}
        assert t.base_url == other.url
    finally:
        other.close()


def test_a_request_without_a_bound_of_its_own_is_bounded(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "REQUEST_BOUND", 0.3)
    stub.routes["GET /v1/state"] = frozen
    start = time.monotonic()
    with pytest.raises(errors.TimedOut, match="timed out"):
        transport.Transport(stub.url, "t").request(Call("GET", "/v1/state"))
    assert time.monotonic() - start < 2


def test_a_silent_stream_stays_open(stub: Stub) -> None:
    def late(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        time.sleep(0.5)
        h.wfile.write(b"4\r\nlate\r\n0\r\n\r\n")

    stub.routes["GET /v1/jobs/j/logs"] = late
    stream = transport.Transport(stub.url, "t").stream(Call("GET", "/v1/jobs/j/logs"))
    assert stream.read(0.1) is None  # silence is not an error (API-009)
    assert stream.read(5) == b"late" and stream.read(5) == b""


def test_base_path_prefix_and_query(stub: Stub) -> None:
    stub.routes["GET /rc/v1/jobs"] = lambda h: send_json(h, 200, {"jobs": []})
    t = transport.Transport(stub.url + "/rc/", "t")
    t.request(Call("GET", "/v1/jobs", query={"state": "queued", "device": "a b:c"}))
    assert stub.seen[0]["path"] == "/rc/v1/jobs?device=a+b%3Ac&state=queued"


def test_bad_url_is_a_transport_error() -> None:
    with pytest.raises(errors.TransportError, match="RC_CONTROLLER"):
        transport.Transport("localhost:8080", "t")


def chunked(h: BaseHTTPRequestHandler, parts: list[bytes], finish: bool = True) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for part in parts:
        h.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        h.wfile.flush()
        time.sleep(0.05)
    if finish:
        h.wfile.write(b"0\r\n\r\n")
    h.close_connection = True


def test_stream_delivers_chunks_as_they_come(stub: Stub) -> None:
    stub.routes["GET /v1/jobs/j/logs"] = lambda h: chunked(h, [b"one\n", b"two\n"])
    got = list(transport.Transport(stub.url, "t").stream(Call("GET", "/v1/jobs/j/logs")))
    assert b"".join(got) == b"one\ntwo\n"
    assert len(got) == 2


def test_broken_stream_is_a_transport_error(stub: Stub) -> None:
    stub.routes["GET /v1/jobs/j/logs"] = lambda h: chunked(h, [b"partial"], finish=False)
    stream = transport.Transport(stub.url, "t").stream(Call("GET", "/v1/jobs/j/logs"))
    assert stream.read() == b"partial"
    with pytest.raises(errors.TransportError, match=r"GET .*/v1/jobs/j/logs"):
        stream.read()


def test_stream_refusal_raises_before_iterating(stub: Stub) -> None:
    stub.routes["GET /v1/jobs/j/logs"] = lambda h: send_json(
        h, 400, {"error": "logs_not_stored", "message": "attached job"}
    )
    with pytest.raises(errors.ApiError, match="logs_not_stored: attached job"):
        transport.Transport(stub.url, "t").stream(Call("GET", "/v1/jobs/j/logs"))


def chunked_kept(h: BaseHTTPRequestHandler, parts: list[bytes]) -> None:
    """A chunked answer that ends by its framing and leaves the connection open."""
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for part in parts:
        h.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


def test_a_run_shares_one_connection_submit_follow_and_poll(stub: Stub) -> None:
    stub.routes["POST /v1/jobs"] = lambda h: send_json(h, 201, {"id": "j"})
    stub.routes["GET /v1/jobs/j/logs"] = lambda h: chunked_kept(h, [b"out\n"])
    stub.routes["GET /v1/jobs/j"] = lambda h: send_json(h, 200, {"job": {"id": "j"}})
    t = transport.Transport(stub.url, "t")
    t.request(Call("POST", "/v1/jobs", body={"command": ["true"]}))
    with t.stream(Call("GET", "/v1/jobs/j/logs")) as stream:
        assert b"".join(stream) == b"out\n"
    t.request(Call("GET", "/v1/jobs/j"))
    assert [s["path"] for s in stub.seen] == ["/v1/jobs", "/v1/jobs/j/logs", "/v1/jobs/j"]
    assert len({s["peer"] for s in stub.seen}) == 1


def test_a_stream_left_early_drops_its_connection(stub: Stub) -> None:
    stub.routes["GET /v1/jobs/j/logs"] = lambda h: chunked_kept(h, [b"a", b"b"])
    stub.routes["GET /v1/state"] = lambda h: send_json(h, 200, {})
    t = transport.Transport(stub.url, "t")
    stream = t.stream(Call("GET", "/v1/jobs/j/logs"))
    assert stream.read() == b"a"
    stream.close()
    t.request(Call("GET", "/v1/state"))
    assert len({s["peer"] for s in stub.seen}) == 2


def test_a_request_during_a_stream_opens_another_connection(stub: Stub) -> None:
    stub.routes["GET /v1/jobs/j/logs"] = lambda h: chunked_kept(h, [b"a"])
    stub.routes["GET /v1/state"] = lambda h: send_json(h, 200, {})
    t = transport.Transport(stub.url, "t")
    t.request(Call("GET", "/v1/state"))
    stream = t.stream(Call("GET", "/v1/jobs/j/logs"))  # borrows the idle connection
    t.request(Call("GET", "/v1/state"))  # so this one needs its own
    assert b"".join(stream) == b"a"
    t.request(Call("GET", "/v1/state"))
    peers = [s["peer"] for s in stub.seen]
    assert peers[0] == peers[1] != peers[2] and peers[3] in (peers[1], peers[2])


def test_a_body_cut_short_is_a_mid_response_failure(stub: Stub) -> None:
    def short(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "10")
        h.end_headers()
        h.wfile.write(b"abc")
        h.close_connection = True

    stub.routes["GET /v1/state"] = short
    with pytest.raises(errors.TransportError) as info:
        transport.Transport(stub.url, "t").request(Call("GET", "/v1/state"))
    assert str(info.value) == (
        f"GET {stub.url}/v1/state: the controller closed the connection mid-response"
    )


def test_a_body_framed_by_the_close_is_read_to_the_end(stub: Stub) -> None:
    def until_close(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        h.wfile.write(b'{"ok": true}')
        h.close_connection = True

    stub.routes["GET /v1/state"] = until_close
    t = transport.Transport(stub.url, "t")
    assert t.request(Call("GET", "/v1/state")) == {"ok": True}
    assert t.request(Call("GET", "/v1/state")) == {"ok": True}  # on a new connection
    assert len({s["peer"] for s in stub.seen}) == 2


def test_the_request_head_is_what_http_client_sent(stub: Stub) -> None:
    stub.routes["POST /v1/jobs"] = lambda h: send_json(h, 201, {})
    stub.routes["POST /v1/devices/d/clear"] = lambda h: send_json(h, 200, {})
    t = transport.Transport(stub.url, "t")
    t.request(Call("POST", "/v1/jobs", body={"a": 1}))
    t.request(Call("POST", "/v1/devices/d/clear"))
    with_body, without = (s["headers"] for s in stub.seen)
    port = stub.url.rsplit(":", 1)[1]
    assert with_body["Host"] == f"127.0.0.1:{port}"
    assert with_body["Accept-Encoding"] == "identity"
    assert with_body["Content-Length"] == str(len(stub.seen[0]["body"]))
    assert json.loads(stub.seen[0]["body"]) == {"a": 1}
    assert without["Content-Length"] == "0"  # a POST without a body says so
