"""The worker's channel: bodies built from the wire models, and every route against the
real controller served on loopback (WRK-030..033, WRK-043, WRK-050, WRK-101, WRK-114)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fake_controller import Reply, Request, Wire
from live_controller import HOST, LiveController, submit
from worker_helpers import run

from resource_controller import wire
from resource_controller.clock import FakeClock, SystemClock
from resource_controller.worker import channel, reconnect
from resource_controller.worker.timings import Timings

# ---- bodies --------------------------------------------------------------------


def test_targets_quote_what_a_path_cannot_carry() -> None:
    assert channel.target_of("/v1/devices/box:gpu0/fault") == "/v1/devices/box:gpu0/fault"
    assert channel.target_of("/v1/devices/a b/ü") == "/v1/devices/a%20b/%C3%BC"
    assert channel.target_of("/v1/x", {"wait": "30s"}) == "/v1/x?wait=30s"


def test_status_bodies_omit_what_is_not_there() -> None:  # WRK-101, WRK-113, EXT-EPOCH-3
    assert channel.status_body("w", "running") == {"worker_id": "w", "state": "running"}
    assert channel.status_body("w", "running", lease_epoch=3) == {
        "worker_id": "w",
        "state": "running",
        "lease_epoch": 3,
    }
    # exit code 0 is an exit code; an epoch of 0 is no epoch; no reason, no key.
    assert channel.status_body("w", "succeeded", exit_code=0, lease_epoch=0) == {
        "worker_id": "w",
        "state": "succeeded",
        "exit_code": 0,
    }
    assert channel.status_body("w", "failed", exit_code=-1, reason="empty command") == {
        "worker_id": "w",
        "state": "failed",
        "exit_code": -1,
        "reason": "empty command",
    }
    assert channel.fault_body("") == {"reason": ""}


def test_heartbeat_body_omits_empty_lists() -> None:  # WRK-050, EXT-OUTBOX-2
    assert channel.heartbeat_body([], []) == {}
    assert channel.heartbeat_body(["a"], ["b"]) == {
        "running_job_ids": ["a"],
        "pending_job_ids": ["b"],
    }


def test_registration_body_keeps_an_explicit_null() -> None:  # WRK-043, WRK-140
    body = channel.registration_body(
        wire.RegisterRequest(
            host="h",
            boot_id="",
            recovery=None,
            devices=[
                wire.DeviceDecl(name="gpu0"),
                wire.DeviceDecl(name="gpu1", max_runtime_seconds=60),
            ],
            labels=None,
            declared_labels={"gpu0": {}, "gpu1": {}},
        )
    )
    assert body == {
        "host": "h",
        "devices": [{"name": "gpu0"}, {"name": "gpu1", "max_runtime_seconds": 60}],
        "labels": None,
        "declared_labels": {"gpu0": {}, "gpu1": {}},
    }
    proof = wire.RecoveryProof(survivors_checked=True)
    with_proof = channel.registration_body(wire.RegisterRequest(host="h", recovery=proof))
    assert with_proof["recovery"] == {"survivors_checked": True}


# ---- every route, against the real controller ------------------------------------


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "data")
    yield ctl
    ctl.stop()


def test_every_route_against_the_real_controller(live: LiveController) -> None:
    contact = reconnect.Reconnect()
    to = channel.Channel(live.url, "wtok", SystemClock(), contact)
    names = ["gpu0", "gpu1"]

    async def go() -> None:
        async with (
            to.open(),
            httpx.AsyncClient(
                base_url=live.url, headers={"Authorization": "Bearer ctok"}, timeout=10
            ) as client,
        ):
            worker_id = await to.register(
                wire.RegisterRequest(
                    host=HOST,
                    devices=[wire.DeviceDecl(name=n) for n in names],
                    labels={"": {"cpus": "2"}, "gpu0": {}, "gpu1": {}},
                    declared_labels={n: {} for n in names},
                )
            )
            assert worker_id and to.worker_id == worker_id
            assert contact.instance == live.svc.instance  # WRK-032: every answer is contact
            assert await to.heartbeat([], []) == ""
            assert (
                await to.push_labels(
                    wire.LabelsPush(
                        host=HOST,
                        devices=names,
                        labels={"": {"cpus": "4"}},
                        declared_labels={n: {} for n in names},
                    )
                )
                == ""
            )
            r = await client.post(
                "/v1/jobs",
                json={"device_id": f"{HOST}:gpu0", "command": ["true"], "submitter": "t"},
            )
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            answer = await to.poll(5.0)
            assert isinstance(answer, channel.PollAnswer)
            (a,) = answer.assignments
            assert (a.job_id, a.device_id, a.command) == (job_id, f"{HOST}:gpu0", ["true"])
            assert await to.heartbeat([job_id], []) == ""
            running = channel.status_body(worker_id, "running", lease_epoch=a.lease_epoch)
            assert (await to.status(job_id, running, 5)).status_code == 200
            assert (await to.append_log(job_id, b"hello\n", a.lease_epoch)).status_code == 200
            fault = await to.fault(f"{HOST}:gpu1", channel.fault_body("verify failed: x"), 5)
            assert fault.status_code == 200, fault.content
            unknown = await to.fault(f"{HOST}:gpu9", channel.fault_body("x"), 5)
            assert unknown.status_code == 404
            done = channel.status_body(
                worker_id, "succeeded", exit_code=0, lease_epoch=a.lease_epoch
            )
            assert (await to.status(job_id, done, 5)).status_code == 200
            job = (await client.get(f"/v1/jobs/{job_id}")).json()["job"]
            assert (job["state"], job["exit_code"]) == ("succeeded", 0)
            logs = await client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "false"})
            assert logs.text == "hello\n"
            # A refused poll is an error, named.
            refused = channel.Channel(live.url, "not-a-token", SystemClock(), contact)
            refused.worker_id = worker_id
            async with refused.open():
                problem = await refused.poll(1.0)
            assert problem == "controller returned 401 Unauthorized"

    run(go(), 30)


def test_opening_the_relay_halves_does_not_feed_the_tracker(live: LiveController) -> None:
    """A relay half's 200 is no contact: the tracker keeps its last contact and owes
    nothing, however long after that the halves open (WRK-032, WRK-151)."""
    clock = FakeClock()
    contact = reconnect.Reconnect()
    to = channel.Channel(live.url, "wtok", clock, contact)

    async def go() -> None:
        async with to.open():
            await to.register(
                wire.RegisterRequest(host=HOST, devices=[wire.DeviceDecl(name="gpu0")])
            )
            with live.client() as client:
                job_id = submit(client, command=["true"])
            answer = await to.poll(5.0)
            assert isinstance(answer, channel.PollAnswer) and answer.assignments
            seen = contact.last_at
            assert seen is not None and contact.instance == live.svc.instance
            clock.advance(contact.timings.reregister_after * 2)
            out = await to.relay_output(job_id)
            inp = await to.relay_input(job_id)
            out.close()
            inp.close()
            assert (contact.last_at, contact.owed) == (seen, False)

    run(go(), 30)


def test_transport_errors_are_not_contact() -> None:  # WRK-032
    contact = reconnect.Reconnect()
    to = channel.Channel("http://127.0.0.1:9", "t", SystemClock(), contact)

    async def go() -> None:
        async with to.open():
            with pytest.raises(channel.RegisterError, match=r"^register: "):
                await to.register(wire.RegisterRequest(host="h"))
            assert await to.heartbeat([], [])  # a problem, named
            assert isinstance(await to.poll(1.0), str)

    run(go(), 30)
    assert contact.last_at is None


def test_a_refused_log_chunk_is_its_answer() -> None:  # WRK-085
    async def refuse(request: Request) -> Reply:
        return Reply(413, json={"error": "too_large", "message": "x"})

    to = channel.Channel(
        "http://c.test", "t", SystemClock(), reconnect.Reconnect(), connect=Wire(refuse).connect
    )

    async def go() -> None:
        async with to.open():
            assert (await to.append_log("j", b"x", None)).status_code == 413

    asyncio.run(go())


def _dead_url() -> str:
    """A loopback URL where nothing listens: connecting is refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_refused_controller_of_several_passes_the_request_to_the_next(
    live: LiveController,
) -> None:  # EXT-PG-5
    contact = reconnect.Reconnect()
    to = channel.Channel(f"{_dead_url()}, {live.url}/", "wtok", SystemClock(), contact)

    async def go() -> None:
        async with to.open():
            worker_id = await to.register(wire.RegisterRequest(host=HOST, devices=[]))
            assert worker_id and contact.instance == live.svc.instance
            assert await to.heartbeat([], []) == ""  # the live one is kept

    run(go())


