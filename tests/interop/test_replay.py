"""Replay the reference worker's captured requests against this controller (EXT-COMPAT-2).

Each request of ``shared/interop/*.jsonl`` is sent, byte for byte, to a real controller
on loopback, and must get the captured status and, where the captured answer had a JSON
body, the same top-level keys (an empty captured body stays empty here).

IDs in the capture belong to the reference controller, so they are mapped: the worker
ID to the one our registration returns, and each captured job ID, in order of
appearance, to a job submitted here through the client API with the captured
assignment's device, command and limits, just before the poll that hands it out. A
captured kill is requested through the client API just before the poll that delivers
it. Justified differences, and only these:

- the bare-device registration was captured against this project's OLD controller,
  which answered 400; the expected status is now 200 with ``worker_id`` (EXT-COMPAT-1);
- a poll the capture answered 204 is replayed with ``wait=20ms`` instead of ``1s``: it
  must time out the same way, and nothing is gained by waiting a second for each;
- an assignment may carry fields the reference does not send (``lease_epoch``,
  EXT-EPOCH-3a; ``device_ids``, EXT-GANG-6): additions, never renames (EXT-COMPAT-2).
  Every captured field must be there with the same value (job IDs mapped).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from interop.capture import bare_devices, session
from resource_controller.client import api, config
from resource_controller.clock import FakeClock
from resource_controller.controller import serve
from resource_controller.controller.deps import Settings
from support.served import ServedController

TOKENS = "wtok:worker,ctok:client,atok:admin"
#: No periodic pass during the replay: what happens, happens because a request caused it.
QUIET = Settings(schedule_interval=30.0, sweep_interval=3600.0)
#: Assignment fields this project adds to the reference's (EXT-EPOCH-3a, EXT-GANG-6).
ADDED_ASSIGNMENT_FIELDS = {"lease_epoch", "device_ids"}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServedController]:
    monkeypatch.setenv("RC_CONFIG", os.devnull)
    config.reset()
    svc = serve.open_services(tmp_path / "data", TOKENS, QUIET, FakeClock())
    server = ServedController(svc)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        config.reset()


class Replayer:
    """Sends captured requests with their IDs mapped to this controller's."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": "Bearer wtok"}, timeout=15, verify=False
        )
        self.client = api.JsonClient(url, "ctok", submitter="wc/sess")
        #: captured ID -> ours (the worker ID and every job ID).
        self.ids: dict[str, str] = {}

    def close(self) -> None:
        self.http.close()
        self.client.close()

    def mapped(self, text: str) -> str:
        return UUID.sub(lambda m: self.ids.get(m.group(0), m.group(0)), text)

    def prepare(self, x: dict[str, Any]) -> None:
        """Make this controller owe the poll what the reference's poll delivered."""
        if "/assignments" not in x["p"] or x["st"] != 200:
            return
        answer = json.loads(x["resp"])
        for a in answer.get("assignments") or []:
            assert a["job_id"] not in self.ids, "a job handed out twice in the capture"
            job = self.client.submit(
                a["command"],
                device=a["device_id"],
                env=a.get("env") or None,
                cwd=a.get("cwd") or "",
                max_runtime=a.get("max_runtime_seconds") or 0,
                idle_timeout=a.get("idle_timeout_seconds") or 0,
                kind=a.get("kind") or "",
            )
            assert job["state"] == "assigned", job
            self.ids[a["job_id"]] = job["id"]
        for captured in answer.get("kills") or []:
            self.client.kill(self.ids[captured])

    def send(self, x: dict[str, Any]) -> httpx.Response:
        path = self.mapped(x["p"])
        if "/assignments" in path and x["st"] == 204:
            path = path.replace("wait=1s", "wait=20ms")
        headers = {k: v for k, v in x["req_hdrs"].items() if k.lower() != "authorization"}
        body = x["req"].encode()
        if not path.endswith("/logs"):  # log chunks are raw bytes, never rewritten
            body = self.mapped(x["req"]).encode()
        return self.http.request(x["m"], path, content=body, headers=headers)

    def check(self, x: dict[str, Any], r: httpx.Response, expected_status: int) -> None:
        where = f"{x['m']} {x['p']} (captured {x['st']})"
        assert r.status_code == expected_status, (where, r.status_code, r.text)
        captured = x["resp"].strip()
        if not captured:
            assert r.content == b"", (where, r.text)
            assert "application/json" not in r.headers.get("content-type", ""), where
            return
        theirs = json.loads(captured)
        ours = r.json()
        assert r.headers["content-type"].startswith("application/json"), where
        assert set(ours) == set(theirs), (where, sorted(ours), sorted(theirs))
        if "worker_id" in theirs:
            self.ids[theirs["worker_id"]] = ours["worker_id"]
            uuid.UUID(ours["worker_id"])
        if "assignments" in theirs:
            self._same_assignments(theirs, ours, where)

    def _same_assignments(self, theirs: dict[str, Any], ours: dict[str, Any], where: str) -> None:
        assert [self.ids[k] for k in theirs.get("kills") or []] == (ours.get("kills") or []), where
        assert len(ours["assignments"]) == len(theirs["assignments"]), where
        for t, o in zip(theirs["assignments"], ours["assignments"], strict=True):
            assert set(o) - set(t) <= ADDED_ASSIGNMENT_FIELDS, (where, sorted(o), sorted(t))
            for key, value in t.items():
                want = self.ids[value] if key == "job_id" else value
                assert o.get(key) == want, (where, key, o.get(key), want)


