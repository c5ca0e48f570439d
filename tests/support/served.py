"""A real controller server in a background thread, for tests that need real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

from resource_controller.controller import serve
from resource_controller.controller.deps import Services


class ServedController:
    """``make_server(svc)`` serving a pre-bound loopback socket from a background thread.

    The real server object of ``rc serve`` (uvicorn, the instance header, the loops),
    so streams and long polls are tested over real HTTP; ``port`` lets a test restart
    a controller on the address its workers already know.
    """

    def __init__(self, svc: Services, port: int = 0) -> None:
        self.svc = svc
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = serve.make_server(svc)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rc-test-server", daemon=True)

    def _run(self) -> None:
        # The loop ``serve.run`` uses (uvloop when installed), as in production.
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self.loop = loop
        try:
            loop.run_until_complete(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # surfaced by start()/stop()
            self.error = exc
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"test server did not start: {self.error!r}")
            time.sleep(0.005)

    def begin_shutdown(self) -> None:
        """What ``Server.handle_exit`` does on SIGTERM: end long polls and follows now."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.svc.hub.shutting_down.set)

    def stop(self) -> None:
        self.begin_shutdown()
        # Let the requests in flight (long polls and follows, ended just now) unwind
        # first, so uvicorn's shutdown has nothing to wait for (it polls them every
        # 100 ms). Idle keep-alive connections (a client's pool) it closes at once:
        # waiting for those to go cost every test that used a client a whole second.
        deadline = time.monotonic() + 1
        while self.server.server_state.tasks and time.monotonic() < deadline:
            time.sleep(0.002)
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
        alive = self.thread.is_alive()
        self.svc.executor.shutdown(wait=True)
        self.svc.store.close()
        assert not alive, "test server thread did not stop within 15 s"
        if self.error is not None:
            raise self.error
