"""Output formats from fixed controller objects (CLI-060..062, CLI-142..157, CLI-050)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from cli.conftest import Rc
from resource_controller.cli import render, timefmt
from resource_controller.client import api, calls


def strip(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


# ---- CLI-062: tables ---------------------------------------------------------------------------


def test_table_pads_all_but_the_last_column() -> None:
    rows = [["DEVICE", "STATE", "HOLDER"], ["gpubox:gpu0", "busy", "alice@laptop"]]
    assert render.table(rows) == "DEVICE       STATE  HOLDER\ngpubox:gpu0  busy   alice@laptop\n"


def test_table_aligns_within_contiguous_blocks_only() -> None:
    rows = [["a", "b"], ["longer-cell", "c"], ["alone"], ["x", "y"]]
    assert render.table(rows) == "a            b\nlonger-cell  c\nalone\nx  y\n"


def test_table_empty_last_cell_may_trail_spaces() -> None:
    assert strip(render.table([["A", "B"], ["x", ""]])) == ["A  B", "x"]


# ---- CLI-050: exit statuses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [(3, 3), (-1, 255), (137, 137), (256, 1), (512, 1), (257, 1), (-256, 1), (1000, 232)],
)
def test_exit_status(code: int, status: int) -> None:
    assert calls.exit_status(code) == status


# ---- fixtures: the controller's answers, fixed ------------------------------------------------

NOW = datetime(2026, 8, 19, 19, 10, 0, tzinfo=UTC)


@pytest.fixture
def fixed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the client's reads with canned answers; returns the dict to fill."""
    answers: dict[str, Any] = {}
    monkeypatch.setattr(timefmt, "utc_now", lambda: NOW)
    monkeypatch.setattr(api.JsonClient, "state", lambda self, **kw: answers["state"])
    monkeypatch.setattr(api.JsonClient, "jobs", lambda self, **kw: answers["jobs"])
    monkeypatch.setattr(api.JsonClient, "describe", lambda self, d, **kw: answers["describe"])
    monkeypatch.setattr(api.JsonClient, "explain", lambda self, s, **kw: answers["explain"])
    return answers


def job(**fields: Any) -> dict[str, Any]:
    base = {
        "id": "",
        "selector": "",
        "kind": "job",
        "command": [],
        "cwd": "",
        "submitter": "",
        "priority": 0,
        "state": "queued",
        "device_id": "",
        "worker_id": "",
        "submitted_at": "2026-08-19T18:00:00Z",
    }
    base.update(fields)
    return base


JOB_A = "7c0d9e1a-55aa-4c1e-9d7e-0a6b2f3e4d51"
JOB_B = "b2f1c3d4-1111-4a2b-8c3d-9e8f7a6b5c4d"


