"""The worker routes over real HTTP on 127.0.0.1, for tests that run ``rc worker`` as a
real process (exit statuses, signals, state kept on disk across a kill)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

WORKER_MAIN = (
    "import sys; from resource_controller.worker import agent; sys.exit(agent.main(sys.argv[1]))"
)


class LoopbackController:
    """A threaded HTTP server answering the worker routes well enough for one worker.

    ``refuse_status`` makes every terminal report fail with 503, as a controller that
    is up but cannot take reports.
    """

    def __init__(self, *, refuse_status: bool = False) -> None:
        self.registered = threading.Event()
        self.polled = threading.Event()
        self.assignments: list[dict[str, Any]] = []
        self.registrations: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.refuse_status = refuse_status
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                if data:
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = urlsplit(self.path).path
                if path == "/v1/workers/register":
                    owner.registrations.append(json.loads(raw))
                    owner.registered.set()
                    self._answer(200, {"worker_id": "w-1"})
                    return
                if path.endswith("/status"):
                    body = json.loads(raw)
                    owner.statuses.append(body)
                    if owner.refuse_status and body.get("state") != "running":
                        self._answer(503, {"error": "unavailable", "message": "not now"})
                        return
                self._answer(200)

            def do_GET(self) -> None:
                owner.polled.set()
                if owner.assignments:
                    self._answer(200, {"assignments": [owner.assignments.pop(0)]})
                    return
                time.sleep(0.05)
                self._answer(204)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_worker(
    config_dir: Path,
    url: str,
    state_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    stderr: Any = subprocess.DEVNULL,
) -> subprocess.Popen[str]:
    """Write a one-device ``worker.yaml`` in ``config_dir`` and start ``rc worker`` on it."""
    cfg = config_dir / "worker.yaml"
    cfg.write_text(
        f"controller_url: {url}\ntoken: t\nhost: box\ndevices: [gpu0]\nstate_dir: {state_dir}\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER_MAIN, str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        env=None if env is None else dict(env),
    )
