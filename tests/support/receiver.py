"""A webhook receiver on loopback that is slow, silent or dead, for the webhook nemesis.

``rc serve --webhook-url`` points at it. Modes:

- ``ok``: answer ``204`` at once (a healthy receiver, the control case);
- ``slow``: read the request, answer ``204`` only after ``delay`` seconds (longer than
  the controller's 10 s per-POST bound, every attempt times out);
- ``silent``: accept and read, never answer, never close (a hung receiver);
- ``dead``: a listening socket that never accepts: the kernel completes a handshake or
  two into the backlog, then new connections hang in ``connect`` (a wedged process).

Every request body that arrives is recorded with its arrival time, so a test can count
what got through. ``stop`` closes everything; threads are daemons.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Literal

ReceiverMode = Literal["ok", "slow", "silent", "dead"]
RECEIVER_MODES: tuple[ReceiverMode, ...] = ("ok", "slow", "silent", "dead")


class Receiver:
    """One loopback HTTP endpoint answering webhook POSTs the way ``mode`` says."""

    def __init__(self, mode: ReceiverMode, delay: float = 30.0) -> None:
        if mode not in RECEIVER_MODES:
            raise ValueError(f"unknown receiver mode {mode!r} (known: {', '.join(RECEIVER_MODES)})")
        self.mode = mode
        self.delay = delay
        #: (arrival time, decoded body) of every request read in full.
        self.received: list[tuple[float, dict[str, object]]] = []
        #: Connections accepted (``dead`` accepts none).
        self.accepted = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0 if mode == "dead" else 64)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        if self.mode != "dead":
            self._thread = threading.Thread(target=self._accept, name="receiver", daemon=True)
            self._thread.start()
        return self

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()
            self._conns.clear()
        if self._thread is not None:
            self._thread.join(5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Read requests one after another on a kept-alive connection."""
        buf = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                with contextlib.suppress(ValueError):
                    self.received.append((time.time(), json.loads(body or b"{}")))
                if self.mode == "silent":
                    self._stop.wait()
                    return
                if self.mode == "slow" and self._stop.wait(self.delay):
                    return
                conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()


# ---- what the controller says about its deliveries -------------------------------------


def webhook_counts(metrics: str) -> dict[str, float]:
    """``delivered`` and ``dropped_<reason>`` totals from a ``GET /metrics`` page
    (``rc_webhook_deliveries_total``, ``rc_webhook_drops_total{reason=...}``), summed
    over event kinds."""
    out: dict[str, float] = {"delivered": 0.0}
    for line in metrics.splitlines():
        if line.startswith("rc_webhook_deliveries_total{"):
            out["delivered"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rc_webhook_drops_total{"):
            labels = line[line.index("{") + 1 : line.index("}")]
            reason = next(
                (
                    p.split("=", 1)[1].strip('"')
                    for p in labels.split(",")
                    if p.startswith("reason=")
                ),
                "",
            )
            key = f"dropped_{reason}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def rss_kib(pid: int) -> int:
    """The process's resident set (``VmRSS``) in KiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
