"""Every relayed client ends with its job, even one whose session ended before it came.

A job that exits at once with no output ends its relay session before (or while) its
client attaches; the client's halves then sit in a fresh session no worker will join.
Here the job has ended before the client even starts, the worst case of that race:
each client must still return within a bound, not hang.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from .cluster import Cluster

TERMINAL = ("succeeded", "failed", "killed", "lost")

CLIENTS = {
    "stdin": "from resource_controller.cli import stdin; stdin.forward(client, job)",
    "tty": (
        "import asyncio, os; from resource_controller.cli import tty;"
        " r, w = os.pipe(); base, token = client.relay_target();"
        " asyncio.run(tty._session(base, token, job, r, 1))"
    ),
    "cp-down": (
        "import asyncio; from resource_controller.cli import cp;"
        " base, token = client.relay_target();"
        " asyncio.run(cp._receive(base, token, job, lambda f: f.read()))"
    ),
    "cp-up": (
        "import asyncio; from resource_controller.cli import cp;"
        " base, token = client.relay_target();"
        " asyncio.run(cp._send(base, token, job, lambda f: f.write(b'x' * 300000), 'src'))"
    ),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_client_of_a_job_that_already_ended_returns(box: Cluster, client: str) -> None:
    stdio = "tty" if client == "tty" else "pipe"
    status, job = box.api(
        "POST",
        "/v1/jobs",
        {"device_id": box.dev, "submitter": "tester", "stdio": stdio, "command": ["true"]},
    )
    assert status == 201, job
    # No client attaches, so the job ends on its own: at once (its output ends the
    # session) or, at worst, after the relay's absent-client bound.
    ended = box.wait_job(job["id"], lambda j: j["state"] in TERMINAL, timeout=30)
    script = (
        "from resource_controller.client import api; client = api.JsonClient();"
        f" job = {job['id']!r}; " + CLIENTS[client]
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        env=box.env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 0, (ended, r.stderr.decode()[-2000:])
