"""The fault-injecting proxy against a real echo server on loopback, mode by mode."""

from __future__ import annotations

import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from support.nemesis import FaultProxy, freeze, frozen, kill_hard, process_state, thaw, wait_state


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: _Server) -> Iterator[FaultProxy]:
    with FaultProxy(echo.server_address[1]) as p:
        yield p


def connect(proxy: FaultProxy, timeout: float = 5) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    return s


def roundtrip(s: socket.socket, data: bytes = b"ping") -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_pass_forwards_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        assert roundtrip(s, b"hello" * 10000) == b"hello" * 10000


def test_delay_holds_each_chunk(proxy: FaultProxy) -> None:
    proxy.set("pass", delay=0.3)
    with connect(proxy) as s:
        t0 = time.monotonic()
        assert roundtrip(s) == b"ping"
        # Delayed going up and coming back down: at least two delays.
        assert time.monotonic() - t0 >= 0.55
    proxy.set("pass", delay=0)
    with connect(proxy) as s:
        t0 = time.monotonic()
        assert roundtrip(s) == b"ping"
        assert time.monotonic() - t0 < 0.3


def test_drop_closes_new_connections_but_not_live_ones(proxy: FaultProxy) -> None:
    with connect(proxy) as live:
        assert roundtrip(live) == b"ping"
        proxy.set("drop")
        with connect(proxy) as s:
            assert s.recv(10) == b""  # closed by the proxy at once (FIN)
        assert roundtrip(live) == b"ping"
    assert proxy.refused == 1


def test_blackhole_answers_nothing_and_heals(proxy: FaultProxy) -> None:
    with connect(proxy, timeout=0.5) as live:
        assert roundtrip(live) == b"ping"
        proxy.set("blackhole")
        with connect(proxy, timeout=0.5) as fresh:  # accepted: the connect succeeds
            fresh.sendall(b"new")
            with pytest.raises(TimeoutError):
                fresh.recv(10)
            live.sendall(b"old")
            with pytest.raises(TimeoutError):
                live.recv(10)
            proxy.set("pass")
            live.settimeout(5)
            fresh.settimeout(5)
            assert live.recv(10) == b"old"  # what was held is delivered, as TCP would
            assert fresh.recv(10) == b"new"


def test_reset_sends_rst_to_live_and_new_connections(proxy: FaultProxy) -> None:
    with connect(proxy) as live:
        assert roundtrip(live) == b"ping"
        proxy.set("reset")
        with pytest.raises(ConnectionResetError):
            live.sendall(b"x")
            live.recv(10)
        with pytest.raises(ConnectionResetError), connect(proxy) as s:
            # The RST may already land while connecting, or on the first read.
            s.sendall(b"x")
            s.recv(10)
    proxy.set("pass")
    with connect(proxy) as s:
        assert roundtrip(s) == b"ping"


def test_one_way_partition_forwards_one_direction_only(echo: _Server) -> None:
    received: list[bytes] = []

    class Sink(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            while data := self.request.recv(65536):
                received.append(data)
            self.request.sendall(b"bye")

    sink = _Server(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        with FaultProxy(sink.server_address[1]) as p:
            p.set("up_only")
            with connect(p, timeout=0.5) as s:
                s.sendall(b"up")
                deadline = time.monotonic() + 5
                while not received:
                    assert time.monotonic() < deadline, "bytes up were not forwarded"
                    time.sleep(0.01)
                s.shutdown(socket.SHUT_WR)
                with pytest.raises(TimeoutError):
                    s.recv(10)  # the server's answer is held
                p.set("pass")
                s.settimeout(5)
                assert s.recv(10) == b"bye"
        with FaultProxy(echo.server_address[1]) as p:
            p.set("down_only")
            with connect(p, timeout=0.5) as s:
                s.sendall(b"held")
                with pytest.raises(TimeoutError):
                    s.recv(10)
    finally:
        sink.shutdown()
        sink.server_close()
    assert received == [b"up"]


def test_unknown_mode_and_negative_delay_are_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="unknown proxy mode 'sideways'"):
        proxy.set("sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay must be >= 0"):
        proxy.set("pass", delay=-1)


def test_process_nemeses_stop_continue_and_kill_by_pid() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        freeze(proc.pid)
        assert wait_state(proc.pid, "T") == "T"
        thaw(proc.pid)
        assert wait_state(proc.pid, "SR") in ("S", "R")
        with frozen(proc.pid):
            assert wait_state(proc.pid, "T") == "T"
        assert wait_state(proc.pid, "SR") in ("S", "R")
        kill_hard(proc.pid)
        assert proc.wait(5) == -9
        assert process_state(proc.pid) == ""
        kill_hard(proc.pid)  # already gone: not an error
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
