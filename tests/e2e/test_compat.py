"""A reference (Go) worker's registration with null device maps, against real processes.

EXT-COMPAT-1/-2: the reference worker declares devices by bare name and so sends
``"declared_labels": {"gpu0": null, "gpu1": null}``. Against a real ``rc serve``, that
registration must give devices that become ``ready`` and run a job submitted with a
real ``rc run``. The worker's side is played over HTTP with the reference worker's own
body shapes (interop/reference-worker-session.jsonl): raw log bytes sent as
``application/json``, reports without an epoch, null lists in a heartbeat.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from .cluster import Cluster, wait_for

#: The captured registration body (interop/reference-worker-register-bare-devices.jsonl).
REGISTRATION = (
    '{"host":"box-a","boot_id":"92c6ae9b-2159-402b-8169-ff29d95954b0",'
    '"recovery":{"survivors_checked":true,"survivors_found":true},'
    '"devices":[{"name":"gpu0"},{"name":"gpu1"}],'
    '"labels":{"":{"cpus":"2","disk_free_bytes":"83889623040","kernel":"6.18.44-fc-v669",'
    '"mem_total_bytes":"25276502016"},"gpu0":{},"gpu1":{}},'
    '"declared_labels":{"gpu0":null,"gpu1":null},"sheet":"",'
    '"device_sheets":{"gpu0":"","gpu1":""}}'
)


def raw(cluster: Cluster, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request as the Go worker sends it: worker token, ``application/json``."""
    req = urllib.request.Request(
        cluster.url + path,
        data=body if method == "POST" else None,
        method=method,
        headers={"Authorization": "Bearer wtok", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_reference_registration_with_null_declared_labels_runs_a_job(cluster: Cluster) -> None:
    cluster.start_controller()
    status, body = raw(cluster, "POST", "/v1/workers/register", REGISTRATION.encode())
    assert status == 200, body
    wid = json.loads(body)["worker_id"]

    def devices_ready() -> bool:
        _, views = cluster.api("GET", "/v1/devices")
        return [v["device"]["state"] for v in views] == ["ready", "ready"]

    wait_for(devices_ready, 10, "both devices ready")

    run = cluster.popen_rc("run", "-d", "box-a:gpu0", "--", "echo", "hi")
    try:

        def assignment() -> dict[str, object] | None:
            st, answer = raw(cluster, "GET", f"/v1/workers/{wid}/assignments?wait=1s")
            if st != 200:
                return None
            found: list[dict[str, object]] = json.loads(answer)["assignments"]
            return found[0] if found else None

        a = wait_for(assignment, 20, "the job's assignment")
        assert a["command"] == ["echo", "hi"] and a["device_id"] == "box-a:gpu0", a
        job = str(a["job_id"])
        report = {"state": "running", "worker_id": wid}
        assert raw(cluster, "POST", f"/v1/jobs/{job}/status", json.dumps(report).encode())[0] == 200
        beat = json.dumps({"running_job_ids": [job], "pending_job_ids": None}).encode()
        assert raw(cluster, "POST", f"/v1/workers/{wid}/heartbeat", beat)[0] == 200
        assert raw(cluster, "POST", f"/v1/jobs/{job}/logs", b"hi\n")[0] == 200
        done = {"exit_code": 0, "state": "succeeded", "worker_id": wid}
        assert raw(cluster, "POST", f"/v1/jobs/{job}/status", json.dumps(done).encode())[0] == 200
        beat = json.dumps({"running_job_ids": None}).encode()
        assert raw(cluster, "POST", f"/v1/workers/{wid}/heartbeat", beat)[0] == 200

        out, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=5)
    assert run.returncode == 0, (out, err, cluster.logs())
    assert out == "hi\n", (out, err)
    assert cluster.job(job)["state"] == "succeeded"
    wait_for(devices_ready, 10, "gpu0 back to ready")
