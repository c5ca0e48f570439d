"""Real workers on one machine: default state directories, quiet logs, handoff.

- EXT-OUTBOX-1: workers with no ``state_dir`` get one per host name, so two with
  different ``host:`` both start and serve; a second worker with the same host meets
  the lock and exits non-zero naming ``state_dir``.
- EXT-METRICS-2: at the default level a short session logs events, not requests or
  migration steps.
- EXT-FAST-4: the handoff of a device from a 1 s job to a queued one under
  ``poll_wait: 1s`` is printed (measured, never asserted; see bench/handoff.py).

The default state directory of root is global (``/var/lib/rc-worker/<host>``), so these
tests use host names no one else uses and remove the directories they made. For anyone
else the default is under ``$XDG_STATE_HOME``, which the workers here get pointed at
the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from resource_controller.worker import config as worker_config

from .cluster import RC, Cluster, stop, wait_for


@pytest.fixture
def hosts(cluster: Cluster, tmp_path: Path) -> Iterator[list[str]]:
    """Fresh host names; their default state directories are removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = [f"e2e-{tag}-a", f"e2e-{tag}-b"]
    yield names
    for proc in reversed(cluster.procs):
        stop(proc)  # before their directories go
    for host in names:
        directory = Path(worker_config.default_state_dir(host, environ=_worker_env(tmp_path)))
        if directory.name == host:
            shutil.rmtree(directory, ignore_errors=True)


def _worker_env(tmp_path: Path) -> dict[str, str]:
    """The workers' environment: a non-root default state_dir lands under tmp_path."""
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "xdg-state"))


def _start_worker(
    cluster: Cluster, host: str, devices: list[str], extra: str = "", name: str = ""
) -> tuple[subprocess.Popen[bytes], Path]:
    """A worker whose config has no ``state_dir``; returns it and its log file."""
    name = name or host
    cfg = cluster.tmp / f"worker-{name}.yaml"
    cfg.write_text(
        f"controller_url: {cluster.url}\ntoken: wtok\nhost: {host}\nheartbeat_interval: 1s\n"
        + "devices:\n"
        + "".join(f"  - {d}\n" for d in devices)
        + extra
    )
    log_path = cluster.tmp / f"worker-{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [RC, "worker", "-c", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_worker_env(cluster.tmp),
    )
    cluster.procs.append(proc)
    return proc, log_path


def _registered(cluster: Cluster, device_ids: list[str]) -> bool:
    status, views = cluster.api("GET", "/v1/devices")
    ids = {v["device"]["id"] for v in views} if status == 200 else set()
    return all(d in ids for d in device_ids)


def test_two_hosts_on_one_machine_each_get_a_state_dir(
    cluster: Cluster, hosts: list[str], tmp_path: Path
) -> None:  # EXT-OUTBOX-1
    cluster.start_controller()
    a, b = hosts
    _start_worker(cluster, a, ["gpu0"])
    _start_worker(cluster, b, ["gpu0"])
    wait_for(lambda: _registered(cluster, [f"{a}:gpu0", f"{b}:gpu0"]), 20, "both workers")
    for host in hosts:
        r = cluster.rc("run", "-d", f"{host}:gpu0", "--", "sh", "-c", "echo on $RC_DEVICE")
        assert r.returncode == 0, (r.stderr, cluster.logs())
        assert r.stdout.strip() == f"on {host}:gpu0"
        state = Path(worker_config.default_state_dir(host, environ=_worker_env(tmp_path)))
        assert state.name == host and (state / "lock").is_file()


