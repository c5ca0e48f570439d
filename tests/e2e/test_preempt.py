"""Preemption end to end (EXT-PREEMPT-1..3): real ``rc serve`` and ``rc worker`` processes, a
preemptible job on the only device stopped for a job that is not, then run again."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from .cluster import Cluster, wait_for

#: The victim: its first attempt traps SIGTERM, says so and would take 7 s to stop, longer
#: than its own grace (2 s: SIGKILL ends it first); the second attempt succeeds at once.
VICTIM = """
if [ -e {mark} ]; then echo attempt-two; exit 0; fi
touch {mark}
trap 'date +%s.%N > {termed}; echo got-term; sleep 7; echo trap-done; exit 143' TERM
echo attempt-one
while :; do sleep 0.1; done
"""


def test_a_waiting_job_preempts_a_preemptible_one_which_runs_again(cluster: Cluster) -> None:
    cluster.start_controller("--preempt-min-runtime", "0s", "--preempt-grace", "20s")
    cluster.start_worker("box", ["gpu0"])
    mark, termed = cluster.tmp / "mark", cluster.tmp / "termed"
    script = VICTIM.format(mark=mark, termed=termed)
    victim = cluster.popen_rc(
        "run", "--preemptible", "--preempt-grace", "2s", "--", "sh", "-c", script
    )
    victim_id = wait_for(
        lambda: next((j["id"] for j in cluster.api("GET", "/v1/state")[1]["jobs"]), None),
        20,
        "the victim to run",
    )
    wait_for(mark.exists, 20, "the victim's first attempt")
    submitted = time.time()
    real = cluster.popen_rc("run", "--", "echo", "real-ran")
    wait_for(termed.exists, 10, "the victim's SIGTERM")
    assert float(termed.read_text()) - submitted <= 1.0, cluster.logs()  # EXT-PREEMPT-2
    view = wait_for(lambda: waiting_view(cluster, victim_id), 10, "the waiting job's waiting_for")
    assert view["waiting_for"] == [{"preempting": [victim_id]}], view
    assert cluster.job(victim_id)["preempted_by"] == view["job"]["id"]
    out, err = real.communicate(timeout=60)
    assert real.returncode == 0 and out == "real-ran\n", (err, cluster.logs())
    assert "preempting job" in err, err
    out, err = victim.communicate(timeout=60)
    assert victim.returncode == 0, (out, err, cluster.logs())
    said = [line for line in out.splitlines() if line.startswith(("attempt-", "got-", "trap-"))]
    assert said == ["attempt-one", "got-term", "attempt-two"], (out, err)
    assert f"attempt 1 preempted by job {view['job']['id']}; queued again" in err, err
    ended = cluster.job(victim_id)
    assert ended["state"] == "succeeded" and ended["preemptions"] == 1, ended
    first = ended["attempts"][0]
    assert first["state"] == "preempted", ended
    assert first["kill_reason"] == f"preempted by {view['job']['id']}", ended
    request = urllib.request.Request(
        cluster.url + "/metrics", headers={"Authorization": "Bearer ctok"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert "rc_preemptions_total 1.0" in answer.read().decode()  # EXT-PREEMPT-3


def waiting_view(cluster: Cluster, victim_id: str) -> dict[str, Any] | None:
    """The view of the queued job that is not the victim, once it waits for something."""
    queued = cluster.api("GET", "/v1/state")[1]["queued"]
    other = next((j for j in queued if j["id"] != victim_id), None)
    if other is None:
        return None
    status, view = cluster.api("GET", f"/v1/jobs/{other['id']}")
    return view if status == 200 and view.get("waiting_for") else None
