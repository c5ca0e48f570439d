"""``rc`` commands against answers shaped as the reference controller writes them.

EXT-COMPAT-2: this client works against the reference controller with the same exit
codes. Its encoder writes ``null`` for every empty list or map (EXT-COMPAT-1); a tiny
loopback server answers each route with such a body.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from resource_controller.cli.main import rc
from resource_controller.client import config

JOB = {
    "id": "0a4396a3-ade8-4c0b-a03b-6e4e8b9efe7a",
    "selector": "",
    "kind": "job",
    "command": ["sleep", "60"],
    "cwd": "",
    "env": None,
    "submitter": "wc/sess",
    "priority": 0,
    "state": "running",
    "device_id": "box-a:gpu0",
    "worker_id": "6337ed36-84a3-5c0c-9aa1-d6c559936151",
    "submitted_at": "2026-12-01T00:00:00Z",
    "started_at": "2026-12-01T00:00:01Z",
}
DEVICE = {
    "id": "box-a:gpu0",
    "host": "box-a",
    "name": "gpu0",
    "worker_id": JOB["worker_id"],
    "state": "busy",
    "last_heartbeat_at": "2026-12-01T00:00:01Z",
    "labels": None,
}
VIEW = {
    "device": DEVICE,
    "holder": "wc/sess",
    "job_id": JOB["id"],
    "kind": "job",
    "command": JOB["command"],
    "elapsed_seconds": 3,
    "heartbeat_age_seconds": 0,
}
IDLE = {
    "device": {**DEVICE, "id": "box-a:gpu1", "name": "gpu1", "state": "ready"},
    "command": None,
    "elapsed_seconds": 0,
    "heartbeat_age_seconds": 0,
}
ANSWERS = {
    "/v1/state": {
        "devices": [VIEW, IDLE],
        "jobs": [JOB],
        "queued": None,
        "queued_waiting_seconds": None,
    },
    "/v1/jobs": {"jobs": [JOB, {**JOB, "id": "x2", "command": None}]},
    "/v1/explain": {"selector": "gpu", "matching": None, "free": None, "queue_depth": 0},
    "/v1/devices/box-a:gpu1/describe": {
        "device": IDLE["device"],
        "elapsed_seconds": 0,
        "heartbeat_age_seconds": 0,
        "labels": None,
        "label_age_seconds": None,
        "sheet": "",
        "sheet_updated_at": "0001-01-01T00:00:00Z",
        "recent_jobs": None,
    },
}


class Reference(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answer = ANSWERS.get(self.path.split("?")[0])
        body = json.dumps(answer).encode() + b"\n"
        self.send_response(200 if answer is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Reference)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "RC_CONTROLLER": f"http://127.0.0.1:{server.server_address[1]}",
            "RC_TOKEN": "ctok",
            "RC_SUBMITTER": "tester",
            "RC_CONFIG": os.devnull,
        }
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        config.reset()


@pytest.mark.parametrize(
    ("args", "expect", "code"),
    [
        (["devices"], "box-a:gpu1", 0),
        (["devices", "-o", "json"], '"box-a:gpu0"', 0),
        (["devices", "--select", "gpu"], "DEVICE", 0),
        (["ps"], "sleep 60", 0),
        (["jobs"], "x2", 0),
        (["jobs", "-o", "json"], '"x2"', 0),
        (["describe", "box-a:gpu1"], "box-a:gpu1", 0),
        # A null ``matching`` is no match: reported, then exit 1 as for any selector
        # that matches nothing.
        (["run", "--explain", "--select", "gpu"], "no device matches", 1),
    ],
)
def test_commands_read_null_lists_and_maps(
    env: dict[str, str], args: list[str], expect: str, code: int
) -> None:
    config.reset()
    result = CliRunner().invoke(rc, args, env=env, catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert expect in result.output, result.output
    assert "null" not in result.output, result.output