def test_a_second_worker_for_the_same_host_names_state_dir(
    cluster: Cluster, hosts: list[str]
) -> None:  # EXT-OUTBOX-1
    cluster.start_controller()
    host = hosts[0]
    first, _ = _start_worker(cluster, host, ["gpu0"])
    wait_for(lambda: _registered(cluster, [f"{host}:gpu0"]), 20, "the first worker")
    second, log_path = _start_worker(cluster, host, ["gpu1"], name=host + "-again")
    assert second.wait(20) != 0
    text = log_path.read_text()
    assert re.search(r"^rc: state_dir \S+ is in use by another worker process", text, re.M), text
    assert "own state_dir" in text
    assert first.poll() is None  # the first one serves on
    r = cluster.rc("run", "-d", f"{host}:gpu0", "--", "true")
    assert r.returncode == 0, r.stderr


REQUEST_LINE = re.compile(r"HTTP Request:|\"(GET|POST|PUT|DELETE) /v1/|alembic", re.I)


def test_a_short_session_logs_events_not_requests(
    cluster: Cluster, hosts: list[str]
) -> None:  # EXT-METRICS-2
    cluster.start_controller()
    host = hosts[0]
    worker, worker_log = _start_worker(cluster, host, ["gpu0"], extra="poll_wait: 1s\n")
    wait_for(lambda: _registered(cluster, [f"{host}:gpu0"]), 20, "the worker")
    for _ in range(2):
        r = cluster.rc("run", "-d", f"{host}:gpu0", "--", "true")
        assert r.returncode == 0, r.stderr
    time.sleep(2.5)  # a few idle polls and heartbeats
    assert stop(worker) == 0
    assert cluster.controller is not None
    stop(cluster.controller)
    controller_text = (cluster.tmp / "controller.log").read_text()
    worker_text = worker_log.read_text()
    print(f"\ncontroller log ({len(controller_text.splitlines())} lines):\n{controller_text}")
    print(f"worker log ({len(worker_text.splitlines())} lines):\n{worker_text}")
    for text in (controller_text, worker_text):
        assert not [line for line in text.splitlines() if REQUEST_LINE.search(line)], text
    assert "registered as worker" in worker_text and f"(host {host}," in worker_text
    assert worker_text.count(": starting on ") == 2
    assert len(worker_text.splitlines()) <= 12, worker_text


def _handoff_once(cluster: Cluster, device: str, seconds: float) -> float:
    """A's exit to B's start on one device: each job prints the instant (ns)."""
    body = {"device_id": device, "submitter": "e2e"}
    _, a = cluster.api(
        "POST", "/v1/jobs", {**body, "command": ["sh", "-c", f"sleep {seconds}; date +%s%N"]}
    )
    _, b = cluster.api("POST", "/v1/jobs", {**body, "command": ["date", "+%s%N"]})
    ends = ("succeeded", "failed", "killed", "lost")
    stamps = []
    for job in (a, b):
        job_id = str(job["id"])
        done = cluster.wait_job(job_id, lambda j: j["state"] in ends, timeout=30)
        assert done["state"] == "succeeded", done
        req = urllib.request.Request(
            cluster.url + f"/v1/jobs/{job_id}/logs?follow=false",
            headers={"Authorization": "Bearer ctok"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            stamps.append(int(resp.read().split()[-1]))
    return (stamps[1] - stamps[0]) / 1e9


def test_handoff_under_a_short_poll_wait(cluster: Cluster, hosts: list[str]) -> None:
    """EXT-FAST-4: printed, never asserted (bench/handoff.py measures it properly)."""
    cluster.start_controller()
    host = hosts[0]
    _start_worker(cluster, host, ["gpu0"], extra="poll_wait: 1s\n")
    wait_for(lambda: _registered(cluster, [f"{host}:gpu0"]), 20, "the worker")
    samples = [_handoff_once(cluster, f"{host}:gpu0", 1.0) for _ in range(3)]
    print(
        "\nhandoff after a 1 s job under poll_wait 1s: median "
        f"{statistics.median(samples) * 1e3:.1f} ms "
        f"(min {min(samples) * 1e3:.1f}, max {max(samples) * 1e3:.1f}, n={len(samples)})"
    )
