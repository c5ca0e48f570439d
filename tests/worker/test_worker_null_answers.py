"""The worker runs what a reference controller hands out, nulls included (EXT-COMPAT-1).

The reference (Go) controller writes ``null`` for an empty list or map: an assignment's
``env``, the poll's ``kills``. The real agent must run such an assignment and report it.
"""

from __future__ import annotations

import json

from fake_controller import FakeController, Reply, Running, job, until
from worker_helpers import run


def test_assignment_with_null_env_and_null_kills_runs_and_reports() -> None:
    ctl = FakeController()
    a = job(["sh", "-c", 'echo "ok${A-}"'])
    body = {"assignments": [{**a, "env": None, "cwd": None}], "kills": None}
    ctl.answers.append(Reply(200, content=json.dumps(body).encode()))

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    assert ctl.terminal(a["job_id"]) == [{"state": "succeeded", "exit_code": 0, "worker_id": "w-1"}]
    assert bytes(ctl.logs[a["job_id"]]) == b"ok\n"


def test_kills_only_answer_with_null_assignments_is_understood() -> None:
    ctl = FakeController()
    long = job(["sleep", "30"])
    ctl.hand_out(long)
    kill = {"assignments": None, "kills": [long["job_id"]]}
    ctl.answers.append(Reply(200, content=json.dumps(kill).encode()))

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(long["job_id"])))
        await r.finish()

    run(go())
    [report] = ctl.terminal(long["job_id"])
    assert report["state"] == "killed", report
