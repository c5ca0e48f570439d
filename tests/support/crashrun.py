"""One crash-consistency trial: a real ``rc serve`` dies at a crash point, then is judged.

``trial(point, n)`` starts ``rc serve`` with ``RC_TEST_CRASH_AT=point:n`` and plays a
worker and a client over real HTTP, round after round (register, heartbeat, submit
and its grant, the poll's hand-out, the running report, a log chunk, the terminal
report, then a second job killed), writing down every change the controller
acknowledged. When a request fails the process must have exited with
``crashpoints.CRASH_STATUS``. The trial then checks ``PRAGMA integrity_check`` on the
database, restarts the controller on the same ``--data`` and checks that every
acknowledged change is still there, that the store is consistent (each live lease
belongs to exactly one active job and the reverse, no busy device without a lease), so
the change in flight is wholly there or wholly absent, and that the restarted
controller still hands out a device. Used by ``tests/reliability`` (a few crashes per
point) and ``bench/crash.py`` (many).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from resource_controller import crashpoints

RC = str(Path(sys.executable).parent / "rc")
TOKENS = "wtok:worker,ctok:client,atok:admin"
CLIENT = {"Authorization": "Bearer ctok"}
WORKER = {"Authorization": "Bearer wtok"}
HOST = "crashbox"
DEVICE = f"{HOST}:gpu0"
ACTIVE = ("assigned", "running")
TERMINAL = ("succeeded", "failed", "killed", "lost")
#: Generous: on a loaded machine a Python controller's start-up can take many seconds.
START_TIMEOUT = 60.0


class Died(Exception):
    """The controller stopped answering in the middle of a request."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Acked:
    """What the controller acknowledged before it died, and what was in flight."""

    worker_id: str = ""
    #: idempotency key → (job ID, command) of every acknowledged submit.
    submits: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    granted: set[str] = field(default_factory=set)
    handed_out: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    finished: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    #: job ID → the chunks acknowledged, in order.
    logs: dict[str, list[bytes]] = field(default_factory=dict)
    #: The request that got no answer: (what, details).
    in_flight: tuple[str, Any] = ("", None)


@dataclass
class Outcome:
    """One trial's verdict; ``problems`` empty means it passed."""

    point: str
    n: int
    crashed: bool
    integrity: str
    acked_changes: int
    lost: list[str]
    inconsistent: list[str]
    problems: list[str]
    seconds: float


