"""The chaos run's fleet: a controller and N workers on one machine, each restartable and
each worker (where the machine allows) in a PID namespace of its own, and the client
calls the phases share (submits retried through outages under one idempotency key,
terminal reads, the quarantined devices). Used by ``bench/chaos.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import history as hist
from support.nemesis import frozen, kill_hard

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
TERMINAL = hist.TERMINAL
HEADERS = {"Authorization": "Bearer ctok"}
WORKER_HEADERS = {"Authorization": "Bearer wtok"}
ADMIN_HEADERS = {"Authorization": "Bearer atok"}
HOOK_DEVICE = "hookbox:gpu0"
#: Each worker in its own PID namespace, as PID 1 with its own ``/proc``: like a host of
#: its own, its jobs die with it and a restarted worker can prove it (the "isolated"
#: recovery proof, WRK-141). Without it the four "hosts" share one ``/proc``, every
#: restarted worker sees the others' jobs and proves nothing, and the devices of every
#: killed worker stay quarantined until the run starves. ``--kill-child``: ``kill -9`` of
#: ``unshare`` takes the namespace with it.
ISOLATE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
#: The controller's start-up hold-off (SRV-032): a restart shorter than this must not
#: cost a running job its real outcome.
HOLD_OFF = 30.0


class Fleet:
    """A controller (or several on one PostgreSQL ``database``) and N workers, each
    restartable, all stopped by PID at the end."""

    def __init__(
        self,
        tmp: Path,
        workers: int,
        devices: int,
        webhook_url: str = "",
        isolate: bool = True,
        database: str = "",
        controllers: int = 1,
    ) -> None:
        self.tmp = tmp
        self.isolate = isolate
        self.webhook_url = webhook_url
        self.database = database
        #: Controller processes started so far: the pump and the sampler count per life.
        self.life = 0
        self.hookbox: subprocess.Popen[bytes] | None = None
        self.ports = [free_port() for _ in range(controllers)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        #: The first controller: the clients' (they retry through its restarts).
        self.port, self.url = self.ports[0], self.urls[0]
        self.controllers: list[subprocess.Popen[bytes] | None] = [None] * controllers
        self.workers: dict[str, subprocess.Popen[bytes] | None] = {
            f"chaos{i}": None for i in range(workers)
        }
        self.devices = devices

    @property
    def controller(self) -> subprocess.Popen[bytes] | None:
        """The controller the nemesis aims at: the leader among several (its
        ``/healthz`` says so), else the first one running."""
        alive = [(i, p) for i, p in enumerate(self.controllers) if p and p.poll() is None]
        for i, proc in alive:
            health = get(self.urls[i], "/healthz") if len(self.controllers) > 1 else None
            if health and health.get("leader"):
                return proc
        return alive[0][1] if alive else None

    def start_controller(self) -> None:
        """Start every controller that is not running, and wait until each answers."""
        env = dict(os.environ, RC_TOKENS="wtok:worker,ctok:client,atok:admin")
        hook = ["--webhook-url", self.webhook_url] if self.webhook_url else []
        shared = ["--database", self.database] if self.database else []
        self.life += 1  # before it answers: every answer from now on is this life's
        for i, proc in enumerate(self.controllers):
            if proc is not None and proc.poll() is None:
                continue
            self.controllers[i] = subprocess.Popen(
                [
                    RC,
                    "serve",
                    "--addr",
                    f"127.0.0.1:{self.ports[i]}",
                    "--data",
                    str(self.tmp / f"data{i or ''}"),
                    *hook,
                    *shared,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(self.tmp / f"controller{i or ''}.log", "ab"),  # noqa: SIM115
            )
            wait_for(_answers(self.urls[i]), 120, "controller")

    def kill_controller(self) -> None:
        """``kill -9`` the controller (the leader, with several)."""
        proc = self.controller
        if proc is not None:
            kill_hard(proc.pid)
            proc.wait(10)

    def start_worker(self, host: str) -> None:
        running = self.workers.get(host)
        if running is not None and running.poll() is None:
            # Its Popen would be lost, and the process would outlive the run.
            raise RuntimeError(f"worker {host} is still running (PID {running.pid})")
        cfg = self.tmp / f"{host}.yaml"
        names = ", ".join(f"gpu{i}" for i in range(self.devices))
        cfg.write_text(
            f"controller_url: {','.join(self.urls)}\ntoken: wtok\nhost: {host}\n"
            f"state_dir: {self.tmp / ('state-' + host)}\ndevices: [{names}]\n"
        )
        self.workers[host] = subprocess.Popen(
            [*(ISOLATE if self.isolate else []), RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"{host}.log", "ab"),  # noqa: SIM115
        )

    def start_hookbox(self) -> None:
        """A fifth worker with one device that the webhook pump faults over and over
        (each fault report raises one ``device_unhealthy`` event, HOOKN-012a); it is
        faulted before any load, so it never takes a job, and never killed."""
        cfg = self.tmp / "hookbox.yaml"
        cfg.write_text(
            f"controller_url: {self.url}\ntoken: wtok\nhost: hookbox\n"
            f"state_dir: {self.tmp / 'state-hookbox'}\ndevices: [gpu0]\n"
        )
        self.hookbox = subprocess.Popen(
            [RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / "hookbox.log", "ab"),  # noqa: SIM115
        )
        wait_for(
            lambda: any(
                v["device"]["id"] == HOOK_DEVICE for v in get(self.url, "/v1/devices") or []
            ),
            30,
            "hookbox",
        )
        r = httpx.post(
            f"{self.url}/v1/devices/{HOOK_DEVICE}/fault",
            json={"reason": "webhook pump device"},
            headers=WORKER_HEADERS,
            timeout=10,
        )
        r.raise_for_status()

    def worker_pid(self, host: str) -> int | None:
        """The worker process itself: under ``unshare --fork`` the child, not ``unshare``."""
        proc = self.workers[host]
        if proc is None or proc.poll() is not None:
            return None
        if isinstance(proc.args, list) and proc.args[0] == ISOLATE[0]:
            children = _children(proc.pid)
            return children[0] if children else None
        return proc.pid

    def kill_worker(self, host: str) -> float:
        """``kill -9`` the worker; returns when none of its jobs' processes is left
        (with ``isolate`` they die with the namespace), as seen in ``/proc``."""
        proc = self.workers[host]
        if proc is not None:
            kill_hard(proc.pid)
            proc.wait(10)
        deadline = time.monotonic() + 30
        while job_processes(host) and time.monotonic() < deadline:
            time.sleep(0.05)
        return time.time()

    def stop(self) -> None:
        procs = [*self.workers.values(), self.hookbox, *self.controllers]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                # ``unshare --fork`` does not pass the signal on: the worker is its child.
                isolated = isinstance(proc.args, list) and proc.args[0] == ISOLATE[0]
                for child in _children(proc.pid) if isolated else []:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGTERM)
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _answers(url: str) -> Callable[[], bool]:
    return lambda: get(url, "/v1/state") is not None


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def job_processes(host: str, device: str = "") -> list[int]:
    """PIDs of live processes whose environment names a device of ``host`` (or, with
    ``device``, that device exactly)."""
    needle = (f"\0RC_DEVICE={device}\0" if device else f"\0RC_DEVICE={host}:").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env:
            found.append(int(entry.name))
    return found


def isolation_works() -> bool:
    """Whether ``unshare`` can give a worker its own PID namespace here (root, Linux)."""
    try:
        done = subprocess.run([*ISOLATE, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, path: str) -> Any:
    try:
        r = httpx.get(url + path, headers=HEADERS, timeout=5)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def wait_for(ok: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not come up")


async def submit(
    client: httpx.AsyncClient, body: dict[str, object], stop_at: float, key: str = ""
) -> tuple[str, str] | None:
    """Submit with an idempotency key (``key``, else a fresh one), retrying through
    outages; (key, job ID), or None if time ran out. None does not mean no job: an
    answer lost to a controller kill may follow a committed submit, and only a retry
    with the same key finds it."""
    key = key or str(uuid.uuid4())
    body = {**body, "idempotency_key": key}
    while time.monotonic() < stop_at:
        try:
            r = await client.post("/v1/jobs", json=body)
            if r.status_code == 201:
                return key, str(r.json()["id"])
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    return None


async def final(client: httpx.AsyncClient, job_id: str, stop_at: float) -> dict[str, object] | None:
    """The job's terminal record, or ``None`` if it has none by ``stop_at``; read at
    least once even past it (a drain's deadline must not turn a finished job into one
    "without a terminal state")."""
    first = True
    while first or time.monotonic() < stop_at:
        first = False
        try:
            r = await client.get(f"/v1/jobs/{job_id}")
            if r.status_code == 200 and r.json()["job"]["state"] in TERMINAL:
                job: dict[str, object] = r.json()["job"]
                return job
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)
    return None


def quarantined(fleet: Fleet) -> dict[str, str]:
    """Unhealthy devices and their reasons, the webhook pump's own device aside."""
    views = get(fleet.url, "/v1/devices") or []
    return {
        v["device"]["id"]: v.get("quarantine_reason", "")
        for v in views
        if v["device"]["state"] == "unhealthy" and v["device"]["id"] != HOOK_DEVICE
    }


async def freeze_for(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid`` for ``seconds``, then SIGCONT: a process that stops answering
    without closing a socket (a paused VM, a swap storm), then comes back."""
    with frozen(pid):
        await asyncio.sleep(seconds)
