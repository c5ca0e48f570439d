"""Verdicts on silence, deadlines and recoveries: pure functions of data and ``now`` (Unix seconds).
Silence is never proof: it may take a device out of the pool, never put one back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from resource_controller.core.states import DeviceState, Kind

# ---- numbers (store.md §23, controller-api.md §14) -----------------------------------

GRACE = 30.0  #: worker silence before its devices go ``unknown``
UNHEALTHY_AFTER = 300.0  #: silence before a worker is written off (``worker_lost``)
SWEEP_INTERVAL = 10.0  #: seconds between reaper passes
HOLD_OFF = 30.0  #: start-up window without expiry or write-off

FLAP_LIMIT = 3  #: automatic recoveries per device inside one window
FLAP_WINDOW = 3600  #: the sliding window, seconds; a recovery exactly this old still counts

STALL_FACTOR = 3.0  #: a pass later than this many intervals after the previous one is stalled
RESUME_PASSES = 3  #: on-schedule passes after a stall before the reaper judges again


# ---- silence -------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRules:
    """What one sweep may conclude: ``hold_off_until`` is the start-up hold-off's end
    (None: always judging), ``stalled`` the stall guard's veto for this pass."""

    grace: float = GRACE
    unhealthy_after: float = UNHEALTHY_AFTER
    hold_off_until: float | None = None
    retain: bool = False
    stalled: bool = False

    def judging(self, now: float) -> bool:
        """May this pass expire leases and write off: hold-off over, no stall-guard veto."""
        if self.stalled:
            return False
        return self.hold_off_until is None or now >= self.hold_off_until


class Demotion(Enum):
    """What worker silence does to one device in one sweep."""

    #: Nothing: the worker was heard recently enough, or the device is already out.
    NONE = "none"
    #: ``ready``/``busy`` -> ``unknown``, reason ``''``. Undone by the next heartbeat.
    UNKNOWN = "unknown"
    #: -> ``unhealthy``/``worker_lost``, and its active jobs are reaped.
    WRITE_OFF = "write_off"
    #: Already ``unhealthy``: keeps its reason but its jobs are still reaped.
    REAP_ONLY = "reap_only"


def silence(now: float, last_heartbeat_at: float) -> float:
    """Seconds since the worker was last heard (registration or heartbeat)."""
    return now - last_heartbeat_at


def demotion(
    state: str, last_heartbeat_at: float, now: float, rules: SweepRules, judging: bool
) -> Demotion:
    """A device's verdict by its worker's silence: written off only when judging; never ready."""
    quiet = silence(now, last_heartbeat_at)
    if judging and quiet >= rules.unhealthy_after:
        return Demotion.REAP_ONLY if state == DeviceState.UNHEALTHY else Demotion.WRITE_OFF
    if quiet >= rules.grace and state in (DeviceState.READY, DeviceState.BUSY):
        return Demotion.UNKNOWN
    return Demotion.NONE


def quiet_floor(rules: SweepRules, judging: bool) -> float:
    """The least silence any verdict needs, so a sweep need not read devices heard since (reading
    10,000 held the store ~40 ms every 10 s)."""
    return min(rules.grace, rules.unhealthy_after) if judging else rules.grace


# ---- leases --------------------------------------------------------------------------


def lease_expired(expires_at: float, now: float) -> bool:
    """A lease is expired once its deadline is reached: at exactly ``expires_at`` it is."""
    return expires_at <= now


def lease_expires(
    expires_at: float, kind: str, now: float, rules: SweepRules, judging: bool
) -> bool:
    """Does this sweep end this live lease: when judging, once its deadline is reached,
    and in retention mode never a ``job``-kind lease (holds keep their TTL)."""
    if not judging or not lease_expired(expires_at, now):
        return False
    return not (rules.retain and kind == Kind.JOB)


# ---- the stall guard -----------------------------------------------------------------


def stalled(previous: float | None, current: float, interval: float) -> bool:
    """Did the pass at ``current`` start over ``STALL_FACTOR`` intervals after the previous one?
    After a pause, heartbeats still queued behind it make live workers look dead: only judge
    silence you could observe."""
    return previous is not None and current - previous > STALL_FACTOR * interval


@dataclass(frozen=True)
class StallGuard:
    """The reaper's memory between passes: a stalled pass does not judge, nor do the passes after it
    until the ``RESUME_PASSES``-th (each on-schedule pass proves the controller was listening)."""

    previous: float | None = None
    #: On-schedule passes since the last stalled one; starts caught up.
    steady: int = RESUME_PASSES

    def after_pass(self, current: float, interval: float) -> StallGuard:
        """The guard once a pass starting at ``current`` has begun."""
        if stalled(self.previous, current, interval):
            return StallGuard(previous=current, steady=0)
        return StallGuard(previous=current, steady=min(self.steady + 1, RESUME_PASSES))

    @property
    def may_judge(self) -> bool:
        return self.steady >= RESUME_PASSES

    @property
    def just_stalled(self) -> bool:
        return self.steady == 0


# ---- recovery proofs and the flap guard ----------------------------------------------


@dataclass(frozen=True)
class Proof:
    """A worker's recovery proof at registration; all false means none."""

    isolated: bool = False
    survivors_checked: bool = False
    survivors_found: bool = False

    @property
    def proves_clean(self) -> bool:
        """Nothing from the interrupted job can still hold the device: isolation, or a
        survivor check that ran and found nothing; nothing else proves it."""
        return self.isolated or (self.survivors_checked and not self.survivors_found)

    @property
    def summary(self) -> str:
        """The operator-facing wording of the proof; empty when it proves nothing."""
        if self.isolated:
            return "worker restarted in an isolated PID namespace"
        if self.proves_clean:
            return "worker found no surviving processes from its previous run"
        return ""


def flap_cutoff(now: float) -> float:
    """Recoveries at or after this instant are inside the sliding window (one exactly
    ``FLAP_WINDOW`` old still counts; pruning removes those strictly older)."""
    return now - FLAP_WINDOW


def flap_allows(recent: int) -> bool:
    """May a device with ``recent`` automatic recoveries in the window recover again?"""
    return recent < FLAP_LIMIT


def flap_remaining(recent: int) -> int:
    """Automatic recoveries left before the next quarantine waits for a person."""
    return max(0, FLAP_LIMIT - recent)