class Controller:
    """``rc serve`` on a fixed port and data directory, started and stopped by PID."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp = tmp
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        log = open(self.tmp / "controller.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [RC, "serve", "--addr", f"127.0.0.1:{self.port}", "--data", str(self.tmp / "data")],
            env=dict(os.environ, RC_TOKENS=TOKENS, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/v1/state", headers=CLIENT, timeout=2).status_code == 200:
                    return
            if self.proc.poll() is not None:
                # Dying at a point reached during start-up counts as a crash too.
                return
            if time.monotonic() > deadline:
                self.stop(hard=True)  # a start that timed out must not leave it running
                raise RuntimeError(f"the controller did not answer within {START_TIMEOUT:g} s")
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 10) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, hard: bool = False) -> None:
        """SIGTERM and wait, or with ``hard`` SIGKILL (once every check has been made)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Driver:
    """A worker and a client in one, writing down each acknowledged change."""

    def __init__(self, url: str, acked: Acked) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)
        self.acked = acked

    def close(self) -> None:
        self.http.close()

    def call(
        self, what: str, detail: Any, method: str, path: str, worker: bool = False, **kw: Any
    ) -> httpx.Response:
        self.acked.in_flight = (what, detail)
        try:
            r = self.http.request(method, path, headers=WORKER if worker else CLIENT, **kw)
        except httpx.HTTPError as exc:
            raise Died(what) from exc
        if r.status_code >= 400:
            raise AssertionError(f"{what}: {r.status_code} {r.text}")
        self.acked.in_flight = ("", None)
        return r

    def register(self) -> str:
        # The proof a real worker sends after its survivor check (WRK-141), so a device a
        # crash left busy comes back by auto-recovery instead of waiting for an operator.
        proof = {"isolated": True, "survivors_checked": True, "survivors_found": False}
        body = {
            "host": HOST,
            "boot_id": "boot-1",
            "devices": [{"name": "gpu0"}],
            "recovery": proof,
        }
        r = self.call("register", None, "POST", "/v1/workers/register", worker=True, json=body)
        self.acked.worker_id = str(r.json()["worker_id"])
        return self.acked.worker_id

    def heartbeat(self, wid: str) -> None:
        body: dict[str, list[str]] = {"running_job_ids": []}
        self.call("heartbeat", None, "POST", f"/v1/workers/{wid}/heartbeat", worker=True, json=body)

    def submit(self, key: str, command: list[str]) -> str:
        body = {
            "command": command,
            "device_id": DEVICE,
            "submitter": "crash",
            "idempotency_key": key,
        }
        r = self.call("submit", (key, command), "POST", "/v1/jobs", json=body)
        job = r.json()
        self.acked.submits[key] = (str(job["id"]), command)
        if job["state"] == "assigned":
            self.acked.granted.add(str(job["id"]))
        return str(job["id"])

    def poll(self, wid: str) -> tuple[list[str], list[str]]:
        r = self.call("handout", None, "GET", f"/v1/workers/{wid}/assignments?wait=1s", worker=True)
        body = r.json() if r.content else {"assignments": []}  # 204 when nothing is due
        got = [str(a["job_id"]) for a in body["assignments"]]
        self.acked.handed_out.update(got)
        return got, [str(k) for k in body.get("kills") or []]

    def status(self, wid: str, job: str, state: str, code: int | None = None) -> None:
        body: dict[str, Any] = {"worker_id": wid, "state": state}
        if code is not None:
            body["exit_code"] = code
        self.call(state, job, "POST", f"/v1/jobs/{job}/status", worker=True, json=body)
        if state == "running":
            self.acked.running.add(job)
        else:
            self.acked.finished[job] = (state, code)

    def log(self, job: str, chunk: bytes) -> None:
        self.call("log", (job, chunk), "POST", f"/v1/jobs/{job}/logs", worker=True, content=chunk)
        self.acked.logs.setdefault(job, []).append(chunk)

    def kill(self, job: str) -> None:
        self.call("kill", job, "POST", f"/v1/jobs/{job}/kill", json={"submitter": "crash"})
        self.acked.killed.add(job)

    def round(self, r: int, tag: str) -> None:
        """One job's whole life and one killed job: every write path at least once."""
        wid = self.register()
        self.heartbeat(wid)
        job = self.submit(f"{tag}-{r}-a", ["echo", f"round {r}"])
        got, _ = self.poll(wid)
        if job not in got:
            raise AssertionError(f"round {r}: job {job} was not handed out ({got})")
        self.status(wid, job, "running")
        self.log(job, f"round {r} line one\n".encode())
        self.log(job, f"round {r} line two\n".encode() * 50)
        self.status(wid, job, "succeeded", 0)
        victim = self.submit(f"{tag}-{r}-b", ["sleep", "100"])
        self.poll(wid)
        self.status(wid, victim, "running")
        self.kill(victim)
        _, kills = self.poll(wid)
        if victim not in kills:
            raise AssertionError(f"round {r}: kill of {victim} was not delivered ({kills})")
        self.status(wid, victim, "killed", -9)
        self.heartbeat(wid)


