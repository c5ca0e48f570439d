"""``rc jobs -n N`` past one page: the client reads the history a page at a time with
``GET /v1/jobs?before=`` (docs/agents.md), on the command line and in the Python API."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from cli.conftest import Rc
from client.live import CLIENT, WORKER, LiveController
from resource_controller.cli import jobs as jobs_cli
from resource_controller.client import api
from resource_controller.client.aio import AsyncClient
from resource_controller.client.sync import Client

#: More than two pages of the controller's 200.
MADE = 450


@pytest.fixture
def history(controller: LiveController) -> list[str]:
    """``MADE`` queued jobs on one device (no worker polls), newest first as listed."""
    controller.http(WORKER).request(
        "POST", "/v1/workers/register", body={"host": "box", "devices": [{"name": "gpu0"}]}
    )
    http = controller.http(CLIENT)
    body = {"command": ["true"], "device_id": "box:gpu0", "submitter": "tester"}
    made = {http.request("POST", "/v1/jobs", body=body).json()["id"] for _ in range(MADE)}
    # The controller's own order, read in pages of one API-043 page at most.
    listed: list[str] = []
    for _ in range(MADE // 200 + 1):
        query = {"limit": "200", **({"before": listed[-1]} if listed else {})}
        page = [j["id"] for j in http.request("GET", "/v1/jobs", query=query).json()["jobs"]]
        listed += page
    assert set(listed) == made and len(listed) == MADE
    return listed


def test_rc_jobs_reads_several_pages(
    run_rc: Rc, controller: LiveController, history: list[str]
) -> None:
    env = {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT}
    result = run_rc("jobs", "-n", "500", "-o", "json", env=env)
    assert result.exit_code == 0, result.stderr
    assert [j["id"] for j in json.loads(result.stdout)] == history
    result = run_rc("jobs", "-n", "201", "-o", "json", env=env)
    assert [j["id"] for j in json.loads(result.stdout)] == history[:201]
    result = run_rc("jobs", "-n", "450", env=env)
    assert result.stdout.count("\n") == 1 + MADE  # the header and every job


def test_the_python_apis_read_several_pages(controller: LiveController, history: list[str]) -> None:
    client = Client(controller.url, CLIENT)
    assert [j.id for j in client.jobs(limit=1000)] == history
    assert [j.id for j in client.jobs(limit=400)] == history[:400]
    assert len(client.jobs()) == 20  # the default, one page

    async def listed(limit: int) -> list[str]:
        async with AsyncClient(controller.url, CLIENT) as aio:
            return [j.id for j in await aio.jobs(limit=limit)]

    assert asyncio.run(listed(1000)) == history
    assert asyncio.run(listed(250)) == history[:250]


@pytest.mark.parametrize("value", ["-1", str(jobs_cli.MAX_LISTED + 1), "100000"])
def test_rc_jobs_refuses_an_n_out_of_range_naming_it(run_rc: Rc, value: str) -> None:
    env = {"RC_CONTROLLER": "http://127.0.0.1:9", "RC_TOKEN": CLIENT}
    result = run_rc("jobs", "-n", value, env=env)
    assert result.exit_code == 1
    assert result.stderr == (
        f"rc: -n must be in 1..{jobs_cli.MAX_LISTED} (0: the controller's default, 20),"
        f" got {int(value)}\n"
    )


class _NoCursor(BaseHTTPRequestHandler):
    """A controller that knows no ``before`` (the reference): every page is the first."""

    asked: list[dict[str, list[str]]] = []  # noqa: RUF012

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        self.asked.append(query)
        n = int(query.get("limit", ["20"])[0])
        jobs = [{"id": f"job-{i:03d}", "state": "succeeded"} for i in range(n)]
        body = json.dumps({"jobs": jobs}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def no_cursor() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoCursor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_controller_without_the_cursor_is_read_once(no_cursor: str) -> None:
    _NoCursor.asked.clear()
    found = api.JsonClient(no_cursor, CLIENT).jobs(limit=500)
    assert [j["id"] for j in found] == [f"job-{i:03d}" for i in range(200)]
    assert len(_NoCursor.asked) == 2 and _NoCursor.asked[1]["before"] == ["job-199"]
