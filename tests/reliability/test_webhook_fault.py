"""A webhook receiver that never answers costs notifications and nothing else (HOOKN-006).

A real ``rc serve`` posts its events to a loopback receiver that is dead (listens,
never accepts) or silent (accepts, never answers). The test raises more events than
the queue holds (fault reports on a sacrificial device, one ``device_unhealthy``
each, HOOKN-012a) and checks: every report is answered at once (raising never blocks,
HOOKN-003); the queue's overflow is dropped and counted, so at most 256 queued plus
the one being tried are outstanding; jobs on the other device are still granted and
finish; and shutdown gives up on the receiver after its 5 s drain (HOOKN-040). The
long version is ``bench/chaos.py`` (phase 1 with a slow receiver under kills, phase 3
a dead one beside 16 clients).
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.cluster import Cluster, free_port, stop
from support.receiver import Receiver, ReceiverMode, webhook_counts

pytestmark = pytest.mark.e2e

QUEUE = 256
EVENTS = QUEUE + 60
FAULTED = "hk:gpu1"


def _metrics(cluster: Cluster) -> dict[str, float]:
    req = urllib.request.Request(cluster.url + "/metrics", headers={"Authorization": "Bearer ctok"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return webhook_counts(resp.read().decode())


def _fault(cluster: Cluster, n: int) -> tuple[int, float]:
    began = time.monotonic()
    status, _ = cluster.api(
        "POST", f"/v1/devices/{FAULTED}/fault", {"reason": f"flood {n}"}, token="wtok"
    )
    return status, time.monotonic() - began


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["dead", "silent"])
def test_a_receiver_that_never_answers_costs_events_not_grants(
    tmp_path: Path, mode: ReceiverMode
) -> None:
    with Receiver(mode) as hook:
        cluster = Cluster(tmp=tmp_path, port=free_port())
        try:
            ctl = cluster.start_controller("--webhook-url", hook.url)
            cluster.start_worker("hk", ["gpu0", "gpu1"])
            began = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda n: _fault(cluster, n), range(EVENTS)))
            flood = time.monotonic() - began
            assert [s for s, _ in answers] == [200] * EVENTS
            # Raising never waits for the receiver: were a report held for its event's
            # delivery (a 10 s attempt at least), 316 reports over 8 connections would
            # take over 6 minutes. The bounds are generous for a loaded machine.
            assert max(t for _, t in answers) < 30, max(t for _, t in answers)
            assert flood < 120, flood

            counts = _metrics(cluster)
            assert counts["delivered"] == 0, counts
            dropped = sum(v for k, v in counts.items() if k.startswith("dropped_"))
            # At most the queue plus the one being tried are still outstanding.
            assert EVENTS - dropped <= QUEUE + 1, counts
            assert counts.get("dropped_queue_full", 0) >= EVENTS - QUEUE - 1, counts

            # Grants go on while the delivery task is stuck on the receiver.
            for _ in range(5):
                status, job = cluster.api(
                    "POST",
                    "/v1/jobs",
                    {"command": ["true"], "device_id": "hk:gpu0", "submitter": "hook"},
                )
                assert status == 201, job
                cluster.wait_job(job["id"], lambda j: j["state"] == "succeeded", timeout=20)

            # Shutdown drains for at most 5 s, then gives the rest up (HOOKN-040).
            began = time.monotonic()
            ctl.send_signal(signal.SIGTERM)
            ctl.wait(30)
            assert time.monotonic() - began < 20
            log = (tmp_path / "controller.log").read_text()
            assert "webhook queue full" in log
            assert "webhook drain gave up" in log
        finally:
            for proc in reversed(cluster.procs):
                stop(proc)
    if mode == "silent":
        assert hook.accepted >= 1 and hook.received, "the silent receiver read no request"
    else:
        assert hook.accepted == 0 and not hook.received
