"""EXT-HERE end to end: a local job runs where you are, and rc up tells the truth."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

from .cluster import RC, Cluster, free_port, stop, wait_for
from .test_spine import JOB_LINE

ALLOWED = {
    "PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
}


def test_run_here_sends_the_directory_and_only_the_allowed_variables(
    cluster: Cluster, tmp_path: Path
) -> None:
    # EXT-HERE-2: the job sees the caller's directory and virtualenv; SECRET_X never
    # leaves the caller, and the stored env holds exactly the allowed keys that are set.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    project = tmp_path / "project"
    project.mkdir()
    env = cluster.env(VIRTUAL_ENV=str(tmp_path / "venv"), SECRET_X="1")
    r = subprocess.run(
        [RC, "run", "--here", "--", "sh", "-c", 'pwd; echo "v=$VIRTUAL_ENV s=$SECRET_X"'],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, (r.stderr, cluster.logs())
    assert r.stdout == f"{project}\nv={tmp_path / 'venv'} s=\n"
    m = JOB_LINE.search(r.stderr)
    assert m, r.stderr
    job = cluster.job(m.group(1))
    assert job["cwd"] == str(project)
    sent = job["env"]
    assert isinstance(sent, dict)
    assert set(sent) == {k for k in ALLOWED if k in env}
    assert "SECRET_X" not in sent and sent["VIRTUAL_ENV"] == str(tmp_path / "venv")


def _up_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("XDG_DATA_HOME", None)
    env["HOME"] = str(tmp_path)
    return env


def test_second_rc_up_on_one_data_directory_refuses_without_a_banner(tmp_path: Path) -> None:
    # EXT-HERE-5: a state directory in use is an error, exit non-zero, and no ready banner.
    env = _up_env(tmp_path)
    data = tmp_path / "data"
    first = subprocess.Popen(
        [RC, "up", "--data", str(data), "--addr", f"127.0.0.1:{free_port()}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        cfg = tmp_path / ".config/rc/config.yaml"
        wait_for(cfg.exists, 20, "the first rc up to be ready")
        before = cfg.read_bytes()
        second = subprocess.run(
            [RC, "up", "--data", str(data), "--addr", f"127.0.0.1:{free_port()}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode != 0
        assert "in use" in second.stderr and str(data) in second.stderr, second.stderr
        assert "controller on" not in second.stderr and "try:" not in second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert cfg.read_bytes() == before  # the config was not touched
        assert first.poll() is None  # and the first one carries on
    finally:
        assert stop(first, signal.SIGINT, timeout=30) == 0
    out = first.stderr.read().decode() if first.stderr else ""
    assert "rc: controller on http://127.0.0.1:" in out and "written to" in out
    # No GPU here: the suggested first command is one that works, and the dashboard's
    # address and the token to paste are named.
    assert "try:  rc run -- hostname" in out and "nvidia-smi" not in out, out
    assert "rc: dashboard: http://127.0.0.1:" in out and "up-tokens" in out, out


def test_rc_up_with_a_taken_port_exits_without_a_banner(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run(
            [RC, "up", "--data", str(tmp_path / "data"), "--addr", f"127.0.0.1:{port}"],
            env=_up_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert r.returncode != 0 and "in use" in r.stderr and "try:" not in r.stderr
    assert not (tmp_path / ".config/rc/config.yaml").exists()


def test_rc_up_keeps_another_controller_and_says_so(tmp_path: Path) -> None:
    # EXT-HERE-5: it never claims to have written a controller it kept.
    env = _up_env(tmp_path)
    cfg = tmp_path / ".config/rc/config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('controller: "http://shared.example:9"\n')
    up = subprocess.Popen(
        [RC, "up", "--data", str(tmp_path / "data"), "--addr", f"127.0.0.1:{free_port()}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: "run: {here: true}" in cfg.read_text(), 20, "rc up to be ready")
    finally:
        assert stop(up, signal.SIGINT, timeout=30) == 0
    out = up.stderr.read().decode() if up.stderr else ""
    assert "written to" not in out, out
    assert "http://shared.example:9" in out and "kept it" in out and "--force" in out
    assert 'controller: "http://shared.example:9"' in cfg.read_text()


def test_rc_up_stops_relayed_and_plain_jobs_in_bounded_time_and_says_what_it_did(
    cluster: Cluster,
) -> None:
    # EXT-UP, with the data directory private (0700, its files 0600).
    # Stopping rc up ends every running job (the worker's shutdown), says which, and
    # keeps answering long enough for each blocked client to read its job's end.
    up = cluster.start_up()
    mark = cluster.tmp / "started"
    plain = cluster.popen_rc("run", "-d", cluster.dev, "--", "sh", "-c", f"touch {mark}; sleep 60")
    # The relayed one only once the first runs: submitted together, either may take the
    # device, and the first would then wait behind a cat that never ends.
    wait_for(mark.exists, 20, "the first job's process to start")
    relayed = subprocess.Popen(
        [RC, "run", "-i", "-d", cluster.dev, "--", "cat"],
        env=cluster.env(),
        stdin=subprocess.PIPE,  # never closed: the job would wait for it forever
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    cluster.procs.append(relayed)
    wait_for(lambda: queued_behind(cluster), 20, "the relayed job to queue behind the first")
    assert up.stdout is None  # rc up's output goes to up.log
    data = cluster.tmp / "data"
    modes = {p.relative_to(data): stat.S_IMODE(p.stat().st_mode) for p in data.rglob("*")}
    modes[Path(".")] = stat.S_IMODE(data.stat().st_mode)
    assert {str(p): m for p, m in modes.items() if m not in (0o600, 0o700)} == {}
    assert modes[Path(".")] == modes[Path("logs")] == 0o700 and modes[Path("rc.db")] == 0o600
    started = time.monotonic()
    assert stop(up, signal.SIGINT, timeout=60) == 0
    took = time.monotonic() - started
    assert took < 30, took
    said = (cluster.tmp / "up.log").read_text()
    assert "the worker ended 1 running job(s)" in said and "stopped" in said, said
    # The relayed job was queued; the device the stop freed may have been handed to it.
    assert "1 queued job(s) wait" in said or "1 job(s) handed to the worker" in said, said
    _, err = plain.communicate(timeout=30)
    assert "cancelled: worker stopped" in err, err
    relayed.communicate(timeout=60)  # it ends too: rc up is gone


def queued_behind(c: Cluster) -> bool:
    status, state = c.api("GET", "/v1/state")
    running = (
        [j for j in state.get("jobs") or [] if j["state"] == "running"] if status == 200 else []
    )
    return len(running) == 1 and len(state.get("queued") or []) == 1
