"""A real controller on loopback and a scriptable fake worker, for client and CLI tests.

The controller is the project's own app served by uvicorn in a background thread,
with a fresh data directory per test: log follows and long polls need a real socket.
The worker side is played over HTTP by ``FakeWorker`` so that tests decide exactly
when a job produces output, how it ends, and whether it honours a kill.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resource_controller.client import transport
from resource_controller.client.calls import Call
from resource_controller.clock import SystemClock
from resource_controller.controller import serve
from resource_controller.controller.deps import Services, Settings
from support.served import ServedController

TOKENS = "wtok:worker,ctok:client,atok:admin"
WORKER, CLIENT, ADMIN = "wtok", "ctok", "atok"


class LiveController:
    """``serve.make_server`` on an ephemeral 127.0.0.1 port, in a thread."""

    def __init__(self, data: Path) -> None:
        self.svc: Services = serve.open_services(data, TOKENS, Settings(), SystemClock())
        self.served = ServedController(self.svc)
        self.served.start()
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()

    def http(self, token: str = CLIENT) -> Http:
        return Http(self.url, token)


class Answered:
    """A 2xx answer's JSON, as ``Http.request`` gives it."""

    status = 200

    def __init__(self, data: Any) -> None:
        self.data = data

    def json(self) -> Any:
        return self.data


class Http(transport.Transport):
    """The client's transport with a request made of its parts: what a test sends as a
    worker or a client, each answer's JSON kept (``None`` for an empty one)."""

    def request(  # type: ignore[override]
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Answered:
        return Answered(
            super().request(Call(method, path, body=body, query=query, timeout=timeout))
        )


#: What a fake job does: given the worker and the assignment, return (state, exit code,
#: reason), having appended any output it wants; a fourth item, when there is one, holds
#: more fields for the terminal report (what the GPUs did, EXT-ACCT-1).
Behaviour = Callable[["FakeWorker", dict[str, Any]], tuple[Any, ...]]


def run_for_real(worker: FakeWorker, assignment: dict[str, Any]) -> tuple[str, int | None, str]:
    """Run the command as a subprocess, ship its combined output, report its code."""
    env = {**os.environ, **(assignment.get("env") or {})}
    proc = subprocess.run(
        assignment["command"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
        env=env,
        cwd=assignment.get("cwd") or None,
    )
    if proc.stdout:
        worker.append(assignment["job_id"], proc.stdout)
    code = proc.returncode
    return ("succeeded" if code == 0 else "failed", code, "")


def until_killed(worker: FakeWorker, assignment: dict[str, Any]) -> tuple[str, int | None, str]:
    """Print a line, then run until a kill is delivered; end ``killed`` like a worker."""
    job_id = assignment["job_id"]
    worker.append(job_id, b"started\n")
    worker.killed(job_id).wait(30)
    return ("killed", 143, "cancelled")


class FakeWorker:
    """A worker that registers devices and plays each assignment with a ``Behaviour``."""

    def __init__(
        self,
        controller: LiveController,
        host: str = "box",
        devices: tuple[str, ...] = ("gpu0", "gpu1"),
        behaviour: Behaviour = run_for_real,
        labels: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.http = controller.http(WORKER)
        self.poll_http = controller.http(WORKER)
        self.behaviour = behaviour
        self.devices = devices
        body: dict[str, Any] = {"host": host, "devices": [{"name": d} for d in devices]}
        if labels:
            body["labels"] = labels
        self.id = self.http.request("POST", "/v1/workers/register", body=body).json()["worker_id"]
        self._kills: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._stop = threading.Event()
        self._players: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._loop, name="fake-worker", daemon=True)
        self._thread.start()

    def killed(self, job_id: str) -> threading.Event:
        """Set when a kill of ``job_id`` is delivered, or at once once the worker stops: a
        job handed out while ``stop`` runs (the queued one behind a killed blocker) must
        not keep its player running until ``stop``'s join gives up."""
        with self._lock:
            event = self._kills.setdefault(job_id, threading.Event())
        if self._stop.is_set():
            event.set()
        return event

    def append(self, job_id: str, data: bytes) -> None:
        """Append raw output (the log route takes bytes, not JSON), on a connection of its own."""
        parts = urllib.parse.urlsplit(self.http.base_url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=10)
        try:
            conn.request(
                "POST",
                f"/v1/jobs/{job_id}/logs",
                body=data,
                headers={"Authorization": f"Bearer {WORKER}"},
            )
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, resp.status
        finally:
            conn.close()

    def _loop(self) -> None:
        last_beat = 0.0
        while not self._stop.is_set():
            if time.monotonic() - last_beat > 1:
                last_beat = time.monotonic()
                with self._lock:
                    running = sorted(self._running)
                with contextlib.suppress(Exception):
                    self.poll_http.request(
                        "POST",
                        f"/v1/workers/{self.id}/heartbeat",
                        body={"running_job_ids": running},
                        timeout=5,
                    )
            try:
                resp = self.poll_http.request(
                    "GET",
                    f"/v1/workers/{self.id}/assignments",
                    query={"wait": "200ms"},
                    timeout=10,
                )
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.05)
                continue
            data = resp.json()
            if not data:
                continue
            for job_id in data.get("kills") or []:
                self.killed(job_id).set()
            for assignment in data.get("assignments") or []:
                with self._lock:
                    self._running.add(assignment["job_id"])
                player = threading.Thread(target=self._play, args=(assignment,), daemon=True)
                self._players.append(player)
                player.start()

    def _play(self, assignment: dict[str, Any]) -> None:
        job_id = assignment["job_id"]
        extra: dict[str, Any] = {}
        try:
            state, code, reason, *more = self.behaviour(self, assignment)
            extra = more[0] if more else {}
        except Exception as e:  # a broken behaviour must still free the device
            state, code, reason = "failed", -1, f"fake worker: {e}"
        body: dict[str, Any] = {"worker_id": self.id, "state": state, **extra}
        if code is not None:
            body["exit_code"] = code
        if reason:
            body["reason"] = reason
        reporter = Http(self.http.base_url, WORKER)
        try:
            reporter.request("POST", f"/v1/jobs/{job_id}/status", body=body, timeout=10)
        except Exception:
            if not self._stop.is_set():
                raise  # a failed report while the test still runs is a real failure
        finally:
            reporter.close()
            with self._lock:
                self._running.discard(job_id)

    def stop(self) -> None:
        self._stop.set()
        for event in list(self._kills.values()):
            event.set()
        self._thread.join(timeout=5)
        for player in self._players:
            player.join(timeout=15)
        self.http.close()
        self.poll_http.close()
