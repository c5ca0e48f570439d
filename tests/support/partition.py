"""One partition trial: a worker running a job is cut off from the controller by a proxy.

A real ``rc serve`` and a real ``rc worker`` whose ``controller_url`` is a
``FaultProxy``. Job A runs on the worker's one device (it holds the device's ``flock``
record for longer than the write-off), job B waits for the same device. The proxy
black-holes; the trial samples the device and B every ``sample`` seconds and records
when the device went ``unknown`` and ``unhealthy``, measured from the worker's last
bytes through the proxy (its last heartbeat) and from the partition's start. Then the
proxy heals and the trial watches for the worker's proof and B's grant.

A grant before proof is B leaving the queue while the device has no recorded recovery
and was never seen back ``ready``: a silent device must stay out of the pool until its
worker proves it idle (STORE-101/102, WRK-141). The flock records of A and B are
checked too: B must never hold the device while A still does.

Timings are the spec's (grace 30 s, write-off 300 s, sweep 10 s, heartbeat 10 s)
multiplied by ``scale``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.cluster import RC, Cluster, free_port, stop, wait_for
from support.history import FlockRecorder, History, check, parse_ts
from support.nemesis import FaultProxy

GRACE, UNHEALTHY_AFTER, SWEEP, HEARTBEAT = 30.0, 300.0, 10.0, 10.0
DEVICE = "part:gpu0"
#: Seconds a controller or worker may take to come up on a loaded machine.
START_TIMEOUT = 120.0


@dataclass
class TrialResult:
    """Seconds from the worker's last contact (and from the partition's start)."""

    unknown_after: float | None = None
    unhealthy_after: float | None = None
    unknown_after_partition: float | None = None
    unhealthy_after_partition: float | None = None
    grants_before_proof: int = 0
    exclusivity_violations: int = 0
    recovered: bool = False
    b_granted: bool = False
    reason: str = ""
    #: Job A's state at the end: the write-off made it ``lost`` and a late report from
    #: the healed worker must not change that.
    a_final: str = ""
    notes: list[str] = field(default_factory=list)


def _timings(scale: float) -> dict[str, float]:
    return {
        "grace": GRACE * scale,
        "unhealthy_after": UNHEALTHY_AFTER * scale,
        "sweep_interval": SWEEP * scale,
        "hold_off": GRACE * scale,
        "heartbeat": HEARTBEAT * scale,
    }


def fine_windows(t: dict[str, float]) -> list[tuple[float, float]]:
    """Seconds of silence around each expected verdict, where ``trial``'s coarse sampling
    gives way to the fine one: from half a sweep and the 1 s of heartbeat truncation
    (STORE-004) before it to two sweeps after it."""
    return [
        (t[k] - t["sweep_interval"] / 2 - 1, t[k] + 2 * t["sweep_interval"] + 1)
        for k in ("grace", "unhealthy_after")
    ]


def trial(
    tmp: Path,
    scale: float = 1.0,
    sample: float = 0.1,
    heal_wait: float = 0.0,
    coarse: float | None = None,
    startup: threading.Semaphore | None = None,
) -> TrialResult:
    """Run one trial in ``tmp``; every process is stopped by PID before returning.

    The device is looked at every ``sample`` seconds; with ``coarse`` set, only every
    ``coarse`` seconds outside ``fine_windows`` (many trials side by side then cost
    the controllers little CPU, and a verdict outside its window is still seen, to
    ``coarse`` seconds). ``startup``, shared by trials run side by side, lets only so
    many bring their controller and worker up at once: many Python start-ups at the
    same moment can each outlast any timeout."""
    t = _timings(scale)
    tmp.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(tmp=tmp, port=free_port())
    rec = FlockRecorder(tmp / "locks")
    result = TrialResult()
    proxy: FaultProxy | None = None
    try:
        ctl_env = ",".join(
            f"{k}={t[k]:.3f}" for k in ("grace", "unhealthy_after", "sweep_interval", "hold_off")
        )
        with startup or contextlib.nullcontext():
            _start_controller(cluster, {"RC_TEST_TIMINGS": ctl_env})
            proxy = FaultProxy(cluster.port).start()
            _start_worker(cluster, proxy, t, scale)
        hold = t["unhealthy_after"] + 4 * t["heartbeat"] + 2
        status, a = cluster.api(
            "POST",
            "/v1/jobs",
            {"command": rec.command(f"sleep {hold:.1f}"), "device_id": DEVICE, "submitter": "part"},
        )
        assert status == 201, a
        cluster.wait_job(a["id"], lambda j: j["state"] == "running", timeout=90)
        status, b = cluster.api(
            "POST",
            "/v1/jobs",
            {"command": rec.command("true"), "device_id": DEVICE, "submitter": "part"},
        )
        assert status == 201 and b["state"] == "queued", b
        # A heartbeat has gone through since A started: the worker is known to be alive.
        time.sleep(t["heartbeat"] * 1.5)
        proxy.set("blackhole")
        started = time.time()
        last = proxy.last_forwarded["up"]
        proof = False
        deadline = started + t["unhealthy_after"] * 1.5 + 10
        windows = fine_windows(t)
        while time.time() < deadline and result.unhealthy_after is None:
            proof = _sample(cluster, b["id"], started, last, result, proof)
            silent = time.time() - last
            fine = any(lo <= silent <= hi for lo, hi in windows)
            time.sleep(sample if fine or coarse is None else coarse)
        proxy.set("pass")
        heal_until = time.time() + heal_wait
        while time.time() < heal_until and not result.b_granted:
            proof = _sample(cluster, b["id"], started, last, result, proof)
            time.sleep(sample)
        result.recovered = proof
        time.sleep(t["heartbeat"] * 2)  # the outbox delivers A's late terminal report
        result.a_final = str(cluster.job(a["id"])["state"])
        intervals, refusals = rec.read()
        history = History(intervals=intervals, refusals=refusals)
        result.exclusivity_violations = check(history).figures()["exclusivity_violations"]
    finally:
        if proxy is not None:
            proxy.stop()
        for proc in reversed(cluster.procs):
            stop(proc)
    return result


def _start_controller(cluster: Cluster, env: dict[str, str]) -> None:
    """``rc serve`` as ``Cluster.start_controller`` starts it, but given
    ``START_TIMEOUT``: on a loaded machine a start-up can outlast ``Cluster``'s 15 s,
    which says nothing about partitions."""
    log = open(cluster.tmp / "controller.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [RC, "serve", "--addr", f"127.0.0.1:{cluster.port}", "--data", str(cluster.tmp / "data")],
        env=dict(os.environ, RC_TOKENS="wtok:worker,ctok:client,atok:admin", **env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    cluster.procs.append(proc)
    cluster.controller = proc

    def up() -> bool:
        with contextlib.suppress(OSError):
            return cluster.api("GET", "/v1/state")[0] == 200
        return False

    wait_for(up, START_TIMEOUT, "the controller to answer")


def _start_worker(cluster: Cluster, proxy: FaultProxy, t: dict[str, float], scale: float) -> None:
    cfg = cluster.tmp / "worker-part.yaml"
    cfg.write_text(
        f"controller_url: {proxy.url}\ntoken: wtok\nhost: part\n"
        f"heartbeat_interval: {max(1, round(t['heartbeat'] * 1000))}ms\n"
        f"state_dir: {cluster.tmp / 'state-part'}\ndevices:\n  - gpu0\n"
    )
    # The worker's own silence rules scale with the controller's (WRK-151).
    wt = f"reregister_after={UNHEALTHY_AFTER * scale:.3f},reregister_jitter={max(0.1, 30 * scale):.3f}"
    log = open(cluster.tmp / "worker-part.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [RC, "worker", "-c", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, RC_TEST_TIMINGS=wt),
    )
    log.close()
    cluster.procs.append(proc)

    def registered() -> bool:
        status, views = cluster.api("GET", "/v1/devices")
        return status == 200 and any(v["device"]["id"] == DEVICE for v in views)

    wait_for(registered, START_TIMEOUT, "the partitioned worker to register")


def _sample(
    cluster: Cluster, b_id: str, started: float, last: float, result: TrialResult, proof: bool
) -> bool:
    """One look at the device and at B; returns whether a proof has been seen."""
    now = time.time()
    with contextlib.suppress(OSError):
        status, views = cluster.api("GET", "/v1/devices")
        if status != 200:
            return proof
        view: dict[str, Any] = next(v for v in views if v["device"]["id"] == DEVICE)
        state = view["device"]["state"]
        if state == "unknown" and result.unknown_after is None:
            result.unknown_after = now - last
            result.unknown_after_partition = now - started
        if state == "unhealthy" and result.unhealthy_after is None:
            result.unhealthy_after = now - last
            result.unhealthy_after_partition = now - started
            result.reason = str(view.get("quarantine_reason") or "")
        if state == "ready" and result.unhealthy_after is not None:
            proof = True
        job = cluster.job(b_id)
        if job["state"] != "queued" and not result.b_granted:
            result.b_granted = True
            if not proof and not _recovered_before(cluster, parse_ts(job.get("started_at"))):
                result.grants_before_proof += 1
                result.notes.append(f"B {job['state']} at +{now - started:.1f}s with no proof")
            proof = proof or result.grants_before_proof == 0
    return proof


def _recovered_before(cluster: Cluster, at: float | None) -> bool:
    status, desc = cluster.api("GET", f"/v1/devices/{DEVICE}/describe")
    if status != 200:
        return False
    recoveries = (desc.get("recoveries") or {}).get("recoveries") or []
    times = [parse_ts(r["at"]) or 0.0 for r in recoveries]
    return any(at is None or rt <= at for rt in times)
