"""Every client command against a real controller, with a fake worker playing the jobs."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cli.conftest import Rc, Spawn
from client.live import ADMIN, CLIENT, FakeWorker, LiveController, run_for_real, until_killed
from resource_controller.client import api


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "tester"}


@pytest.fixture
def client(controller: LiveController) -> api.JsonClient:
    return api.JsonClient(controller.url, CLIENT, submitter="tester")


def job_id_from(stderr: str) -> str:
    m = re.search(r"^rc: job (\S+) on (\S+)$", stderr, re.M)
    assert m, stderr
    return m.group(1)


def wait_state(
    client: api.JsonClient, job_id: str, *states: str, timeout: float = 10
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get_job(job_id).job
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.02)


def occupy(
    client: api.JsonClient, worker: FakeWorker, device: str = "box:gpu0", who: str = ""
) -> str:
    """Put a job that runs until killed on ``device``; returns its ID once it is running."""
    worker.behaviour = until_killed
    other = api.JsonClient(client._http.base_url, CLIENT, submitter=who or "tester")
    job = other.submit(["block"], device=device)
    wait_state(client, job["id"], "running")
    deadline = time.monotonic() + 5
    while b"".join(client.follow_logs(job["id"], follow=False)) != b"started\n":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return str(job["id"])


# ---- rc run ----------------------------------------------------------------------------------------


def test_run_streams_output_and_exits_0(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker
) -> None:
    result = run_rc(
        "run", "-d", "box:gpu0", "--", "sh", "-c", "echo hello; printf '\\001\\377'", env=env
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == b"hello\n\x01\xff"  # bytes unmodified
    assert re.fullmatch(r"rc: job [0-9a-f-]{36} on box:gpu0\n", result.stderr)


def test_run_exits_with_the_jobs_code(run_rc: Rc, env: dict[str, str], worker: FakeWorker) -> None:
    result = run_rc("run", "-d", "box:gpu0", "--", "sh", "-c", "echo out; exit 3", env=env)
    assert (result.exit_code, result.stdout) == (3, "out\n")
    assert result.stderr.count("\n") == 1  # nothing beyond the announcement (CLI-051)


@pytest.mark.parametrize(
    ("code", "state", "reason", "status"),
    [
        (-1, "failed", "could not start: no such file", 255),
        (256, "failed", "", 1),
        (137, "killed", "signal: killed", 137),
    ],
)
def test_run_exit_code_mapping(
    run_rc: Rc,
    env: dict[str, str],
    worker: FakeWorker,
    code: int,
    state: str,
    reason: str,
    status: int,
) -> None:
    worker.behaviour = lambda w, a: (state, code, reason)
    result = run_rc("run", "-d", "box:gpu0", "--", "x", env=env)
    assert result.exit_code == status
    if reason:
        assert reason in result.stderr.splitlines()[-1]
    else:
        assert result.stderr.count("\n") == 1


def test_run_non_success_without_code_fails(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker
) -> None:
    worker.behaviour = lambda w, a: ("killed", 0, "killed by someone")
    result = run_rc("run", "-d", "box:gpu0", "--", "x", env=env)
    assert result.exit_code == 1
    last = result.stderr.splitlines()[-1]
    assert "killed" in last and "killed by someone" in last and job_id_from(result.stderr) in last


def test_run_any_device_and_env(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    result = run_rc(
        "run",
        "--env",
        "GREETING=hi there",
        "--env",
        "E=a=b",
        "--",
        "sh",
        "-c",
        'echo "$GREETING $E"',
        env=env,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hi there a=b\n"
    job = client.get_job(job_id_from(result.stderr)).job
    assert job["env"] == {"GREETING": "hi there", "E": "a=b"}
    assert job["selector"] == "" and job["device_id"] in ("box:gpu0", "box:gpu1")
    assert job["submitter"] == "tester" and job.get("idempotency_key")


def test_run_cwd_priority_and_ceilings_reach_the_job(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient, tmp_path: Any
) -> None:
    result = run_rc(
        "run",
        "-d",
        "box:gpu1",
        "--cwd",
        str(tmp_path),
        "--priority",
        "0x3",
        "--max-runtime",
        "1m30.9s",
        "--idle-timeout",
        "1.9s",
        "--as",
        "me",
        "--",
        "pwd",
        env=env,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{tmp_path}\n"
    job = client.get_job(job_id_from(result.stderr)).job
    assert (job["priority"], job["max_runtime_seconds"], job["idle_timeout_seconds"]) == (3, 90, 1)
    assert job["submitter"] == "me" and job["cwd"] == str(tmp_path)


# ---- EXT-HERE: a local job runs where you are ---------------------------------------------------


def test_relative_cwd_is_resolved_here(
    run_rc: Rc,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    for given, sent in (
        (".", tmp_path),
        ("sub", tmp_path / "sub"),
        ("sub/../sub", tmp_path / "sub"),
    ):
        result = run_rc("run", "--cwd", given, "--", "pwd", env=env)  # EXT-HERE-1
        assert result.stdout == f"{sent}\n", result.stderr
        assert client.get_job(job_id_from(result.stderr)).job["cwd"] == str(sent)
    result = run_rc("run", "--cwd", "/tmp/../tmp", "--", "true", env=env)
    assert client.get_job(job_id_from(result.stderr)).job["cwd"] == "/tmp/../tmp"  # as written


HERE_SCRIPT = 'pwd; echo "venv=$VIRTUAL_ENV"; echo "secret=$SECRET_X"'


def test_here_sends_cwd_and_only_the_allowed_variables(
    run_rc: Rc,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(name, raising=False)
    mine = {**env, "VIRTUAL_ENV": "/venvs/x", "SECRET_X": "1", "PYTHONPATH": "/lib/py"}
    result = run_rc(
        "run", "--here", "--env", "PYTHONPATH=/mine", "--", "sh", "-c", HERE_SCRIPT, env=mine
    )
    assert result.exit_code == 0, result.stderr
    job = client.get_job(job_id_from(result.stderr)).job
    assert job["cwd"] == str(tmp_path)
    assert job["env"] == {  # EXT-HERE-2: exactly these; --env wins
        "PATH": os.environ["PATH"],
        "VIRTUAL_ENV": "/venvs/x",
        "PYTHONPATH": "/mine",
    }
    # (the fake worker runs the job in this process's environment, so only the
    # job's stored env says what was sent)
    assert result.stdout.splitlines()[:2] == [str(tmp_path), "venv=/venvs/x"]

    result = run_rc("run", "--no-here", "--", "true", env=mine)
    job = client.get_job(job_id_from(result.stderr)).job
    assert "env" not in job and not job.get("cwd")


def test_config_run_here_is_the_default(
    run_rc: Rc,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = tmp_path / "rc.yaml"
    cfg.write_text("run: {here: true}\n")
    monkeypatch.chdir(tmp_path)
    mine = {**env, "RC_CONFIG": str(cfg), "VIRTUAL_ENV": "/venvs/y"}
    result = run_rc("run", "--", "true", env=mine)  # EXT-HERE-3
    job = client.get_job(job_id_from(result.stderr)).job
    assert job["cwd"] == str(tmp_path) and job["env"]["VIRTUAL_ENV"] == "/venvs/y"
    for off in (["--no-here"], ["--here=false"]):
        result = run_rc("run", *off, "--", "true", env=mine)
        job = client.get_job(job_id_from(result.stderr)).job
        assert "env" not in job and not job.get("cwd"), off


def test_run_queues_then_gives_up_and_cancels(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    blocker = occupy(client, worker)
    start = time.monotonic()
    result = run_rc("run", "-d", "box:gpu0", "--timeout", "1s", "--", "true", env=env)
    assert 0.9 < time.monotonic() - start < 5
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    # CLI-106, with what it waits for appended (EXT-WHY-2)
    assert re.fullmatch(
        rf"rc: queued at position 1 for box:gpu0 — held by tester \(job {blocker[:8]}…\)"
        r" for \d+s",
        lines[0],
    ), lines
    m = re.fullmatch(r"rc: cancelled queued job (\S+)", lines[1])
    assert m, lines
    assert "gave up waiting for box:gpu0" in lines[2] and "deadline exceeded" in lines[2]
    job = client.get_job(m.group(1)).job
    assert job["state"] == "killed" and job["kill_reason"] == "killed by tester"


def test_run_reports_position_changes(
    spawn_rc: Spawn, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    blocker = occupy(client, worker)
    ahead = client.submit(["true"], device="box:gpu0")
    background = spawn_rc("run", "-d", "box:gpu0", "--", "echo", "mine", env=env)
    background.said("queued at position 2")
    client.kill(ahead["id"])
    background.said("queued at position 1")
    worker.behaviour = run_for_real
    client.kill(blocker)
    result = background.result(15)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert [line.split(" — ")[0] for line in lines[:2]] == [
        "rc: queued at position 2 for box:gpu0",
        "rc: queued at position 1 for box:gpu0",
    ]
    assert all(f"held by tester (job {blocker[:8]}…)" in line for line in lines[:2])
    assert lines[2].startswith("rc: job ") and result.stdout == "mine\n"


def test_run_no_wait_busy(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    blocker = occupy(client, worker, who="alice")
    result = run_rc("run", "-d", "box:gpu0", "--no-wait", "--", "true", env=env)
    assert result.exit_code == 1
    # CLI-104, naming the holder (EXT-WHY-2)
    assert re.fullmatch(
        rf"rc: box:gpu0 is busy and could not be queued: held by alice \(job {blocker[:8]}…\)"
        r" for \d+s\n",
        result.stderr,
    ), result.stderr


def test_run_never_started(
    spawn_rc: Spawn, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    occupy(client, worker)
    background = spawn_rc("run", "-d", "box:gpu0", "--", "true", env=env)
    deadline = time.monotonic() + 5
    while not client.state()["queued"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    admin = api.JsonClient(client._http.base_url, ADMIN, submitter="root")
    admin.kill(client.state()["queued"][0]["id"])
    result = background.result(10)
    assert result.exit_code == 1
    last = result.stderr.splitlines()[-1]
    assert (
        "never started" in last
        and "killed" in last
        and "box:gpu0" in last
        and "admin override" in last
    )


def test_run_controller_errors(run_rc: Rc, env: dict[str, str], worker: FakeWorker) -> None:
    result = run_rc("run", "--select", "vram>=200G", "--", "true", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: no_matching_device: ")
    result = run_rc("run", "-d", "box:nope", "--", "true", env=env)
    assert result.stderr.startswith("rc: unknown_device: ")
    result = run_rc("run", "-d", "box:gpu0", "--priority", "11", "--", "true", env=env)
    assert result.stderr.startswith("rc: priority_out_of_range: ")
    result = run_rc("run", "--select", "a==b", "--", "true", env=env)
    assert result.stderr.startswith("rc: bad_selector: ")
    result = run_rc("ps", env={**env, "RC_TOKEN": "wrong"})
    assert result.exit_code == 1 and result.stderr.startswith("rc: unauthorized: ")


def test_unauthorized_without_a_token_says_where_rc_looked(
    run_rc: Rc, env: dict[str, str], controller: LiveController, tmp_path: Path
) -> None:
    # CLI-011: no token anywhere earns the controller's unauthorized; rc adds where it
    # looked, so that a new user knows what to set.
    default = tmp_path / ".config/rc/config.yaml"
    bare: dict[str, str | None] = {
        **env,
        "RC_TOKEN": None,
        "RC_CONFIG": None,
        "XDG_CONFIG_HOME": None,
        "HOME": str(tmp_path),
    }
    result = run_rc("ps", env=bare)
    err = result.stderr
    assert result.exit_code == 1 and err.startswith("rc: unauthorized: "), err
    assert err.count("\n") == 1
    assert "no token was found" in err and "RC_TOKEN is not set" in err
    assert f"{default} does not exist" in err
    typo = tmp_path / "typo.yaml"
    typo.write_text(f'tokn: "{CLIENT}"\n')
    result = run_rc("ps", env={**bare, "RC_CONFIG": str(typo)})
    warning, refusal = result.stderr.splitlines()
    assert warning.startswith("rc: warning: ") and "unknown key tokn" in warning
    assert refusal.startswith("rc: unauthorized: ") and "unknown key tokn" in refusal
    result = run_rc("ps", env={**env, "RC_TOKEN": "wrong"})  # a token was sent: no hint
    assert result.stderr.startswith("rc: unauthorized: ") and "no token" not in result.stderr


def test_explain_against_the_controller(
    run_rc: Rc, env: dict[str, str], controller: LiveController
) -> None:
    fake = FakeWorker(
        controller,
        host="lab",
        devices=("g0", "g1"),
        labels={"g0": {"vram": "80G"}, "g1": {"vram": "40G"}},
    )
    try:
        result = run_rc("run", "--select", "vram>=50G", "--explain", env=env)
        assert result.exit_code == 0, result.stderr
        assert (
            result.stdout
            == "selector: vram>=50G\nmatching (1):\n  lab:g0  free\nfree: 1/1\nqueue depth: 0\n"
        )
        result = run_rc("run", "--select", "vram=", "--explain", env=env)
        assert result.exit_code == 1 and result.stderr.startswith("rc: bad_selector")
        # What a submit refuses as no_matching_device fails here too (exit 1).
        # Stdout keeps its format, the failure line says what the devices have.
        result = run_rc("run", "--select", "vram>=200G", "--explain", env=env)
        assert result.exit_code == 1
        assert result.stdout == (
            "selector: vram>=200G\nmatching: (no device matches this selector)\n"
            "free: 0/0\nqueue depth: 0\n"
        )
        assert result.stderr == (
            "rc: no device matches this selector: vram has '40G' (1 device), '80G' (1 device)\n"
        )
        result = run_rc("run", "--select", "vram>=200G", "--", "true", env=env)
        assert result.exit_code == 1 and result.stderr.startswith("rc: no_matching_device: ")
        assert "vram has '40G' (1 device), '80G' (1 device)" in result.stderr
        result = run_rc("run", "--select", "vram>=40G", "--count", "2", "--explain", env=env)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.endswith("hosts with 2 matching: lab (2 free)\n")
        result = run_rc("run", "--select", "vram>=50G", "--count", "2", "--explain", env=env)
        assert result.exit_code == 1
        assert result.stderr == "rc: no host has 2 devices that match this selector\n"
        submit = run_rc("run", "--select", "vram>=50G", "--count", "2", "--", "true", env=env)
        assert submit.stderr.startswith("rc: no_matching_device: "), submit.stderr
    finally:
        fake.stop()


# ---- rc kill / release ---------------------------------------------------------------------------------


def test_kill_ownership_and_confirmation(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    job_id = occupy(client, worker, who="alice")
    result = run_rc("kill", job_id, env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: not_job_owner: ")
    result = run_rc("kill", job_id, "--as", "alice", env=env)
    assert result.exit_code == 0 and result.stdout == ""
    assert job_id in result.stderr and result.stderr.count("\n") == 1
    wait_state(client, job_id, "killed")
    result = run_rc("release", job_id, "--as", "alice", env=env)
    assert result.exit_code == 1 and "not_cancellable" in result.stderr


def test_release_with_admin_token(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    job_id = occupy(client, worker, who="alice")
    result = run_rc("release", job_id, env={**env, "RC_TOKEN": ADMIN})
    assert result.exit_code == 0 and "released" in result.stderr and job_id in result.stderr
    result = run_rc("kill", "no-such-job", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: not_found: ")


def test_kill_submitter_from_environment(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    job_id = occupy(client, worker, who="carol")
    result = run_rc("kill", job_id, env={**env, "RC_SUBMITTER": "  carol  "})
    assert result.exit_code == 0, result.stderr


# ---- EXT-CLI-7: job IDs by unique prefix ---------------------------------------------------------


def test_job_id_prefixes(
    run_rc: Rc,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from resource_controller.store import jobs as store_jobs

    similar = [f"abcdef0{n}-0000-4000-8000-00000000000{n}" for n in range(7)]
    single = "12345678-0000-4000-8000-000000000000"
    ids = iter([*similar, single])
    with monkeypatch.context() as m:
        m.setattr(store_jobs, "uuid", types.SimpleNamespace(uuid4=lambda: next(ids)))
        for n in range(8):
            job = client.submit(["echo", f"job{n}"], device="box:gpu0")
            wait_state(client, job["id"], "succeeded")

    for args in (["logs", "123456"], ["attach", "1234567"], ["logs", single]):
        result = run_rc(*args, env=env)
        assert (result.exit_code, result.stdout) == (0, "job7\n"), (args, result.stderr)
    assert run_rc("logs", "abcdef03", env=env).stdout == "job3\n"

    result = run_rc("logs", "abcdef", env=env)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "ambiguous" in result.stderr
    newest_five = similar[::-1][:5]
    assert all(i in result.stderr for i in newest_five)  # full IDs, newest first
    assert not any(i in result.stderr for i in similar[:2]) and ", ..." in result.stderr

    result = run_rc("kill", "123456", env=env)  # resolved, then refused: it has ended
    assert result.exit_code == 1 and "not_cancellable" in result.stderr

    result = run_rc("logs", "fedcba", env=env)
    assert (result.exit_code, result.stderr) == (
        1,
        "rc: not_found: no job ID starts with 'fedcba'\n",
    )
    for short in ("12345", "a"):
        result = run_rc("release", short, env=env)
        assert result.exit_code == 1 and "at least 6" in result.stderr, result.stderr


def test_kill_by_prefix_confirms_the_full_id(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    job_id = occupy(client, worker)
    result = run_rc("kill", job_id[:8], env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == f"rc: kill requested for {job_id}\n"
    wait_state(client, job_id, "killed")


# ---- rc logs / attach ----------------------------------------------------------------------------------


def test_logs_and_attach(run_rc: Rc, env: dict[str, str], worker: FakeWorker) -> None:
    result = run_rc("run", "-d", "box:gpu0", "--", "printf", "a\\nb\\000c", env=env)
    job_id = job_id_from(result.stderr)
    for args in (
        ["logs", job_id],
        ["logs", "-f", job_id],
        ["attach", job_id],
        ["logs", job_id, "--follow=true"],
    ):
        got = run_rc(*args, env=env)
        assert got.exit_code == 0 and got.stderr == "", (args, got.stderr)
        assert got.stdout_bytes == b"a\nb\x00c", args


def test_follow_from_an_offset(
    worker: FakeWorker, client: api.JsonClient, run_rc: Rc, env: dict[str, str]
) -> None:
    result = run_rc("run", "-d", "box:gpu0", "--", "printf", "0123456789", env=env)
    job_id = job_id_from(result.stderr)
    assert b"".join(client.follow_logs(job_id, offset=4)) == b"456789"  # EXT-CLI-5
    assert b"".join(client.follow_logs(job_id, follow=False, offset=8)) == b"89"


def test_logs_errors(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    result = run_rc("logs", "nope-nope", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: not_found: ")
    result = run_rc("attach", "00000000-0000-4000-8000-000000000000", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: not_found: ")
    worker.behaviour = lambda w, a: ("succeeded", 0, "")
    tty = client.submit(["sh"], device="box:gpu1", stdio="tty")
    result = run_rc("logs", tty["id"], env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: logs_not_stored")


def test_logs_snapshot_of_a_running_job_does_not_wait(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    job_id = occupy(client, worker)
    start = time.monotonic()
    result = run_rc("logs", job_id, env=env)
    assert result.stdout == "started\n" and time.monotonic() - start < 2


# ---- rc jobs / ps / devices / describe -------------------------------------------------------------------


def test_jobs_filters_and_formats(run_rc: Rc, env: dict[str, str], worker: FakeWorker) -> None:
    run_rc("run", "-d", "box:gpu0", "--", "true", env=env)
    run_rc("run", "-d", "box:gpu1", "--", "false", env=env)
    found = json.loads(run_rc("jobs", "-o", "json", env=env).stdout)
    # Both were submitted within the same second, so their order is by (random) ID.
    assert sorted(j["state"] for j in found) == ["failed", "succeeded"]
    found = json.loads(
        run_rc("jobs", "-o", "json", "--device", "box:gpu0", "-n", "1", env=env).stdout
    )
    assert [j["device_id"] for j in found] == ["box:gpu0"]
    assert run_rc("jobs", "-o", "json", "--state", "queued", env=env).stdout == "[]\n"
    text = run_rc("jobs", "--submitter", "tester", env=env).stdout.splitlines()
    assert text[0].split() == [
        "JOB",
        "DEVICE",
        "STATE",
        "SUBMITTER",
        "STARTED",
        "DURATION",
        "COMMAND",
    ]
    assert len(text) == 3 and {row.split()[2] for row in text[1:]} == {"failed", "succeeded"}
    result = run_rc("jobs", "--state", "bogus", env=env)  # EXT-CLI-8: checked before a request
    assert result.exit_code == 1 and result.stderr.startswith("rc: unknown state 'bogus' (")
    result = run_rc("jobs", "-n", "500", "-o", "json", env=env)  # past one page: read in pages
    assert result.exit_code == 0 and len(json.loads(result.stdout)) == 2, result.stderr
    result = run_rc("jobs", "-n", "10001", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: -n must be in 1..10000 ")


def test_ps_devices_describe(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    running = occupy(client, worker, who="alice")
    queued = client.submit(["python", "train.py"], device="box:gpu0")
    ps = run_rc("ps", env=env).stdout.splitlines()
    # CLI-146, with the WAITING FOR column of EXT-WHY-2 last
    assert ps[0].split() == ["JOB", "DEVICE", "STATE", "SUBMITTER", "COMMAND", "WAITING", "FOR"]
    assert ps[1].split() == [running, "box:gpu0", "running", "alice", "block"]
    assert ps[2].split() == [
        queued["id"],
        "box:gpu0",
        "queued",
        "(#1)",
        "tester",
        "python",
        "train.py",
        "alice",
        "(job",
        f"{running[:8]}…)",
    ]
    assert ps[2].index("alice (job") == ps[0].index("WAITING FOR")
    # -o json: the same rows as the controller's job objects, the queued one saying what
    # it waits for with the controller's own entries.
    listed = json.loads(run_rc("ps", "-o", "json", env=env).stdout)
    assert [(j["id"], j["state"]) for j in listed] == [
        (running, "running"),
        (queued["id"], "queued"),
    ]
    assert "waiting_for" not in listed[0]
    assert [(w["device_id"], w["job_id"]) for w in listed[1]["waiting_for"]] == [
        ("box:gpu0", running)
    ]

    devices = run_rc("devices", env=env).stdout.splitlines()
    row = devices[1].split()
    assert row[:3] == ["box:gpu0", "busy", "alice"] and row[4] == "block"
    assert re.fullmatch(r"\d+s", row[3])  # ELAPSED, compact
    assert devices[2].split() == ["box:gpu1", "ready", "-", "-", "-"]
    views = json.loads(run_rc("devices", "-o", "json", env=env).stdout)
    assert [v["device"]["id"] for v in views] == ["box:gpu0", "box:gpu1"]

    text = run_rc("describe", "box:gpu0", env=env).stdout
    assert text.startswith("box:gpu0  ") and f"job {running}, running" in text
    assert "  held by alice" in text and "LABELS\n  (none)\n" in text
    data = json.loads(run_rc("describe", "box:gpu0", "-o", "json", env=env).stdout)
    assert data["job_id"] == running
    result = run_rc("describe", "box:nope", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: not_found: ")


def test_devices_output_forms(run_rc: Rc, env: dict[str, str], worker: FakeWorker) -> None:
    # EXT-CLI-3: -o takes text or json; a bare -o (anywhere) and --json mean json.
    table = run_rc("devices", env=env).stdout
    assert table.startswith("DEVICE  ")
    for args in (["-o", "text"], ["--output=TEXT"], ["-o", "text", "--select", ""]):
        assert run_rc("devices", *args, env=env).stdout == table, args
    as_json = run_rc("devices", "-o", "json", env=env).stdout
    assert [v["device"]["id"] for v in json.loads(as_json)] == ["box:gpu0", "box:gpu1"]

    def steady(text: str) -> list[dict[str, Any]]:
        """The views without what the real clock moves between two calls (ages, heartbeat)."""
        views = json.loads(text)
        for v in views:
            v.pop("heartbeat_age_seconds", None)
            v.pop("elapsed_seconds", None)
            v["device"].pop("last_heartbeat_at", None)
        return list(views)

    layout = as_json.split('"worker_id"')[0]  # the same indentation and key order up to there
    for args in (["-o"], ["--json"], ["-o", "--json"], ["--output", "json"], ["-ojson"]):
        result = run_rc("devices", *args, env=env)
        assert result.exit_code == 0 and steady(result.stdout) == steady(as_json), args
        assert result.stdout.startswith(layout), args
    assert steady(run_rc("devices", "-o", "--select", "", env=env).stdout) == steady(as_json)


def test_devices_select(run_rc: Rc, env: dict[str, str], controller: LiveController) -> None:
    fake = FakeWorker(
        controller, host="lab", devices=("g0", "g1"), labels={"g0": {"vram": "80G"}, "g1": {}}
    )
    try:
        views = json.loads(run_rc("devices", "--select", "vram>=1G", "--json", env=env).stdout)
        assert [v["device"]["id"] for v in views] == ["lab:g0"]
        result = run_rc("devices", "--select", "vram>", env=env)
        assert result.exit_code == 1 and result.stderr.startswith("rc: bad_selector")
        result = run_rc("devices", "--select", "vram>=1T", "--json", env=env)
        assert result.exit_code == 0 and json.loads(result.stdout) == []
        assert result.stderr == "rc: no device matches: vram has '80G' (1 device)\n"
    finally:
        fake.stop()


# ---- rc clear / retire -----------------------------------------------------------------------------------


def test_clear_and_retire(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    admin = {**env, "RC_TOKEN": ADMIN}
    result = run_rc("clear", "box:gpu1", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("rc: forbidden: ")
    result = run_rc("clear", "box:gpu1", env=admin)
    assert result.exit_code == 1 and result.stderr.startswith("rc: device_not_cleared: ")
    worker.http.request("POST", "/v1/devices/box:gpu1/fault", body={"reason": "verify failed: x"})
    result = run_rc("clear", "box:gpu1", env=admin)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "cleared box:gpu1\n", "")

    occupy(client, worker)
    result = run_rc("retire", "box:gpu0", "--yes", env=admin)
    assert result.exit_code == 1 and result.stderr.startswith("rc: device_busy: ")
    result = run_rc("retire", "box:gpu1", "--yes", env=admin)
    assert result.exit_code == 0 and result.stdout == "retired box:gpu1\n"
    assert result.stderr.startswith("rc: note: ")
    result = run_rc("retire", "box:gpu1", "--yes", env=admin)
    assert result.exit_code == 1 and result.stderr.startswith("rc: device_not_found: ")
