"""The Python API against real ``rc serve`` and ``rc worker`` processes (EXT-PYAPI-1..4).

One controller and one worker (``box:gpu0``, ``box:gpu1``) serve the whole module;
each test leaves both devices free, which the fixture checks after it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from resource_controller import AsyncClient, Client, CountNotHonoured, JobFailed, errors
from resource_controller.client.waits import WaitTimeout

from .cluster import Cluster, free_port, stop, wait_for

DEVICES = ("box:gpu0", "box:gpu1")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp=tmp_path_factory.mktemp("pyapi"), port=free_port())
    try:
        c.start_controller()
        c.start_worker("box", ["gpu0", "gpu1"])
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)


def held(fleet: Cluster) -> dict[str, str]:
    """Device ID -> the job holding it, from ``/v1/state`` (the controller's own truth)."""
    status, state = fleet.api("GET", "/v1/state")
    assert status == 200, state
    return {v["device"]["id"]: v["job_id"] for v in state["devices"] if v.get("job_id")}


@pytest.fixture
def client(fleet: Cluster) -> Iterator[Client]:
    with Client(fleet.url, "ctok", submitter="tester") as c:
        yield c
    # Every test gives both devices back; a lease that leaked would show here.
    wait_for(lambda: not held(fleet), 20, "both devices to be free again")


def test_run_returns_the_exit_code_and_the_output(client: Client) -> None:  # EXT-PYAPI-2
    ok = client.run(["sh", "-c", "echo hello; echo oops >&2"], capture=True)
    assert ok.exit_code == 0 and ok.ok
    assert ok.output is not None and sorted(ok.text.splitlines()) == ["hello", "oops"]
    failed = client.run(["sh", "-c", "exit 3"], capture=True)
    assert failed.exit_code == 3 and not failed.ok
    assert failed.job.state == "failed" and failed.job.exit_code == 3
    killed = client.run(["sh", "-c", "kill -TERM $$"], capture=True)
    assert (killed.exit_code, killed.job.state) == (143, "killed")  # CLI-050: 128+signal
    with pytest.raises(JobFailed) as caught:
        client.run(["false"], capture=True, check=True)
    assert caught.value.result.exit_code == 1


def test_run_streams_to_stdout_unless_captured(
    client: Client, capfd: pytest.CaptureFixture[str]
) -> None:
    result = client.run(["echo", "to stdout"], device="box:gpu1")
    assert result.exit_code == 0 and result.output is None
    assert capfd.readouterr().out == "to stdout\n"
    chunks: list[bytes] = []
    client.run(["echo", "to a callback"], on_output=chunks.append)
    assert b"".join(chunks) == b"to a callback\n"
    assert capfd.readouterr().out == ""


def test_job_fields_are_typed(client: Client) -> None:  # EXT-PYAPI-1, API-020
    result = client.run(
        ["sh", "-c", 'echo "$RC_DEVICE $CUDA_VISIBLE_DEVICES $RC_LEASE_EPOCH"'],
        device="box:gpu1",
        env={"MARK": "m"},
        max_runtime="5m",
        capture=True,
    )
    job = result.job
    assert job.state == "succeeded" and job.terminal and job.succeeded
    assert (job.device_id, job.device_ids, job.kind) == ("box:gpu1", ["box:gpu1"], "job")
    assert job.exit_code == 0 and job.kill_reason == ""
    assert job.submitter == "tester" and job.env == {"MARK": "m"}
    assert job.max_runtime_seconds == 300 and job.selector == ""
    assert isinstance(job.lease_epoch, int) and job.lease_epoch > 0
    assert result.text == f"box:gpu1 1 {job.lease_epoch}\n"
    for stamp in (job.submitted_at, job.started_at, job.finished_at):
        assert isinstance(stamp, datetime) and stamp.tzinfo is not None
    assert job.started_at is not None and job.finished_at is not None
    assert job.finished_at >= job.started_at
    assert job.raw["id"] == job.id


def test_submit_returns_a_handle_that_waits_logs_and_kills(client: Client) -> None:
    job = client.submit(["sh", "-c", "echo one; echo two"])
    assert job.state in ("queued", "assigned", "running")
    assert job.wait(timeout="30s") is job and job.state == "succeeded"
    assert job.output() == b"one\ntwo\n"
    assert "".join(job.logs(text=True)) == "one\ntwo\n"

    sleeper = client.submit(["sleep", "300"], device="box:gpu0")
    assert [c for c in sleeper.logs(follow=False)] == []  # a snapshot never waits
    sleeper.wait_started(timeout=20)
    sleeper.kill()
    sleeper.wait(timeout=30)
    assert sleeper.state == "killed"
    with pytest.raises(errors.NotCancellableError):
        sleeper.kill()
    assert client.job(sleeper.id[:8]).id == sleeper.id  # EXT-CLI-7 prefix


def test_fleet_views_are_typed(client: Client) -> None:  # API-023, API-060, API-064
    devices = client.devices()
    assert [d.id for d in devices] == list(DEVICES)
    assert all(d.state == "ready" and d.free and d.host == "box" for d in devices)
    details = client.describe("box:gpu0")
    assert details.device.id == "box:gpu0" and details.device.name == "gpu0"
    explained = client.explain("host=box")
    assert explained.selector == "host=box"
    assert isinstance(explained.matching, list) and explained.queue_depth == 0


def test_errors_are_the_projects_types(fleet: Cluster, client: Client) -> None:
    with pytest.raises(errors.NotFound):
        client.describe("box:nope")
    with pytest.raises(errors.BadSelector):
        client.explain("vram>=")
    with pytest.raises(errors.UnknownDevice):
        client.submit(["true"], device="box:gpu9")
    with pytest.raises(errors.Unauthorized), Client(fleet.url, "wrong") as stranger:
        stranger.devices()
    job = client.submit(["sleep", "300"], device="box:gpu0")
    try:
        with (
            pytest.raises(errors.NotJobOwner),
            Client(fleet.url, "ctok", submitter="mallory") as other,
        ):
            other.kill(job.id)  # CLI-131: the same ownership rule as rc kill
    finally:
        job.kill()
    job.wait(timeout=30)
    with pytest.raises(ValueError, match="not both"):
        client.submit(["true"], device="box:gpu0", select="host=box")
    with pytest.raises(ValueError, match="negative"):
        client.run(["true"], timeout=-1)


def test_lease_yields_the_devices_and_releases_when_the_block_raises(
    fleet: Cluster, client: Client
) -> None:  # EXT-PYAPI-3
    with (
        pytest.raises(RuntimeError, match="boom"),
        client.lease(device="box:gpu0", ttl="10m", reason="profiling") as lease,
    ):
        assert lease.device_ids == ["box:gpu0"] and lease.device_id == "box:gpu0"
        assert lease.cuda_visible_devices == "0"
        assert lease.epoch > 0 and lease.ttl_seconds == 600
        assert lease.env["CUDA_VISIBLE_DEVICES"] == "0"
        assert held(fleet) == {"box:gpu0": lease.id}
        hold_id = lease.id
        raise RuntimeError("boom")
    wait_for(lambda: not held(fleet), 20, "the lease to be released")
    job = fleet.job(hold_id)
    assert job["kind"] == "hold" and job["state"] == "killed", job


def test_a_lease_on_a_device_list_takes_both_at_once(
    fleet: Cluster, client: Client
) -> None:  # EXT-GANG-1 through the Python API
    with client.lease(device=["box:gpu1", "box:gpu0"], ttl="10m", reason="two") as lease:
        assert lease.device_ids == ["box:gpu0", "box:gpu1"]
        assert lease.cuda_visible_devices == "0,1"
        assert held(fleet) == {"box:gpu0": lease.id, "box:gpu1": lease.id}
    wait_for(lambda: not held(fleet), 20, "both leases to be released")
    result = client.run(["sh", "-c", "echo $RC_DEVICES"], device="box:gpu0,box:gpu1", capture=True)
    assert result.exit_code == 0 and result.text == "box:gpu0,box:gpu1\n", result


def test_lease_timeout_while_queued_cancels_the_hold(fleet: Cluster, client: Client) -> None:
    with client.lease(device="box:gpu0", ttl="10m") as first:
        before = {j.id for j in client.jobs(limit=200)}
        with pytest.raises(WaitTimeout), client.lease(device="box:gpu0", ttl="10m", timeout=1):
            raise AssertionError("a second lease of a held device cannot be granted")
        # Found by ID: jobs submitted in one second have no reliable list order.
        (second,) = [j for j in client.jobs(limit=200) if j.id not in before]
        assert second.kind == "hold" and second.state == "killed"
        assert second.kill_reason == "killed by tester" and second.started_at is None
        assert "pid" in second.reason  # the default reason names this process
        assert held(fleet) == {"box:gpu0": first.id}


SCRIPT = """
import sys, time
from resource_controller import Client
client = Client()
with client.lease(device="box:gpu0", ttl="10m", reason="interrupt test") as lease:
    print("granted", lease.id, flush=True)
    time.sleep(300)
"""


def test_keyboard_interrupt_releases_the_lease_and_cancels_a_queued_one(
    fleet: Cluster, client: Client, tmp_path: Path
) -> None:
    script = tmp_path / "lease.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = fleet.env()  # Client() reads RC_CONTROLLER/RC_TOKEN/RC_SUBMITTER (EXT-PYAPI-1)

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        fleet.procs.append(proc)
        return proc

    granted = start()
    assert granted.stdout is not None
    line = granted.stdout.readline().split()
    assert line[0] == "granted", line
    hold_id = line[1]
    assert held(fleet) == {"box:gpu0": hold_id}
    before = {j.id for j in client.jobs(limit=200)}
    queued = start()
    wait_for(
        lambda: [j for j in client.jobs(state="queued") if j.kind == "hold"], 20, "a queued hold"
    )
    queued.send_signal(signal.SIGINT)
    queued.wait(20)
    assert "KeyboardInterrupt" in (queued.stderr.read() if queued.stderr else "")
    (cancelled,) = [j for j in client.jobs(limit=200) if j.id not in before]
    assert cancelled.state == "killed" and cancelled.kill_reason == "killed by tester"
    granted.send_signal(signal.SIGINT)
    granted.wait(20)
    wait_for(lambda: not held(fleet), 20, "the interrupted lease to be released")
    assert fleet.job(hold_id)["state"] == "killed"


def test_async_client_runs_two_jobs_concurrently(fleet: Cluster) -> None:  # EXT-PYAPI-4
    async def main() -> None:
        async with AsyncClient(fleet.url, "ctok", submitter="tester") as client:
            started = time.monotonic()
            a, b = await asyncio.gather(
                client.run(["sh", "-c", "sleep 1; echo a"], capture=True),
                client.run(["sh", "-c", "sleep 1; echo b; exit 4"], capture=True),
            )
            elapsed = time.monotonic() - started
            assert (a.exit_code, a.output) == (0, b"a\n")
            assert (b.exit_code, b.output) == (4, b"b\n")
            assert {a.job.device_id, b.job.device_id} == set(DEVICES)  # both at once
            assert elapsed < 30
            job = await client.submit(["echo", "later"])
            await job.wait(timeout=30)
            assert job.state == "succeeded" and await job.output() == b"later\n"
            assert [c async for c in job.logs(text=True)] == ["later\n"]
            assert [d.id for d in await client.devices()] == list(DEVICES)
            assert (await client.describe("box:gpu1")).device.name == "gpu1"
            assert (await client.explain("host=box")).selector == "host=box"
            with pytest.raises(errors.NotFound):
                await client.describe("box:nope")
            with pytest.raises(errors.NotCancellableError):
                await job.kill()

    asyncio.run(main())
    wait_for(lambda: not held(fleet), 20, "both devices to be free")


def test_async_lease_releases_on_an_exception_and_on_cancel(fleet: Cluster) -> None:
    async def main() -> None:
        async with AsyncClient(fleet.url, "ctok", submitter="tester") as client:
            with pytest.raises(KeyError):
                async with client.lease(device="box:gpu1", ttl=60) as lease:
                    assert lease.cuda_visible_devices == "1" and lease.epoch > 0
                    assert held(fleet) == {"box:gpu1": lease.id}
                    raise KeyError("inside")
            # Waited for off the loop: the client's own tasks must keep running meanwhile.
            await asyncio.to_thread(
                wait_for, lambda: not held(fleet), 20, "the async lease to be released"
            )

            async def hold_forever() -> None:
                async with client.lease(device="box:gpu1", ttl=60):
                    await asyncio.sleep(300)

            task = asyncio.create_task(hold_forever())
            await asyncio.to_thread(wait_for, lambda: held(fleet), 20, "the lease")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(
                wait_for, lambda: not held(fleet), 20, "the cancelled lease to be released"
            )

    asyncio.run(main())


def test_client_reads_the_cli_environment(fleet: Cluster, tmp_path: Path) -> None:
    code = (
        "from resource_controller import Client\n"
        "c = Client()\n"
        "r = c.run(['sh', '-c', 'exit 7'], capture=True)\n"
        "print(c.submitter, r.exit_code, r.job.submitter)\n"
    )
    env = fleet.env()
    env["RC_SUBMITTER"] = "from-env"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["from-env", "7", "from-env"], out.stderr
    assert os.environ.get("RC_SUBMITTER") != "from-env"


def test_count_is_honoured_or_refused_never_ignored(fleet: Cluster, client: Client) -> None:
    # A controller without EXT-GANG ignores ``count``; the client then kills the job and
    # raises instead of running it on one device. With EXT-GANG it gets both devices.
    try:
        result = client.run(["sh", "-c", "sleep 5; echo $RC_DEVICES"], count=2, capture=True)
    except CountNotHonoured as e:
        assert "does not support count" in str(e)
        last = client.jobs(limit=1)[0]
        wait_for(lambda: last.refresh().terminal, 20, "the one-device job to be killed")
        # Killed before its five seconds were up, whatever state the worker reported.
        assert last.state != "succeeded" and last.output() == b"", last
    else:
        assert result.exit_code == 0 and sorted(result.job.device_ids) == list(DEVICES)
        assert result.text == ",".join(DEVICES) + "\n"