def test_replay_the_reference_worker_session(served: ServedController) -> None:
    """The whole captured session: registration, polls with assignments and a kill,
    heartbeats, raw log appends with a JSON content type, running and terminal reports."""
    exchanges = session()
    rep = Replayer(served.url)
    try:
        routes = set()
        for x in exchanges:
            rep.prepare(x)
            r = rep.send(x)
            rep.check(x, r, x["st"])
            routes.add(re.sub(UUID, "{id}", x["p"].split("?")[0]))
        assert routes == {
            "/v1/workers/register",
            "/v1/workers/{id}/assignments",
            "/v1/workers/{id}/heartbeat",
            "/v1/jobs/{id}/status",
            "/v1/jobs/{id}/logs",
        }
        # The session's end state as the reference left it: every job terminal, devices free.
        jobs = rep.client.jobs(limit=200)
        assert len(jobs) == len(rep.ids) - 1
        states = {j["id"]: j["state"] for j in jobs}
        assert "queued" not in states.values() and "running" not in states.values(), states
        views = rep.client.state()["devices"]
        assert {v["device"]["id"]: v["device"]["state"] for v in views} == {
            "box-a:gpu0": "ready",
            "box-a:gpu1": "ready",
        }
        # Raw log bytes were stored verbatim (API-036).
        first = next(x for x in exchanges if x["p"].endswith("/logs"))
        job_id = rep.ids[UUID.search(first["p"]).group(0)]  # type: ignore[union-attr]
        chunks = b"".join(rep.client.follow_logs(job_id, follow=False))
        assert chunks == first["req"].encode()
    finally:
        rep.close()


def test_replay_the_bare_device_registration(served: ServedController) -> None:
    """EXT-COMPAT-1: ``"declared_labels": {"gpu0": null, ...}`` is accepted (the capture
    shows this project's old controller refusing it with 400)."""
    [x] = bare_devices()
    assert x["st"] == 400 and "declared_labels.gpu0" in x["resp"], "capture changed?"
    rep = Replayer(served.url)
    try:
        r = rep.send(x)
        rep.check({**x, "resp": '{"worker_id": ""}'}, r, 200)
        views = {v["device"]["id"]: v for v in rep.client.state()["devices"]}
        assert sorted(views) == ["box-a:gpu0", "box-a:gpu1"]
        for view in views.values():
            assert view["device"]["state"] == "ready", view
            # Host-wide detected facts landed; the null declared map means "declared: none".
            labels = {(lb["key"], lb["source"]) for lb in view["device"]["labels"]}
            assert ("cpus", "detected") in labels
            assert not {k for k, source in labels if source == "declared"}
    finally:
        rep.close()


def test_null_declared_labels_clear_what_was_declared(served: ServedController) -> None:
    """A device map of null replaces that source with nothing (STORE-144: present and
    empty clears), exactly as ``{}`` does; a top-level null leaves it alone."""
    rep = Replayer(served.url)
    try:
        base = {"host": "box-a", "devices": [{"name": "gpu0"}]}
        r = rep.http.post(
            "/v1/workers/register", json={**base, "declared_labels": {"gpu0": {"rack": "r1"}}}
        )
        assert r.status_code == 200, r.text
        wid = r.json()["worker_id"]

        def declared() -> set[str]:
            [view] = rep.client.state()["devices"]
            return {
                lb["key"] for lb in view["device"].get("labels", []) if lb["source"] == "declared"
            }

        assert declared() == {"rack"}
        push = {"host": "box-a", "devices": ["gpu0"]}
        r = rep.http.post(f"/v1/workers/{wid}/labels", json={**push, "declared_labels": None})
        assert r.status_code == 200, r.text
        assert declared() == {"rack"}
        r = rep.http.post(
            f"/v1/workers/{wid}/labels", json={**push, "declared_labels": {"gpu0": None}}
        )
        assert r.status_code == 200, r.text
        assert declared() == set()
    finally:
        rep.close()
