"""The transition tables, keyed by operation (``None`` is "no row"); ``store.moves`` writes a state
only through them, so an edge missing here cannot happen."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from resource_controller.core.states import ACTIVE, TERMINAL, DeviceState, JobState


class Op(StrEnum):
    """The operations that move a device or a job, named after their call sites."""

    REGISTER_NEW = "register_new"  # registration declares a new device
    REDECLARE = "redeclare"  # registration re-declares an existing device
    REAP = "reap"  # registration reap without reboot proof
    REAP_REBOOT = "reap_reboot"  # registration reap with reboot proof
    REBOOT_RECOVER = "reboot_recover"  # reboot proof lifts recoverable quarantines
    ENQUEUE = "enqueue"  # STORE-056
    ASSIGN = "assign"  # STORE-065
    MARK_RUNNING = "mark_running"  # hand-out
    RELEASE = "release"  # the worker's terminal report
    CANCEL_QUEUED = "cancel_queued"  # STORE-090
    DEPENDENCY_FAILED = "dependency_failed"  # a job it waited for ended otherwise
    KILL_FINALIZE = "kill_finalize"  # STORE-092
    REQUEUE = "requeue"  # an attempt ended and its job queues again (EXT-RETRY-1, EXT-PREEMPT-2)
    HEARTBEAT_RESTORE = "heartbeat_restore"  # STORE-096 step 2b
    HEARTBEAT_BUSY = "heartbeat_busy"  # STORE-096 step 4
    HEARTBEAT_READY = "heartbeat_ready"  # STORE-096 step 5
    SWEEP_UNKNOWN = "sweep_unknown"  # silence >= grace
    WRITE_OFF = "write_off"  # silence >= unhealthy-after
    EXPIRE = "expire"  # a lapsed lease
    AUTO_RECOVER = "auto_recover"  # a recovery proof, flap guard permitting
    CLEAR = "clear"  # operator clear
    FAULT = "fault"  # the host's fault report
    HOST_REPORT = "host_report"  # the host's own report of any other state
    RETIRE = "retire"  # the row is deleted


#: A state, or ``None`` for "no row".
State = str | None


@dataclass(frozen=True)
class Move:
    """One operation's edges: from any of ``sources`` to any of ``targets``."""

    sources: frozenset[State]
    targets: frozenset[State]


@dataclass(frozen=True)
class Machine:
    """A state table: which entity it governs and each operation's move."""

    entity: str
    moves: dict[Op, Move]

    def move(self, op: Op) -> Move:
        try:
            return self.moves[op]
        except KeyError:
            raise KeyError(f"{op} does not move a {self.entity}") from None


def _m(sources: State | Iterable[State], targets: State | Iterable[State]) -> Move:
    def norm(x: State | Iterable[State]) -> frozenset[State]:
        return frozenset({x}) if x is None or isinstance(x, str) else frozenset(x)

    return Move(norm(sources), norm(targets))


_R, _B, _U, _H = DeviceState.READY, DeviceState.BUSY, DeviceState.UNKNOWN, DeviceState.UNHEALTHY
_ANY = frozenset(DeviceState)
_NOT_UNHEALTHY = frozenset({_R, _B, _U})

#: STORE-021, written as "not unhealthy -> unhealthy": an unhealthy device stays exactly as it is.
DEVICE = Machine(
    "device",
    {
        Op.REGISTER_NEW: _m(None, _R),
        Op.ASSIGN: _m(_R, _B),
        Op.RELEASE: _m(_B, _R),  # only if still busy
        Op.SWEEP_UNKNOWN: _m({_R, _B}, _U),  # reason ''
        Op.WRITE_OFF: _m(_NOT_UNHEALTHY, _H),  # worker_lost; outside the startup window
        Op.EXPIRE: _m(_NOT_UNHEALTHY, _H),  # lease_expired, keeps reason
        Op.REAP: _m(_NOT_UNHEALTHY, _H),  # registration, keeps reason
        Op.REAP_REBOOT: _m({_B, _U}, _R),  # reason and detail cleared
        Op.REBOOT_RECOVER: _m(_H, _R),  # recoverable reason, no live lease
        Op.AUTO_RECOVER: _m(_H, _R),  # recoverable reason, no live lease, flap guard (§15)
        Op.REDECLARE: _m(_NOT_UNHEALTHY, _R),  # after its jobs were reaped; reason ''
        Op.FAULT: _m(_ANY, _H),  # fault overwrites any reason, detail = report
        Op.HOST_REPORT: _m(_ANY, _NOT_UNHEALTHY),  # reason and detail cleared
        Op.HEARTBEAT_BUSY: _m(_U, _B),  # live lease (retention: of a named job)
        Op.HEARTBEAT_RESTORE: _m(_H, _B),  # worker_lost, device of a named active job
        Op.HEARTBEAT_READY: _m(_U, _R),  # no live lease, no flagged killed job on it
        Op.CLEAR: _m(_H, _R),  # no live lease
        Op.RETIRE: _m(_ANY, None),  # no live lease
    },
)

_ACTIVE = frozenset(ACTIVE)
_TERMINAL = frozenset(TERMINAL)

#: STORE-041 (``finished_at`` = now on every move into a terminal state).
JOB = Machine(
    "job",
    {
        Op.ENQUEUE: _m(None, JobState.QUEUED),
        Op.ASSIGN: _m(JobState.QUEUED, JobState.ASSIGNED),
        Op.CANCEL_QUEUED: _m(JobState.QUEUED, JobState.KILLED),
        Op.DEPENDENCY_FAILED: _m(JobState.QUEUED, JobState.KILLED),
        Op.MARK_RUNNING: _m(JobState.ASSIGNED, JobState.RUNNING),
        Op.RELEASE: _m(_ACTIVE, _TERMINAL),
        Op.WRITE_OFF: _m(_ACTIVE, JobState.LOST),  # worker lost
        Op.EXPIRE: _m(_ACTIVE, JobState.LOST),  # lease expired
        Op.REAP: _m(_ACTIVE, JobState.LOST),  # worker re-registered / host rebooted
        Op.KILL_FINALIZE: _m(_ACTIVE, JobState.KILLED),  # kill flag kept set
        Op.REQUEUE: _m(_ACTIVE, JobState.QUEUED),  # core.retry's verdict only
    },
)