def test_jobs_table_matches_the_spec_example(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["jobs"] = [
        job(
            id=JOB_A,
            device_id="gpubox:gpu0",
            state="killed",
            kill_reason="idle: no output for 10m0s",
            submitter="alice@laptop",
            started_at="2026-08-19T18:57:57Z",
            finished_at="2026-08-19T19:10:01Z",
            command=["python", "train.py"],
        ),
        job(id=JOB_B, submitter="agent-b@build", command=["./eval"]),
    ]
    result = run_rc("jobs")
    assert result.exit_code == 0
    assert strip(result.stdout) == [
        "JOB                                   DEVICE       STATE                               SUBMITTER      STARTED               DURATION  COMMAND",
        f"{JOB_A}  gpubox:gpu0  killed (idle: no output for 10m0s)  alice@laptop   2026-08-19T18:57:57Z  12m4s     python train.py",
        f"{JOB_B}  -            queued                              agent-b@build  -                     -         ./eval",
    ]


def test_jobs_duration_of_a_running_job_uses_now(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["jobs"] = [job(id="j", state="running", started_at="2026-08-19T17:09:59Z", command=["x"])]
    row = strip(run_rc("jobs").stdout)[1].split()
    assert row[4:6] == ["2026-08-19T17:09:59Z", "2h0m1s"]


def test_jobs_json_is_one_compact_line(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["jobs"] = [job(id="j", command=["a b", "c"], env={"K": "é"})]
    out = run_rc("jobs", "-o", "json").stdout
    assert out.count("\n") == 1 and out.endswith("]\n")
    assert '"command":["a b","c"]' in out and '"env":{"K":"é"}' in out
    fixed["jobs"] = []
    assert run_rc("jobs", "--output=JSON").stdout == "[]\n"


def test_ps_active_then_queue_with_per_device_counters(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["state"] = {
        "devices": [],
        "jobs": [
            job(
                id="25147ef7-7bf4-40b9-9034-31e294e5be1a",
                device_id="gpubox:gpu0",
                state="running",
                submitter="alice@laptop",
                command=["sh", "-c", "sleep 30"],
            )
        ],
        "queued": [
            job(id="q1", device_id="gpubox:gpu0", submitter="agent-b@build", command=["./train"]),
            job(id="q2", device_id="", selector="vram>=40G", submitter="s", command=["x"]),
            job(id="q3", device_id="gpubox:gpu1", submitter="s", command=["hold"], kind="hold"),
            job(id="q4", device_id="gpubox:gpu0", submitter="s", command=["y"]),
            job(id="q5", device_id="", submitter="s", command=["z"]),
        ],
    }
    assert strip(run_rc("ps").stdout) == [
        "JOB                                   DEVICE       STATE        SUBMITTER      COMMAND",
        "25147ef7-7bf4-40b9-9034-31e294e5be1a  gpubox:gpu0  running      alice@laptop   sh -c sleep 30",
        "q1                                    gpubox:gpu0  queued (#1)  agent-b@build  ./train",
        "q2                                                 queued (#1)  s              x",
        "q3                                    gpubox:gpu1  queued (#1)  s              hold",
        "q4                                    gpubox:gpu0  queued (#2)  s              y",
        "q5                                                 queued (#2)  s              z",
    ]


def test_ps_json_is_the_job_objects_in_the_tables_order(run_rc: Rc, fixed: dict[str, Any]) -> None:
    # rc ps -o json: one compact line like rc jobs -o json (CLI-143), active jobs first,
    # then the queue in scheduling order; a queued job carries what it waits for
    # (EXT-WHY-1a's entries, as GET /v1/jobs/{id} gives them) when the controller said.
    running = job(id="r1", device_id="gpubox:gpu0", state="running", command=["a b", "c"])
    first = job(id="q1", device_id="gpubox:gpu0", command=["./train"], env={"K": "é"})
    second = job(id="q2", selector="vram>=40G", command=["x"])
    blocker = {"device_id": "gpubox:gpu0", "holder": "alice", "job_id": "r1", "kind": "job"}
    fixed["state"] = {
        "devices": [],
        "jobs": [running],
        "queued": [first, second],
        "queued_waiting_for": {"q1": [blocker]},
    }
    out = run_rc("ps", "-o", "json").stdout
    assert out.count("\n") == 1 and out.endswith("]\n")
    assert '"command":["a b","c"]' in out and '"env":{"K":"é"}' in out
    assert json.loads(out) == [running, {**first, "waiting_for": [blocker]}, second]
    fixed["state"] = {"devices": [], "jobs": [], "queued": []}
    assert run_rc("ps", "--output=JSON").stdout == "[]\n"
    assert run_rc("ps", "-o", "text").stdout.startswith("JOB ")


def device_view(dev: str, state: str, **fields: Any) -> dict[str, Any]:
    host, name = dev.split(":")
    view: dict[str, Any] = {
        "device": {
            "id": dev,
            "host": host,
            "name": name,
            "worker_id": "w",
            "state": state,
            "last_heartbeat_at": "2026-08-19T19:09:58Z",
        },
        "elapsed_seconds": 0,
        "heartbeat_age_seconds": 2,
    }
    view.update(fields)
    return view


def test_devices_table_matches_the_spec_example(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["state"] = {
        "devices": [
            device_view(
                "gpubox:gpu0",
                "busy",
                holder="alice@laptop",
                job_id="j1",
                kind="job",
                command=["./bench", "--fast"],
                elapsed_seconds=125,
            ),
            device_view(
                "gpubox:gpu1",
                "busy",
                holder="bob@ws",
                job_id="j2",
                kind="hold",
                reason="manual profiling",
                command=["hold"],
                elapsed_seconds=3600,
            ),
            device_view("gpubox:gpu2", "unknown", heartbeat_age_seconds=47),
        ],
        "jobs": [],
        "queued": [],
    }
    assert strip(run_rc("devices").stdout) == [
        "DEVICE       STATE                     HOLDER                     ELAPSED  COMMAND",
        "gpubox:gpu0  busy                      alice@laptop               2m5s     ./bench --fast",
        "gpubox:gpu1  busy                      bob@ws (manual profiling)  1h0m0s   hold",
        "gpubox:gpu2  unknown (no contact 47s)  -                          -        -",
    ]


def test_devices_no_contact_only_above_30s_and_draining(run_rc: Rc, fixed: dict[str, Any]) -> None:
    drained = device_view("b:g1", "ready")
    drained["device"]["draining"] = True
    fixed["state"] = {
        "devices": [
            device_view("b:g0", "unhealthy", heartbeat_age_seconds=30, quarantine_reason="fault"),
            drained,
        ],
        "jobs": [],
        "queued": [],
    }
    rows = strip(run_rc("devices").stdout)
    assert rows[1].split()[:2] == ["b:g0", "unhealthy"] and "no contact" not in rows[1]
    assert "ready (draining)" in rows[2]


def test_devices_json_indented_and_select_filters_in_state_order(
    run_rc: Rc, fixed: dict[str, Any]
) -> None:
    fixed["state"] = {
        "devices": [
            device_view("b:g0", "ready"),
            device_view("b:g1", "ready"),
            device_view("b:g2", "ready"),
        ],
        "jobs": [],
        "queued": [],
    }
    fixed["explain"] = {
        "selector": "x=1",
        "matching": ["b:g2", "b:g0"],
        "free": [],
        "queue_depth": 0,
    }
    out = run_rc("devices", "--select", "x=1", "--json").stdout
    assert out.startswith('[\n  {\n    "device": {') and out.endswith("]\n")
    import json

    assert [v["device"]["id"] for v in json.loads(out)] == ["b:g0", "b:g2"]
    fixed["state"]["devices"] = []
    assert run_rc("devices", "-o", "json").stdout == "[]\n"


def test_explain_report(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["explain"] = {
        "selector": "vram>=40G",
        "matching": ["b:gpu0", "b:gpu10"],
        "free": ["b:gpu10"],
        "queue_depth": 3,
    }
    result = run_rc("run", "--select", "vram >= 40G", "--explain", "--", "ignored")
    assert result.stdout == (
        "selector: vram>=40G\nmatching (2):\n  b:gpu0  busy\n  b:gpu10  free\nfree: 1/2\nqueue depth: 3\n"
    )
    assert result.exit_code == 0 and result.stderr == ""


def test_explain_of_no_match_reports_and_fails(run_rc: Rc, fixed: dict[str, Any]) -> None:
    # As a submit of the same selector fails (no_matching_device): exit 1, one rc: line.
    fixed["explain"] = {"selector": "a=b", "matching": [], "free": [], "queue_depth": 0}
    result = run_rc("run", "--select", "a=b", "--explain")
    assert result.exit_code == 1
    assert result.stdout == (
        "selector: a=b\nmatching: (no device matches this selector)\nfree: 0/0\nqueue depth: 0\n"
    )
    assert result.stderr == "rc: no device matches this selector\n"


def test_explain_with_a_count_names_the_hosts_that_hold_it(
    run_rc: Rc, fixed: dict[str, Any]
) -> None:
    fixed["explain"] = {
        "selector": "x=1",
        "matching": ["a:g0", "a:g1", "b:g0", "c:g0", "c:g1", "c:g2"],
        "free": ["a:g1", "b:g0", "c:g0", "c:g2"],
        "queue_depth": 1,
    }
    result = run_rc("run", "--select", "x=1", "--count", "2", "--explain")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith(
        "free: 4/6\nqueue depth: 1\nhosts with 2 matching: a (1 free), c (2 free)\n"
    )
    result = run_rc("run", "--select", "x=1", "--count", "4", "--explain")
    assert result.exit_code == 1
    assert result.stdout.endswith("queue depth: 1\nhosts with 4 matching: none\n")
    assert result.stderr == "rc: no host has 4 devices that match this selector\n"


DESCRIBE = {
    "device": {
        "id": "gpubox:gpu0",
        "host": "gpubox",
        "name": "gpu0",
        "worker_id": "w",
        "state": "busy",
        "last_heartbeat_at": "2026-08-19T19:09:57Z",
    },
    "holder": "alice@laptop",
    "job_id": "25147ef7-7bf4-40b9-9034-31e294e5be1a",
    "elapsed_seconds": 125,
    "heartbeat_age_seconds": 3,
    "labels": [
        {"key": "vram", "value": "40G", "source": "declared", "updated_at": "x"},
        {"key": "rack", "value": "r3", "source": "declared", "updated_at": "x"},
        {"key": "vram", "value": "80G", "source": "detected", "updated_at": "x"},
        {"key": "gpu0.vram", "value": "81920M", "source": "detected", "updated_at": "x"},
    ],
    "label_age_seconds": {
        "gpu0.vram/detected": 240,
        "rack/declared": 9 * 86400 + 5,
        "vram/detected": 250,
        "vram/declared": 95 * 86400,
    },
    "sheet": "# gpubox — shared training box\nScratch space is /scratch (wiped Sundays).",
    "sheet_updated_at": "2026-08-19T17:10:00Z",
    "sheet_age_seconds": 7200,
    "sheet_is_host_wide": True,
    "recent_jobs": [
        job(
            id="25147ef7-7bf4-40b9-9034-31e294e5be1a",
            state="running",
            started_at="2026-08-19T19:07:55Z",
            command=["./bench", "--fast"],
        ),
        job(
            id="0f3e2d1c-aaaa-4bbb-8ccc-1234567890ab",
            state="killed",
            kill_reason="max_runtime exceeded (1h0m0s)",
            started_at="2026-08-19T16:00:00Z",
            finished_at="2026-08-19T17:00:00Z",
            command=["python", "train.py"],
        ),
    ],
}


def test_describe_text_matches_the_spec_example(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["describe"] = DESCRIBE
    result = run_rc("describe", "gpubox:gpu0")
    assert result.exit_code == 0, result.stderr
    assert strip(result.stdout) == [
        "gpubox:gpu0             busy",
        "  held by alice@laptop  job 25147ef7-7bf4-40b9-9034-31e294e5be1a, running 2m5s",
        "  heartbeat             3s ago",
        "",
        "LABELS",
        "  gpu0.vram=81920M  detected 4m ago",
        "  rack=r3           declared 9d ago",
        "  vram=80G          detected 4m ago",
        "  vram=40G          declared 3mo ago",
        "",
        "USAGE SHEET",
        "  host-wide note, updated 2h ago",
        "  # gpubox — shared training box",
        "  Scratch space is /scratch (wiped Sundays).",
        "",
        "RECENT JOBS",
        "  JOB                                   STATE                                   DURATION  COMMAND",
        "  25147ef7-7bf4-40b9-9034-31e294e5be1a  running                                 2m5s      ./bench --fast",
        "  0f3e2d1c-aaaa-4bbb-8ccc-1234567890ab  killed (max_runtime exceeded (1h0m0s))  1h0m0s    python train.py",
    ]


def test_describe_shows_what_the_gpus_did_when_a_job_measured_it(
    run_rc: Rc, fixed: dict[str, Any]
) -> None:
    # EXT-ACCT-1: "rc describe-style job output"; a GPU column only then.
    measured = dict(DESCRIBE)
    recent = cast(list[dict[str, Any]], DESCRIBE["recent_jobs"])
    measured["recent_jobs"] = [
        recent[0],
        {**recent[1], "gpu_util_mean": 86.6, "gpu_mem_peak_bytes": 21474836480, "samples": 360},
    ]
    fixed["describe"] = measured
    lines = strip(run_rc("describe", "gpubox:gpu0").stdout)
    assert lines[-3:] == [
        "  JOB                                   STATE                                   DURATION  GPU          COMMAND",
        "  25147ef7-7bf4-40b9-9034-31e294e5be1a  running                                 2m5s      -            ./bench --fast",
        "  0f3e2d1c-aaaa-4bbb-8ccc-1234567890ab  killed (max_runtime exceeded (1h0m0s))  1h0m0s    87% 20.0GiB  python train.py",
    ]


def test_describe_free_unhealthy_and_empty(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["describe"] = {
        "device": {"id": "b:g0", "state": "unhealthy"},
        "elapsed_seconds": 0,
        "heartbeat_age_seconds": -5,
        "quarantine_reason": "verify failed: leftover pid 42",
        "labels": [{"key": "k", "value": "v", "source": "detected", "updated_at": "x"}],
        "sheet_updated_at": "0001-01-01T00:00:00Z",
    }
    lines = strip(run_rc("describe", "b:g0").stdout)
    assert lines[:4] == [
        "b:g0  unhealthy",
        "  free",
        "  heartbeat        5s in the future (clock skew?)",
        "  out of the pool  verify failed: leftover pid 42",
    ]
    assert "  k=v  detected age unknown (controller may be out of date)" in lines
    assert "  (none on file)" in lines
    assert lines[-2:] == ["RECENT JOBS", "  (none)"]


def test_describe_json_is_the_object_indented(run_rc: Rc, fixed: dict[str, Any]) -> None:
    fixed["describe"] = DESCRIBE
    import json

    out = run_rc("describe", "gpubox:gpu0", "-o", "json").stdout
    assert json.loads(out) == DESCRIBE and out.startswith('{\n  "device"')


def test_table_write_failure_is_non_zero(
    run_rc: Rc, fixed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed["state"] = {"devices": [], "jobs": [], "queued": []}

    def broken(data: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(render, "write_bytes", broken)
    result = run_rc("ps")
    assert result.exit_code != 0


def test_describe_shows_the_flap_guard_history(run_rc: Rc, fixed: dict[str, Any]) -> None:
    # STORE-123 as rc describe shows it: recoveries in the window and how many are left.
    fixed["describe"] = {
        "device": {"id": "b:g0", "state": "ready"},
        "elapsed_seconds": 0,
        "heartbeat_age_seconds": 1,
        "sheet_updated_at": "0001-01-01T00:00:00Z",
        "recoveries": {
            "recoveries": [
                {"at": "2026-08-19T18:00:00Z", "reason": "registration"},
                {"at": "2026-08-19T17:40:00Z", "reason": "worker_lost"},
                {"at": "2026-08-19T17:30:00Z", "reason": "lease_expired"},
            ],
            "remaining": 0,
            "limit": 3,
            "window_seconds": 3600,
        },
    }
    lines = strip(run_rc("describe", "b:g0").stdout)
    assert lines[3] == (
        "  auto-recovered  3 in the last hour, 0 left (the next quarantine waits for rc clear)"
    )
    assert lines[4].split() == ["2026-08-19T18:00:00Z", "from", "registration"]
