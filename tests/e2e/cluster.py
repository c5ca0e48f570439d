"""Real processes on loopback: ``rc serve`` and ``rc worker`` started as subprocesses.

Every process is stopped by PID in teardown (SIGTERM, then SIGKILL after a bound),
and every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

RC = str(Path(sys.executable).parent / "rc")
TOKENS = {"worker": "wtok", "client": "ctok", "admin": "atok"}

#: A process started here: the controller and workers write bytes, ``popen_rc`` text.
Proc = subprocess.Popen[bytes] | subprocess.Popen[str]

#: A decoded JSON body. Its shape is what the test asserts, so it stays dynamic.
Json = Any

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], T | None], timeout: float, what: str, every: float = 0.05
) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop(proc: Proc, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
    """Stop a process we started, by PID; SIGKILL if it ignores ``sig`` for ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@dataclass
class Cluster:
    """A controller (and workers) for one test, with helpers to talk to it."""

    tmp: Path
    port: int
    procs: list[Proc] = field(default_factory=list)
    controller: subprocess.Popen[bytes] | None = None
    #: The one device of a ``box`` fixture, whichever setup runs it.
    dev: str = "box:gpu0"
    #: A command workers run under (``nsenter ... --``); none by default.
    worker_wrap: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, token: str = "ctok", **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RC_CONTROLLER=self.url,
            RC_TOKEN=token,
            RC_SUBMITTER="tester",
            RC_CONFIG=os.devnull,  # an empty file: no settings from a user config
        )
        env.update(extra)
        return env

    def api(
        self, method: str, path: str, body: object = None, token: str = "ctok"
    ) -> tuple[int, Json]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None

    def start_controller(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        tokens: str = "wtok:worker,ctok:client,atok:admin",
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ, RC_TOKENS=tokens, **(env or {}))
        log = open(self.tmp / "controller.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                RC,
                "serve",
                "--addr",
                f"127.0.0.1:{self.port}",
                "--data",
                str(self.tmp / "data"),
                *args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        self.controller = proc

        def up() -> bool:
            try:
                return self.api("GET", "/v1/state")[0] == 200
            except OSError:
                return False

        wait_for(up, 15, "the controller to answer")
        return proc

    def start_up(
        self, env: dict[str, str] | None = None, first: str = "slot0"
    ) -> subprocess.Popen[bytes]:
        """``rc up``: controller and worker in one process, on this host's ``slot`` devices
        (or what a fake ``nvidia-smi`` in ``env`` lists: ``first`` is then the device
        to wait for, and ``dev``).

        The tokens file is written first, so the usual test tokens work against it; the
        user config it writes goes to a home of the test's own.
        """
        data = self.tmp / "data"
        data.mkdir(parents=True, exist_ok=True)
        tokens = data / "up-tokens"
        tokens.write_text("".join(f"{role}={tok}\n" for role, tok in TOKENS.items()))
        tokens.chmod(0o600)
        home = self.tmp / "home"
        home.mkdir(exist_ok=True)
        # rc up names its client token after the local user: the tests' submitter.
        extra = env or {}
        env = dict(os.environ, HOME=str(home), USER="tester", **extra)
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "RC_CONFIG"):
            env.pop(name, None)
        log = open(self.tmp / "up.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [RC, "up", "--addr", f"127.0.0.1:{self.port}", "--data", str(data), "--devices", "1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        self.controller = proc
        host = socket.gethostname()
        self.dev = f"{host}:{first}"

        def registered() -> bool:
            try:
                status, views = self.api("GET", "/v1/devices")
            except OSError:
                return False
            ids = {v["device"]["id"] for v in views} if status == 200 else set()
            return self.dev in ids

        wait_for(registered, 30, "rc up to start and register its devices")
        return proc

    def start_worker(
        self,
        host: str,
        devices: list[str] | str,
        extra: str = "",
        env: dict[str, str] | None = None,
        heartbeat: str = "1s",
        wait: bool = True,
        token: str = "wtok",
        args: tuple[str, ...] = (),
        controller_url: str = "",
    ) -> subprocess.Popen[bytes]:
        """``controller_url``: what the worker dials (several, comma-separated, for a
        fleet of controllers); this cluster's controller by default. ``devices`` as a
        string is the value of ``devices:`` itself (``auto``, EXT-MIG-1); the wait is
        then for any device of the host. The worker runs under ``worker_wrap``."""
        cfg = self.tmp / f"worker-{host}.yaml"
        listed = (
            [f"devices: {devices}"]
            if isinstance(devices, str)
            else ["devices:", *[f"  - {d}" for d in devices]]
        )
        lines = [
            f"controller_url: {controller_url or self.url}",
            f"token: {token}",
            f"host: {host}",
            f"heartbeat_interval: {heartbeat}",
            f"state_dir: {self.tmp / ('state-' + host)}",
            *listed,
        ]
        cfg.write_text("\n".join(lines) + "\n" + extra)
        log = open(self.tmp / f"worker-{host}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [*self.worker_wrap, RC, "worker", "-c", str(cfg), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **(env or {})),
        )
        self.procs.append(proc)
        if not wait:
            return proc

        def registered() -> bool:
            status, views = self.api("GET", "/v1/devices")
            ids = {v["device"]["id"] for v in views} if status == 200 else set()
            if isinstance(devices, str):
                return any(i.startswith(f"{host}:") for i in ids)
            return all(f"{host}:{d}" in ids for d in devices)

        wait_for(registered, 15, f"worker {host} to register")
        return proc

    def rc(
        self, *args: str, token: str = "ctok", timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RC, *args], env=self.env(token, **env), capture_output=True, text=True, timeout=timeout
        )

    def popen_rc(self, *args: str, token: str = "ctok", **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [RC, *args],
            env=self.env(token, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def job(self, job_id: str) -> dict[str, Json]:
        status, view = self.api("GET", f"/v1/jobs/{job_id}")
        assert status == 200, view
        job: dict[str, Json] = view["job"]
        return job

    def wait_job(
        self, job_id: str, pred: Callable[[dict[str, Json]], bool], timeout: float = 20
    ) -> dict[str, Json]:
        return wait_for(
            lambda: (lambda j: j if pred(j) else None)(self.job(job_id)), timeout, f"job {job_id}"
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )


def pids_with_job(job_id: str) -> list[int]:
    """Live processes whose environment names ``RC_JOB_ID=<job_id>`` (for checks and cleanup)."""
    want = f"RC_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (for a process started under a wrapper)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def kill_job_processes(job_id: str) -> None:
    for pid in pids_with_job(job_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
