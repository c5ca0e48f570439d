"""Structured logs that never carry a token: rc serve, rc worker and rc up as real
processes with ``--log-format json`` (EXT-METRICS-2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from .cluster import RC, Cluster, free_port, stop, wait_for
from .test_here import _up_env

WORKER_TOKEN = "wtok-7c1f9a3e5d2b8046"
CLIENT_TOKEN = "ctok-4e8a2d6b0f9c1357"
ADMIN_TOKEN = "atok-9b3d5f7a1c2e4680"
WRONG_TOKEN = "nope-2a4c6e8f0b1d3579"
ALL_TOKENS = (WORKER_TOKEN, CLIENT_TOKEN, ADMIN_TOKEN, WRONG_TOKEN)


def json_lines(path: Path) -> list[dict[str, object]]:
    """Every line of ``path`` as a JSON object; fails naming the first line that is not."""
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"{path.name}:{n} is not JSON: {line!r}") from exc
        assert isinstance(record, dict), f"{path.name}:{n}: {line!r}"
        assert {"time", "level", "logger", "message"} <= record.keys(), line
        records.append(record)
    return records


def test_json_logs_parse_and_carry_no_token(cluster: Cluster) -> None:
    cluster.start_controller(
        "--log-format",
        "json",
        # "ctok" is the token the cluster helpers poll with while waiting.
        tokens=f"{WORKER_TOKEN}:worker,{CLIENT_TOKEN}:client,{ADMIN_TOKEN}:admin,ctok:client",
    )
    cluster.start_worker("box", ["gpu0"], token=WORKER_TOKEN, args=("--log-format", "json"))

    outputs: list[str] = []

    ok = cluster.rc("run", "--", "sh", "-c", "echo hello", token=CLIENT_TOKEN)
    assert ok.returncode == 0, ok.stderr + cluster.logs()
    assert "hello" in ok.stdout
    failed = cluster.rc("run", "--", "sh", "-c", "echo bye; exit 3", token=CLIENT_TOKEN)
    assert failed.returncode == 3, failed.stderr + cluster.logs()
    refused = cluster.rc("run", "--", "true", token=WRONG_TOKEN)
    assert refused.returncode != 0, refused.stdout
    for r in (ok, failed, refused):
        outputs += [r.stdout, r.stderr]

    # Stopped first, so what they write on the way out is read as well.
    for proc in reversed(cluster.procs):
        stop(proc)
    for name in ("controller.log", "worker-box.log"):
        path = cluster.tmp / name
        assert json_lines(path), f"{name} is empty"
        outputs.append(path.read_text())

    for text in outputs:
        for token in ALL_TOKENS:
            assert token not in text, text


def test_rc_up_json_lines_only_and_no_token(tmp_path: Path) -> None:
    # EXT-METRICS-2 for rc up: controller and worker share one stderr, and with
    # --log-format json every line of it is a JSON object, the ready banner included;
    # the generated tokens appear nowhere, though the admin token's file is named.
    env = _up_env(tmp_path)
    data = tmp_path / "data"
    err_path, out_path = tmp_path / "up.err", tmp_path / "up.out"
    with open(err_path, "wb") as err, open(out_path, "wb") as out:
        up = subprocess.Popen(
            [
                RC,
                "up",
                "--data",
                str(data),
                "--addr",
                f"127.0.0.1:{free_port()}",
                "--log-format",
                "json",
            ],
            env=env,
            stdout=out,
            stderr=err,
        )
    outputs: list[str] = []
    try:
        wait_for(lambda: "try:" in err_path.read_text(), 30, "rc up's ready banner")
        tokens = dict(line.split("=", 1) for line in (data / "up-tokens").read_text().splitlines())
        assert set(tokens) == {"worker", "client", "admin"}

        def rc(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [RC, *args], env=dict(env, **extra), capture_output=True, text=True, timeout=60
            )

        ok = rc("run", "--", "sh", "-c", "echo hello")
        assert ok.returncode == 0 and ok.stdout == "hello\n", ok.stderr + err_path.read_text()
        failed = rc("run", "--", "sh", "-c", "exit 3")
        assert failed.returncode == 3, failed.stderr
        refused = rc("run", "--", "true", RC_TOKEN=WRONG_TOKEN)
        assert refused.returncode != 0
        for r in (ok, failed, refused):
            outputs += [r.stdout, r.stderr]
    finally:
        assert stop(up, signal.SIGINT, timeout=30) == 0

    records = json_lines(err_path)
    messages = [str(r["message"]) for r in records]
    assert any(m.startswith("controller on http://127.0.0.1:") for m in messages), messages
    assert any(str(data / "up-tokens") in m for m in messages), messages
    assert out_path.read_text() == ""
    outputs.append(err_path.read_text())
    for text in outputs:
        for token in (*tokens.values(), WRONG_TOKEN):
            assert token not in text, text


def test_a_fatal_start_up_error_is_a_json_line_too(cluster: Cluster, tmp_path: Path) -> None:
    # Under --log-format json even a process's last words are one JSON object a line:
    # a worker refused at registration, a worker without its config, a controller
    # without tokens.
    cluster.start_controller()
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        f"controller_url: {cluster.url}\ntoken: wrong\nhost: box\n"
        f"state_dir: {tmp_path / 'state'}\ndevices: [gpu0]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RC_TOKENS"}
    runs = {
        "refused": [RC, "worker", "-c", str(cfg), "--log-format", "json"],
        "no config": [RC, "worker", "-c", str(tmp_path / "nope.yaml"), "--log-format", "json"],
        "no tokens": [
            RC,
            "serve",
            "--addr",
            f"127.0.0.1:{free_port()}",
            "--data",
            str(tmp_path / "d"),
            "--log-format",
            "json",
        ],
    }
    for what, argv in runs.items():
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (what, r.stderr)
        lines = r.stderr.splitlines()
        records = [json.loads(line) for line in lines]  # every line parses
        assert records[-1]["level"] == "ERROR" and records[-1]["message"], (what, lines)
