"""A vanished peer's connection ends within ``PEER_SILENCE``: the kernel's keep-alive and
user timeout are set on the listening socket and inherited by every accepted one."""

from __future__ import annotations

import socket

from resource_controller.controller import serve


def test_accepted_connections_give_up_on_a_silent_peer_within_the_bound() -> None:
    listener = serve.bind("127.0.0.1", 0)
    try:
        with socket.create_connection(listener.getsockname(), timeout=5):
            accepted, _ = listener.accept()
            with accepted:
                tcp = socket.IPPROTO_TCP
                assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                idle = accepted.getsockopt(tcp, socket.TCP_KEEPIDLE)
                interval = accepted.getsockopt(tcp, socket.TCP_KEEPINTVL)
                count = accepted.getsockopt(tcp, socket.TCP_KEEPCNT)
                assert idle + interval * count <= serve.PEER_SILENCE
                timeout_ms = accepted.getsockopt(tcp, socket.TCP_USER_TIMEOUT)
                assert 0 < timeout_ms <= serve.PEER_SILENCE * 1000
    finally:
        listener.close()