def integrity(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as c:
        rows = c.execute("PRAGMA integrity_check").fetchall()
    return "; ".join(str(r[0]) for r in rows)


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as c:
        return c.execute(sql).fetchall()


def inconsistencies(db: Path) -> list[str]:
    """Cross-table rules a half-applied change would break."""
    found: list[str] = []
    live = _rows(db, "SELECT id, device_id, job_id FROM leases WHERE released_at IS NULL")
    jobs = {
        r[0]: r for r in _rows(db, "SELECT id, state, device_id, started_at, finished_at FROM jobs")
    }
    devices = dict(_rows(db, "SELECT id, state FROM devices"))
    by_job: dict[str, int] = {}
    for lease_id, device, job_id in live:
        if devices.get(device) == "ready":
            found.append(f"live lease {lease_id} on ready device {device}")
        if job_id:
            by_job[job_id] = by_job.get(job_id, 0) + 1
            row = jobs.get(job_id)
            if row is None or row[1] not in ACTIVE or row[2] != device:
                found.append(f"live lease {lease_id} for job {job_id} that is {row}")
    leased = {device for _, device, _ in live}
    for device, state in devices.items():
        if state == "busy" and device not in leased:
            found.append(f"device {device} busy without a live lease")
    for job_id, state, device, started, finished in jobs.values():
        if state in ACTIVE and by_job.get(job_id, 0) != 1:
            found.append(f"{state} job {job_id} has {by_job.get(job_id, 0)} live leases")
        if state in ACTIVE and not device:
            found.append(f"{state} job {job_id} has no device")
        if state in TERMINAL and finished is None:
            found.append(f"{state} job {job_id} has no finished_at")
        if state == "running" and started is None:
            found.append(f"running job {job_id} has no started_at")
        if state == "queued" and (started is not None or job_id in by_job):
            found.append(f"queued job {job_id} was started or holds a lease")
    return found


def lost_changes(http: httpx.Client, acked: Acked) -> list[str]:
    """Acknowledged changes the restarted controller no longer shows."""
    lost: list[str] = []

    def job(job_id: str) -> dict[str, Any] | None:
        r = http.get(f"/v1/jobs/{job_id}", headers=CLIENT)
        return dict(r.json()["job"]) if r.status_code == 200 else None

    views = {jid: job(jid) for jid, _ in acked.submits.values()}
    for key, (jid, command) in acked.submits.items():
        v = views[jid]
        if v is None or v["command"] != command or v.get("idempotency_key") != key:
            lost.append(f"submit {key} → {jid}: now {v}")
    for jid in acked.granted | acked.handed_out:
        v = views.get(jid)
        if v is None or v["state"] == "queued":
            lost.append(f"grant/hand-out of {jid}: now {v and v['state']}")
    for jid in acked.running:
        v = views.get(jid)
        if v is None or v["state"] in ("queued", "assigned"):
            lost.append(f"running report of {jid}: now {v and v['state']}")
    for jid, (state, code) in acked.finished.items():
        v = views.get(jid)
        if v is None or v["state"] != state or v.get("exit_code") != code:
            lost.append(f"{state} report of {jid}: now {v and (v['state'], v.get('exit_code'))}")
    for jid in acked.killed:
        v = views.get(jid)
        if v is None or v["state"] not in ("running", "killed"):
            lost.append(f"kill of {jid}: now {v and v['state']}")
    for jid, chunks in acked.logs.items():
        body = http.get(f"/v1/jobs/{jid}/logs?follow=false", headers=CLIENT).content
        want = b"".join(chunks)
        what, detail = acked.in_flight
        extra = detail[1] if what == "log" and detail[0] == jid else b""
        if body not in (want, want + extra) or (extra and not body.startswith(want)):
            lost.append(f"log of {jid}: {len(body)} bytes, acknowledged {len(want)}")
    if acked.worker_id:
        r = http.get("/v1/devices", headers=CLIENT)
        if DEVICE not in {d["device"]["id"] for d in r.json()}:
            lost.append(f"registration of {acked.worker_id}: device {DEVICE} gone")
    return lost


def acked_count(acked: Acked) -> int:
    return (
        (1 if acked.worker_id else 0)
        + len(acked.submits)
        + len(acked.granted)
        + len(acked.handed_out)
        + len(acked.running)
        + len(acked.finished)
        + len(acked.killed)
        + sum(len(c) for c in acked.logs.values())
    )


def in_flight_problems(http: httpx.Client, acked: Acked) -> list[str]:
    """The change in flight: a submit is wholly there (same command) or wholly absent."""
    what, detail = acked.in_flight
    if what != "submit":
        return []
    key, command = detail
    r = http.post(
        "/v1/jobs",
        headers=CLIENT,
        json={
            "command": ["true"],
            "device_id": DEVICE,
            "submitter": "crash",
            "idempotency_key": key,
        },
    )
    if r.status_code not in (200, 201):
        return [f"resubmitting in-flight key {key}: {r.status_code} {r.text}"]
    got = r.json()["command"]
    # Absent: the resubmit created it with ["true"]; present: the original command.
    return [] if got in (command, ["true"]) else [f"in-flight submit {key} became {got}"]


def trial(point: str, n: int, tmp: Path, tag: str = "t", max_rounds: int = 20) -> Outcome:
    """One crash at ``point`` (its ``n``-th hit), the restart and every check."""
    t0 = time.monotonic()
    tmp.mkdir(parents=True, exist_ok=True)
    ctl = Controller(tmp, _free_port())
    fast = "sweep_interval=0.1,schedule_interval=0.2"
    ctl.start({crashpoints.VARIABLE: f"{point}:{n}", "RC_TEST_TIMINGS": fast})
    acked = Acked()
    driver = Driver(ctl.url, acked)
    problems: list[str] = []
    try:
        with contextlib.suppress(Died):
            for r in range(max_rounds):
                if ctl.proc is not None and ctl.proc.poll() is not None:
                    break
                driver.round(r, tag)
            else:
                problems.append(f"{point}:{n} not reached in {max_rounds} rounds")
    finally:
        driver.close()
    status = ctl.wait_exit(10)
    if status is None:
        ctl.stop()
    crashed = status == crashpoints.CRASH_STATUS
    if not crashed and not problems:
        problems.append(f"controller exited {status}, not {crashpoints.CRASH_STATUS}")
    db = tmp / "data" / "rc.db"
    checked = integrity(db)
    if checked != "ok":
        problems.append(f"integrity_check: {checked}")
    ctl.start({"RC_TEST_TIMINGS": fast})
    lost: list[str] = []
    bad: list[str] = []
    try:
        with httpx.Client(base_url=ctl.url, timeout=10) as http:
            lost = lost_changes(http, acked)
            bad = inconsistencies(db)
            problems += in_flight_problems(http, acked)
        # The restarted controller still works: one more whole round.
        after = Acked()
        d2 = Driver(ctl.url, after)
        try:
            _settle(d2)
            d2.round(max_rounds, tag + "-after")
        except (Died, AssertionError) as exc:
            problems.append(f"restarted controller failed a round: {exc}")
        finally:
            d2.close()
    finally:
        ctl.stop(hard=not problems)
    problems += lost + bad
    return Outcome(
        point, n, crashed, checked, acked_count(acked), lost, bad, problems, time.monotonic() - t0
    )


def _settle(d: Driver) -> None:
    """End what the crash left active, as the restarted worker's recovery would.

    The driver's worker re-registers (a restart with the same boot ID); a job that was
    active is then reported ``lost`` by the worker's recovery in real life. Here the
    job's owner reports it ended, so the device is free for the next round.
    """
    wid = d.register()
    jobs = d.http.get("/v1/jobs?limit=200", headers=CLIENT).json()["jobs"]
    for j in jobs:
        if j["state"] in ACTIVE and j["worker_id"] == wid:
            d.status(wid, str(j["id"]), "failed", 1)
    # Drain anything handed out meanwhile.
    d.poll(wid)
    for j in d.http.get("/v1/jobs?limit=200", headers=CLIENT).json()["jobs"]:
        if j["state"] in ACTIVE and j["worker_id"] == wid:
            d.status(wid, str(j["id"]), "failed", 1)


def every_point() -> Iterator[str]:
    yield from sorted(crashpoints.POINTS)