def test_a_list_of_refusing_controllers_is_no_answer() -> None:  # EXT-PG-5
    to = channel.Channel(
        f"{_dead_url()},{_dead_url()}", "wtok", SystemClock(), reconnect.Reconnect()
    )

    async def go() -> None:
        async with to.open():
            assert "connect call failed" in (await to.heartbeat([], [])).lower()

    run(go())


def test_a_proxy_meant_for_the_controller_stops_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing goes through a proxy, so one set for the controller is refused by name
    instead of being bypassed; ``NO_PROXY`` naming the host lets it start."""
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.test:3128")
    to = channel.Channel(
        "https://c.test, http://d.test:8080", "t", SystemClock(), reconnect.Reconnect()
    )
    refused = r"^http_proxy is set, .*d\.test to NO_PROXY"
    with pytest.raises(channel.StartupError, match=refused):
        run(_open_and_close(to))
    monkeypatch.setenv("NO_PROXY", "localhost,.test")
    run(_open_and_close(to))


async def _open_and_close(to: channel.Channel) -> None:
    async with to.open():
        pass


@contextlib.asynccontextmanager
async def _listener(mode: str) -> AsyncIterator[str]:
    """A loopback controller that takes each request, then resets the connection
    (``reset``: it died mid-request) or never answers (``frozen``: SIGSTOPped)."""
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
        if mode == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for writer in held:
            writer.close()


def test_a_controller_that_resets_a_request_is_left_for_the_next(
    live: LiveController,
) -> None:  # EXT-PG-5: a controller that died under a request
    contact = reconnect.Reconnect()

    async def go() -> None:
        async with _listener("reset") as dead:
            both = f"{dead},{live.url}"
            to = channel.Channel(both, "wtok", SystemClock(), contact)
            async with to.open():
                worker_id = await to.register(wire.RegisterRequest(host=HOST, devices=[]))
            # A poll may arrive twice: the next controller takes it at once.
            polling = channel.Channel(both, "wtok", SystemClock(), contact)
            polling.worker_id = worker_id
            async with polling.open():
                assert await polling.poll(0.1) == channel.PollAnswer([], [])
            # A report may not: it fails, and the following requests go to the next.
            reporting = channel.Channel(both, "wtok", SystemClock(), contact)
            reporting.worker_id = worker_id
            async with reporting.open():
                with pytest.raises(channel.TRANSPORT_ERRORS):
                    await reporting.fault(f"{HOST}:gpu0", {"reason": "x"}, 5.0)
                assert await reporting.heartbeat([], []) == ""

    run(go(), 30)


def test_a_frozen_controller_is_left_after_a_bounded_wait(
    live: LiveController,
) -> None:  # EXT-PG-5: a controller that accepts and never answers
    timings = Timings(request_timeout=0.3, poll_margin=0.3)
    contact = reconnect.Reconnect()

    async def go() -> None:
        async with _listener("frozen") as frozen:
            both = f"{frozen},{live.url}"
            to = channel.Channel(both, "wtok", SystemClock(), contact, timings=timings)
            async with to.open():
                worker_id = await to.register(wire.RegisterRequest(host=HOST, devices=[]))
            polling = channel.Channel(both, "wtok", SystemClock(), contact, timings=timings)
            polling.worker_id = worker_id
            async with polling.open():
                assert await polling.poll(0.5) == channel.PollAnswer([], [])
            alone = channel.Channel(frozen, "wtok", SystemClock(), contact, timings=timings)
            alone.worker_id = worker_id
            async with alone.open():
                assert await alone.heartbeat([], []) == "request timed out"

    run(go(), 20)
