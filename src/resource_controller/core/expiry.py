"""Verdicts on silence, deadlines and recoveries: pure functions of data and ``now``.

Nothing here reads a clock or a database. The store's sweep (``store/sweep.py``) and
auto-recovery read rows, ask these functions what each row deserves, and apply the
answers; the reaper loop asks ``StallGuard`` whether this pass may judge at all. The
governing rule is the spec's: silence is never proof. Silence may take a device out
of the pool (``unknown``, then ``unhealthy``), never put one back.

Every instant is Unix seconds on the controller's clock; every duration is seconds.
"""

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
    """What one sweep is allowed to conclude.

    ``hold_off_until`` is the start-up hold-off instant (``None``: always judging);
    ``stalled`` is the stall guard's veto for this pass (see ``StallGuard``).
    """

    grace: float = GRACE
    unhealthy_after: float = UNHEALTHY_AFTER
    hold_off_until: float | None = None
    retain: bool = False
    stalled: bool = False

    def judging(self, now: float) -> bool:
        """May this pass expire leases and write workers off? Read once per sweep.

        Judging needs the start-up hold-off to have elapsed (``now >= hold_off_until``)
        and the stall guard not to have vetoed the pass.
        """
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
    """The verdict for one device whose worker was last heard at ``last_heartbeat_at``.

    Written off only when judging and silent for at least ``unhealthy_after``; otherwise,
    silent for at least ``grace`` and ``ready``/``busy``, it goes ``unknown`` (so inside
    the start-up window a long-silent worker's devices go ``unknown``, not ``unhealthy``).
    No verdict ever makes a device ``ready``.
    """
    quiet = silence(now, last_heartbeat_at)
    if judging and quiet >= rules.unhealthy_after:
        return Demotion.REAP_ONLY if state == DeviceState.UNHEALTHY else Demotion.WRITE_OFF
    if quiet >= rules.grace and state in (DeviceState.READY, DeviceState.BUSY):
        return Demotion.UNKNOWN
    return Demotion.NONE


def quiet_floor(rules: SweepRules, judging: bool) -> float:
    """The least silence any verdict of ``demotion`` needs: a device whose worker was
    heard more recently gets ``NONE`` whatever its state, so a sweep need not read it
    (at 10,000 devices reading them all held the store for ~40 ms every 10 s)."""
    return min(rules.grace, rules.unhealthy_after) if judging else rules.grace


# ---- leases --------------------------------------------------------------------------


def lease_expired(expires_at: float, now: float) -> bool:
    """A lease is expired once its deadline is reached: at exactly ``expires_at`` it is."""
    return expires_at <= now


def lease_expires(
    expires_at: float, kind: str, now: float, rules: SweepRules, judging: bool
) -> bool:
    """Does this sweep end this live lease?

    Only when judging, only once its deadline is reached, and in retention mode never
    for a ``job``-kind lease (holds keep their TTL).
    """
    if not judging or not lease_expired(expires_at, now):
        return False
    return not (rules.retain and kind == Kind.JOB)


# ---- the stall guard -----------------------------------------------------------------


def stalled(previous: float | None, current: float, interval: float) -> bool:
    """Did the reaper pass starting at ``current`` start far later than scheduled?

    A pass is stalled when more than ``STALL_FACTOR`` (3) sweep intervals separate it
    from the previous pass (``previous`` is ``None`` before the first one). Both
    instants are read from the clock the sweep judges silence by, so whatever made the
    gap (the process was stopped or starved, its host suspended, the wall clock stepped
    forward) is seen the same way the sweep would see the resulting silence.

    Why this guard exists (our addition to the spec, in the spirit of its start-up
    hold-off): the sweep judges silence and deadlines from stored timestamps,
    and those kept running while this controller was not listening. A worker that
    heartbeated faithfully into a paused controller looks exactly like a dead one on
    the first pass after the pause, because its heartbeats are still queued behind
    that pass. Only judge silence you had a chance to observe.
    """
    return previous is not None and current - previous > STALL_FACTOR * interval


@dataclass(frozen=True)
class StallGuard:
    """The reaper's memory between passes: when the last one ran, and how steady since.

    Rule, as implemented: a stalled pass (``stalled`` above) does not judge (no lease
    expiry, no write-off, no job lost), nor do the on-schedule passes after it until the
    ``RESUME_PASSES``-th (3rd) one, which judges again; a further stall starts the count
    over. Demotion to ``unknown`` is never vetoed, since it hands nothing out and the
    next heartbeat undoes it. With the production 10 s interval judging resumes 30 s
    after the stall: the same window the start-up
    hold-off gives (three worker heartbeats), so a controller that was paused gives
    live holders the chance to renew that a restarted one gives. Counting passes
    rather than seconds keeps the rule a function of what the loop actually observed:
    each on-schedule pass is proof the controller was listening in between.

    A controller starved so badly that every pass is late never judges; it logs a
    warning on every stalled pass instead. That is the safe failure: nothing is handed
    out that might be occupied, and nothing is written off unheard.
    """

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
        """Nothing from the interrupted job can still hold the device.

        Isolation alone, or a survivor check that ran and found nothing; every other
        combination proves nothing, and there is no field that forces recovery.
        """
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
    """Recoveries at or after this instant are inside the sliding window.

    A recovery exactly ``FLAP_WINDOW`` old still counts; pruning removes rows strictly
    older (``at < cutoff``).
    """
    return now - FLAP_WINDOW


def flap_allows(recent: int) -> bool:
    """May a device with ``recent`` automatic recoveries in the window recover again?"""
    return recent < FLAP_LIMIT


def flap_remaining(recent: int) -> int:
    """Automatic recoveries left before the next quarantine waits for a person."""
    return max(0, FLAP_LIMIT - recent)
