"""The transition tables (STORE-021, STORE-041) and the one helper that applies them.

Every edge of each table is exercised through ``store.moves``: each operation from each
legal source reaches each of its targets, and from any other source it changes nothing.
The guard in ``tests/move_guard.py`` (an autouse fixture for the whole suite) fails any
test in which a job or device state was written without going through the helper; the
last tests here show that it does notice such a write.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import move_guard
from resource_controller import errors
from resource_controller.core.states import DeviceState, JobState
from resource_controller.core.transitions import DEVICE, JOB, Machine, Op
from resource_controller.store import moves
from resource_controller.store.facade import Store

from .dbview import Raw

MACHINES = (DEVICE, JOB)

if TYPE_CHECKING:
    from conftest import Factory

STORE_SRC = Path(__file__).parents[2] / "src" / "resource_controller" / "store"


def _state(raw: Raw, table: str, row_id: str) -> str | None:
    rows = raw.rows(f"SELECT state FROM {table} WHERE id = ?", row_id)
    return rows[0]["state"] if rows else None


def _try(store: Store, machine: Machine, op: Op, row_id: str, target: str | None) -> int | str:
    try:
        with store.tx() as c:
            if target is None:
                return moves.remove(c, machine, op, "id = ?", (row_id,))
            return moves.move(c, machine, op, "id = ?", (row_id,), state=target)
    except errors.InvalidTransition:
        return "refused"


def test_every_device_edge(store: Store, raw: Raw, make: Factory) -> None:
    targets: list[str | None] = [*DeviceState, None]
    for op, move in DEVICE.moves.items():
        for source in DeviceState:
            for target in targets:
                if _state(raw, "devices", "box:gpu0") is None:  # retired by the last case
                    make.worker(devices=1)
                device = "box:gpu0"
                raw.force_device(device, source)
                got = _try(store, DEVICE, op, device, target)
                after = _state(raw, "devices", device)
                case = (op, source, target, got, after)
                if target not in move.targets:
                    assert got == "refused" and after == source, case
                elif source in move.sources:
                    assert got == 1 and after == target, case
                else:
                    assert got == 0 and after == source, case


def test_every_job_edge(store: Store, raw: Raw, make: Factory) -> None:
    make.worker()
    job = make.submit(device="box:gpu0").id
    for op, move in JOB.moves.items():
        for source in JobState:
            for target in JobState:
                raw.write("UPDATE jobs SET state = ? WHERE id = ?", source, job)
                got = _try(store, JOB, op, job, target)
                after = _state(raw, "jobs", job)
                case = (op, source, target, got, after)
                if target not in move.targets:
                    assert got == "refused" and after == source, case
                elif source in move.sources:
                    assert got == 1 and after == target, case
                else:
                    assert got == 0 and after == source, case


def test_rows_are_created_only_by_ops_from_no_row(store: Store, raw: Raw, make: Factory) -> None:
    make.worker(devices=1)
    template = dict(raw.rows("SELECT * FROM jobs WHERE id = ?", make.submit().id)[0])
    for op, move in JOB.moves.items():
        for target in JobState:
            seq = 1 + raw.rows("SELECT MAX(seq) AS n FROM jobs")[0]["n"]
            row = template | {"id": f"{op}-{target}", "seq": seq, "state": target}
            try:
                with store.tx() as c:
                    moves.create(c, JOB, op, row)
                got = "created"
            except errors.InvalidTransition:
                got = "refused"
            want = "created" if (None in move.sources and target in move.targets) else "refused"
            assert got == want, (op, target)
    with store.tx() as c, pytest.raises(errors.InvalidTransition):
        moves.create(c, DEVICE, Op.CLEAR, {"id": "x:y", "state": DeviceState.READY})


def test_the_tables_name_only_real_states_and_every_op_has_a_call_site() -> None:
    source = "\n".join(p.read_text() for p in STORE_SRC.glob("*.py"))
    used = set(re.findall(r"\bOp\.([A-Z_]+)\b", source))
    for machine in MACHINES:
        states = set(DeviceState if machine is DEVICE else JobState) | {None}
        for op, move in machine.moves.items():
            assert move.sources and move.targets, op
            assert move.sources <= states and move.targets <= states, op
            assert op.name in used, f"{op} is in the {machine.entity} table but never applied"
    assert used <= {op.name for op in Op}


def test_no_device_op_returns_an_unhealthy_device_except_the_listed_paths() -> None:
    # STORE-022: only operator clear, proven reboot, auto-recovery proof, a heartbeat
    # naming a worker_lost device's job, and the host's own report lift unhealthy.
    lifting = {
        op
        for op, m in DEVICE.moves.items()
        if DeviceState.UNHEALTHY in m.sources and m.targets - {DeviceState.UNHEALTHY}
    }
    assert lifting == {
        Op.CLEAR,
        Op.REBOOT_RECOVER,
        Op.AUTO_RECOVER,
        Op.HEARTBEAT_RESTORE,
        Op.HOST_REPORT,
        Op.RETIRE,
    }
    # STORE-183: no sweep op ends in ready.
    for op in (Op.SWEEP_UNKNOWN, Op.WRITE_OFF, Op.EXPIRE):
        assert DeviceState.READY not in DEVICE.move(op).targets


def test_the_guard_notices_a_state_write_that_bypasses_the_helper(
    store: Store, make: Factory
) -> None:
    (device,) = make.worker(devices=1)
    with store.tx() as c:
        c.execute(
            "UPDATE devices SET last_heartbeat_at = 1, state = 'busy' WHERE id = ?", (device,)
        )
        c.execute("UPDATE devices SET last_heartbeat_at = 1")  # not a state write
        c.execute("UPDATE jobs SET kill_requested = 1 WHERE state = 'running'")  # nor this
    assert len(move_guard.bypasses) == 1 and "UPDATE devices" in move_guard.bypasses[0]
    move_guard.bypasses.clear()
    with store.tx() as c:
        c.execute("DELETE FROM jobs WHERE id = ?", ("nope",))
        c.execute(
            "INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at)"
            " VALUES ('x:y', 'x', 'y', 'w', 'ready', 0)"
        )
    assert len(move_guard.bypasses) == 2
    move_guard.bypasses.clear()


def test_the_guard_sees_the_moves_the_store_makes(make: Factory) -> None:
    move_guard.moved.clear()
    make.worker(devices=1)
    make.start()
    assert {"device:register_new", "job:enqueue", "device:assign", "job:assign"} <= set(
        move_guard.moved
    )
    assert "job:mark_running" in move_guard.moved
