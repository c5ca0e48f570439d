"""Several devices per job end to end: rc serve, rc worker and rc run as real processes.

EXT-GANG-1..6: every job takes ``flock -n`` on a lock file for each device it was given
(``RC_DEVICES``) and fails loudly if one is refused, so a device shared by two jobs, or
a job started on fewer devices than it asked for, shows as a failed run. The job also
checks its environment (EXT-GANG-4). A two-device job behind a stream of one-device
jobs must start before any one-device job submitted after it (EXT-GANG-3).
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .cluster import Cluster, wait_for

JOB_LINE = re.compile(r"rc: job (\S+) on (\S+)")

#: Lock every device of RC_DEVICES with flock -n on its own descriptor (3, 4, ...),
#: hold them briefly, and check the environment: $1 is the count asked for.
SCRIPT = r"""
n=0; fd=3
for d in $(echo "$RC_DEVICES" | tr , ' '); do
  eval "exec $fd>\"$LOCKS/$d\""
  flock -n "$fd" || { echo "VIOLATION: $d is locked by another job"; exit 99; }
  n=$((n+1)); fd=$((fd+1))
done
[ "$n" = "$1" ] || { echo "BADENV: asked for $1 devices, got RC_DEVICES=$RC_DEVICES"; exit 98; }
first=${RC_DEVICES%%,*}
[ "$RC_DEVICE" = "$first" ] || { echo "BADENV: RC_DEVICE=$RC_DEVICE"; exit 98; }
want=$(echo "$RC_DEVICES" | sed 's/[^,]*:gpu//g')
[ "$CUDA_VISIBLE_DEVICES" = "$want" ] || { echo "BADENV: CUDA=$CUDA_VISIBLE_DEVICES"; exit 98; }
sleep 0.1
echo "OK $RC_DEVICES"
"""


def test_mixed_one_and_two_device_jobs_from_eight_clients_never_share(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_controller()
    cluster.start_worker("hosta", ["gpu0", "gpu1", "gpu2"])
    cluster.start_worker("hostb", ["gpu0", "gpu1"])
    locks = tmp_path / "locks"
    locks.mkdir()

    def one(i: int) -> tuple[int, int, str, str]:
        count = 2 if i % 2 else 1
        flags = ["--count", "2"] if count == 2 else []
        r = cluster.rc(
            "run",
            *flags,
            "--env",
            f"LOCKS={locks}",
            "--",
            "sh",
            "-c",
            SCRIPT,
            "x",
            str(count),
            timeout=180,
        )
        return count, r.returncode, r.stdout, r.stderr

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(32)))
    refused = [r for r in results if "VIOLATION" in r[2] or r[1] == 99]
    assert refused == [], (refused, cluster.logs())
    bad_env = [r for r in results if "BADENV" in r[2]]
    assert bad_env == [], bad_env
    pairs = set()
    for count, code, out, err in results:
        assert code == 0, (count, code, out, err)
        m = JOB_LINE.search(err)
        assert m, err
        devices = m.group(2).split(",")
        assert len(devices) == count, err
        assert len({d.split(":")[0] for d in devices}) == 1  # one host (EXT-GANG-1)
        assert f"OK {','.join(devices)}" in out
        if count == 2:
            pairs.add(m.group(2))
        # The job view carries the list beside device_id, its first (EXT-GANG-6).
        job = cluster.job(m.group(1))
        assert job["device_ids"] == devices and job["device_id"] == devices[0]
        assert job["state"] == "succeeded"
    assert pairs  # two-device jobs really ran
    _, state = cluster.api("GET", "/v1/state")
    assert {v["device"]["state"] for v in state["devices"]} == {"ready"}


def _passes(cluster: Cluster) -> float:
    """Scheduling passes run by the controller's loop so far (EXT-METRICS-1)."""
    import urllib.request

    req = urllib.request.Request(cluster.url + "/metrics", headers={"Authorization": "Bearer ctok"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(r"^rc_scheduling_pass_seconds_count (\S+)$", text, re.M)
    assert m, text[:2000]
    return float(m.group(1))


def test_a_two_device_job_behind_a_stream_of_one_device_jobs_starts_soon(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0", "gpu1", "gpu2", "gpu3"])
    body = {"command": ["sleep", "0.3"], "submitter": "stream"}
    stop = threading.Event()
    submitted: list[tuple[float, str]] = []

    def stream() -> None:
        # Keep the queue longer than the fleet: a new one-device job every 50 ms.
        while not stop.is_set():
            sent = time.monotonic()
            status, job = cluster.api("POST", "/v1/jobs", body)
            assert status == 201, job
            submitted.append((sent, str(job["id"])))
            stop.wait(0.05)

    feeder = threading.Thread(target=stream)
    feeder.start()
    try:
        wait_for(
            lambda: len(cluster.api("GET", "/v1/state")[1]["queued"] or []) >= 4,
            20,
            "a queue behind four busy devices",
        )
        before = _passes(cluster)
        t0 = time.monotonic()
        status, gang = cluster.api(
            "POST", "/v1/jobs", {"command": ["true"], "submitter": "gang", "count": 2}
        )
        assert status == 201, gang
        answered = time.monotonic()
        started = cluster.wait_job(str(gang["id"]), lambda j: j["state"] != "queued", 30)
        waited = time.monotonic() - t0
        passes = _passes(cluster) - before
    finally:
        stop.set()
        feeder.join(timeout=30)
    assert started["state"] in ("assigned", "running", "succeeded"), started
    assert len(started["device_ids"]) == 2
    # Bounded: the gang needs two of the four 0.3 s jobs to end; a handful of passes.
    assert waited < 15, waited
    assert passes <= 40, passes
    # No one-device job sent after the gang was queued was granted before it
    # (EXT-GANG-3): lease epochs strictly increase in grant order (EXT-EPOCH-1).
    later = [job_id for sent, job_id in submitted if sent > answered]
    assert later
    for job_id in later:
        epoch = cluster.job(job_id).get("lease_epoch")
        assert epoch is None or epoch > started["lease_epoch"], (job_id, epoch, started)
