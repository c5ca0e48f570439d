"""The real controller (``rc serve``'s app and store) served on 127.0.0.1, and ``rc worker``
as a real process against it.

The controller runs in its own thread and event loop on an ephemeral port
(``support.served``); tests submit jobs over HTTP with the client token. Nothing is
faked on the controller's side.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from resource_controller.controller import deps, serve
from support.served import ServedController

TOKENS = "wtok:worker,ctok:client"
HOST = "livebox"
TERMINAL = frozenset({"failed", "succeeded", "killed", "lost"})

WORKER_MAIN = (
    "import sys; from resource_controller.worker import process; "
    "sys.exit(process.main(sys.argv[1]))"
)


class LiveController:
    """``rc serve``'s server object serving a pre-bound loopback socket from a thread."""

    def __init__(self, data: Path, port: int = 0) -> None:
        self.svc = serve.open_services(data, TOKENS, deps.Settings())
        self.served = ServedController(self.svc, port)  # a restart reuses the port
        self.served.start()
        self.url = self.served.url
        self._stopped = False

    def stop(self) -> None:
        """Stop serving (a second call does nothing)."""
        if not self._stopped:
            self._stopped = True
            self.served.stop()

    def client(self) -> httpx.Client:
        """A blocking API client with the client token."""
        return httpx.Client(base_url=self.url, headers={"Authorization": "Bearer ctok"}, timeout=10)


def submit(client: httpx.Client, **fields: Any) -> str:
    """Submit a job to ``livebox:gpu0``, once a worker has registered the device."""
    body = {"device_id": f"{HOST}:gpu0", "submitter": "tester", **fields}
    deadline = time.monotonic() + 15
    while True:
        r = client.post("/v1/jobs", json=body)
        if r.status_code != 201 and "unknown_device" in r.text and time.monotonic() < deadline:
            time.sleep(0.02)  # the worker process has not registered yet
            continue
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def wait_state(
    client: httpx.Client, job_id: str, states: frozenset[str] | set[str], timeout: float = 15.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()["job"]
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job stuck in {job['state']}"
        time.sleep(0.02)


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
        f"controller_url: {url}\ntoken: wtok\nhost: {HOST}\ndevices: [gpu0]\n"
        f"state_dir: {state_dir}\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER_MAIN, str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        env=None if env is None else dict(env),
    )
