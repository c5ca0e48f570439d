"""``rc run --after``, and what ``rc run``, ``rc ps`` and ``rc run --explain`` say about a
submitter limit (EXT-SHARE-1, EXT-SHARE-2), against a live controller and a fake worker."""

from __future__ import annotations

import re
import signal

import pytest

from cli.conftest import Rc, Spawn
from cli.test_live import occupy, wait_state
from client.live import CLIENT, FakeWorker, LiveController, run_for_real
from resource_controller.client import api
from resource_controller.core.share import SubmitterLimits


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "tester"}


@pytest.fixture
def client(controller: LiveController) -> api.JsonClient:
    return api.JsonClient(controller.url, CLIENT, submitter="tester")


def test_run_after_a_prefix_waits_for_it_then_runs(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    worker.behaviour = run_for_real
    first = client.submit(["sleep", "1"], device="box:gpu0")
    result = run_rc("run", "--after", first["id"][:8], "--", "echo", "second", env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "second\n"
    queued = (
        f"rc: queued at position 1 for any device — after job {first['id'][:8]}…, not ended yet"
    )
    assert result.stderr.splitlines()[0] == queued, result.stderr
    assert client.get_job(first["id"]).job["state"] == "succeeded"


def test_run_after_a_failed_job_exits_as_a_killed_job(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    worker.behaviour = run_for_real
    first = client.submit(["false"], device="box:gpu0")
    wait_state(client, first["id"], "failed")
    result = run_rc("run", "--after", first["id"], "--", "echo", "never", env=env)
    assert result.exit_code == 1 and result.stdout == ""
    assert f"never started on any device: dependency_failed: {first['id']}" in result.stderr


def test_run_after_an_unknown_job_is_refused(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker
) -> None:
    prefix = run_rc("run", "--after", "abcdef12", "--", "true", env=env)
    assert prefix.exit_code == 1 and "no job ID starts with 'abcdef12'" in prefix.stderr
    full = "00000000-0000-4000-8000-000000000000"
    unknown = run_rc("run", "--after", full, "--", "true", env=env)
    assert unknown.exit_code == 1 and f"no job has the ID '{full}'" in unknown.stderr


def test_ctrl_c_while_waiting_for_a_job_cancels(
    spawn_rc: Spawn, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    """A job waiting for others is queued like any other (CLI-109)."""
    blocker = occupy(client, worker, "box:gpu0")
    background = spawn_rc("run", "--after", blocker, "--", "true", env=env)
    background.said("queued at position")  # rc is in its queue wait
    waiting = [j for j in client.state()["queued"] if j.get("after") == [blocker]]
    assert len(waiting) == 1
    background.proc.send_signal(signal.SIGINT)
    result = background.result(15)
    assert result.exit_code == 130, result.stderr
    assert client.get_job(waiting[0]["id"]).job["state"] == "killed"
    assert client.get_job(blocker).job["state"] == "running"


def test_ps_and_run_say_submitter_limit(
    run_rc: Rc,
    spawn_rc: Spawn,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    controller: LiveController,
) -> None:
    controller.svc.store.limits = SubmitterLimits(names={"tester": 1})
    blocker = occupy(client, worker, "box:gpu0")
    background = spawn_rc("run", "--", "echo", "mine", env=env)
    background.said("queued at position")
    ps = run_rc("ps", env=env).stdout.splitlines()
    row = next(r for r in ps if "queued" in r)
    assert row.rstrip().endswith("submitter_limit: at the limit of 1 devices for tester"), ps
    explain = run_rc("run", "--select", "gpu!=x", "--explain", env=env).stdout.splitlines()
    assert explain[-2:] == [
        "limit: 1 devices for tester, 1 held",
        "submitter_limit: at the limit of 1 devices for tester; a job would queue until some"
        " of them end",
    ]
    worker.behaviour = run_for_real
    client.kill(blocker)
    result = background.result(15)
    assert result.exit_code == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert re.fullmatch(
        r"rc: queued at position \d+ for any device — at the limit of 1 devices for tester",
        first,
    ), first


def test_ps_names_the_jobs_a_job_waits_for(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    blocker = occupy(client, worker, "box:gpu0")
    client.submit(["true"], after=[blocker])
    ps = run_rc("ps", env=env).stdout.splitlines()
    assert ps[-1].rstrip().endswith(f"after {blocker[:8]}…"), ps
    objects = run_rc("ps", "-o", "json", env=env).stdout
    assert (
        f'"after":["{blocker}"]' in objects
        and f'"waiting_for":[{{"after":"{blocker}"}}]' in objects
    )
