"""Structured logs that never carry a token: rc serve and rc worker as real processes
with ``--log-format json`` (EXT-METRICS-2)."""

from __future__ import annotations

import json
from pathlib import Path

from .cluster import Cluster, stop

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
