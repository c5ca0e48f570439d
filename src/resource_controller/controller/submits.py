"""What a submit asks for, checked without the database and made the store's ``NewJob``; pure."""

from __future__ import annotations

from resource_controller import errors, wire
from resource_controller.core import arrays, mig, scheduling, selectors, share
from resource_controller.core.states import Kind, RetryOn, Stdio
from resource_controller.store.jobs import NewJob


def validate_submit(req: wire.SubmitRequest) -> NewJob:
    """API-041, in its order; the first failure wins."""
    kind = req.kind or Kind.JOB
    if kind not in (Kind.JOB, Kind.HOLD):
        raise errors.BadRequest(f"unknown kind {req.kind!r} (job or hold)")
    command = list(req.command or [])
    if kind == Kind.JOB and not command:
        raise errors.BadRequest("command must not be empty")
    if kind == Kind.HOLD:
        for bad, what in (
            (command, "a hold takes no command"),
            (req.cwd, "a hold takes no cwd"),
            (req.env, "a hold takes no env"),
            (req.idle_timeout_seconds, "a hold takes no idle timeout"),
            (req.max_runtime_seconds <= 0, "a hold needs max_runtime_seconds > 0 (its TTL)"),
            (req.stdio, "a hold cannot use tty or pipe stdio"),
        ):
            if bad:
                raise errors.BadRequest(what)
        command = ["hold"]
    if req.stdio not in {s.value for s in Stdio}:
        raise errors.BadRequest(f'unknown stdio {req.stdio!r} ("", tty or pipe)')
    if req.array:
        _array(req, kind)
    if req.device_id and req.selector:
        raise errors.BadRequest("give device_id or selector, not both")
    count, device_ids = _gang(req)
    device_id = req.device_id
    if len(device_ids) == 1:  # a list of one is an ordinary pin
        device_id, device_ids = device_ids[0], ()
    if not req.submitter:
        raise errors.BadRequest("submitter must not be empty")
    low, top = scheduling.PRIORITY_MIN, scheduling.PRIORITY_MAX
    if not low <= req.priority <= top:
        raise errors.PriorityOutOfRange(f"priority {req.priority} is outside {low}..{top}")
    if req.selector:
        try:
            selectors.validate(req.selector)
        except selectors.SelectorError as exc:
            raise errors.BadSelector(str(exc)) from None
    after = _after(req)
    retry_on = req.retry_on or RetryOn.LOST
    if retry_on not in {r.value for r in RetryOn}:
        raise errors.BadRequest(f"unknown retry_on {req.retry_on!r} (lost, failed or any)")
    if req.retry_on and not req.retries:
        raise errors.BadRequest("retry_on needs retries: the attempts to make")
    if req.retries and req.stdio:
        raise errors.BadRequest(
            "retries with tty or pipe stdio: an attempt's terminal or pipe ends with it"
        )
    if kind == Kind.HOLD and (req.retries or req.preemptible):
        raise errors.BadRequest("a hold is never retried or preempted")
    if (req.no_requeue or req.preempt_grace_seconds) and not req.preemptible:
        given = "no_requeue" if req.no_requeue else "preempt_grace_seconds"
        raise errors.BadRequest(f"{given} needs preemptible: only a preemptible job is preempted")
    return NewJob(
        command=command,
        submitter=req.submitter,
        device_id=device_id,
        selector=req.selector,
        cwd=req.cwd,
        env=dict(req.env) if req.env else None,
        idempotency_key=req.idempotency_key,
        priority=req.priority,
        max_runtime_seconds=req.max_runtime_seconds,
        idle_timeout=req.idle_timeout_seconds,
        kind=kind,
        reason=req.reason,
        stdio=req.stdio,
        count=count,
        device_ids=device_ids,
        after=after,
        after_any=req.after_any,
        retries=req.retries,
        retry_on=retry_on,
        preemptible=req.preemptible,
        no_requeue=req.no_requeue,
        preempt_grace_seconds=req.preempt_grace_seconds,
    )


def array_spec(req: wire.SubmitRequest) -> arrays.ArraySpec:
    """EXT-ARRAY-1: the spec of an array submit, which ``validate_submit`` has admitted."""
    try:
        return arrays.parse(req.array)
    except arrays.ArraySpecError as exc:
        raise errors.BadRequest(f"array {req.array!r}: {exc}") from None


def _array(req: wire.SubmitRequest, kind: str) -> None:
    """What an array's tasks cannot be: each queues and runs detached."""
    for bad, what in (
        (kind == Kind.HOLD, "a hold cannot be an array"),
        (req.no_wait, "no_wait with array: an array's tasks queue until they can run"),
        (req.stdio, "array with tty or pipe stdio: its tasks run detached"),
    ):
        if bad:
            raise errors.BadRequest(what)
    array_spec(req)


def _after(req: wire.SubmitRequest) -> tuple[str, ...]:
    """The jobs a submit waits for, each once, in order; the store says whether they exist."""
    ids = list(req.after or [])
    if any(not i for i in ids):
        raise errors.BadRequest("after must not contain an empty job ID")
    if req.after_any and not ids:
        raise errors.BadRequest("after_any needs after: the jobs to wait for")
    if ids and req.no_wait:
        raise errors.BadRequest(
            "no_wait with after: a job that waits for other jobs cannot start at once"
        )
    return tuple(dict.fromkeys(ids))


def check_limit(limits: share.SubmitterLimits, new: NewJob) -> None:
    """A job asking for more devices than its submitter may ever hold could never start
    : ``400 bad_request`` at submit instead of a queue for ever."""
    limit = limits.of(new.share_name)
    count = len(new.device_ids) or max(1, new.count)
    if limit is not None and count > limit:
        raise errors.BadRequest(
            f"the job asks for {count} device(s), more than the limit of {limit}"
            f" devices for {new.share_name}"
        )


def _gang(req: wire.SubmitRequest) -> tuple[int, tuple[str, ...]]:
    """``count`` and ``device_ids`` checked against each other: a list's length is the count
    (another is refused, not overridden), its devices distinct and on one host."""
    ids = list(req.device_ids or [])
    if not ids:
        if req.device_id and req.count != 1:
            raise errors.BadRequest(
                f"count {req.count} with device_id: a device_id is one device; "
                "give device_ids to pin several"
            )
        return req.count, ()
    if req.device_id or req.selector:
        given = "device_id" if req.device_id else "selector"
        raise errors.BadRequest(f"give device_ids or {given}, not both")
    if "count" in req.model_fields_set and req.count != len(ids):
        raise errors.BadRequest(
            f"count {req.count} does not match the {len(ids)} device(s) in device_ids"
        )
    if any(not d for d in ids):
        raise errors.BadRequest("device_ids must not contain an empty device ID")
    if len(set(ids)) != len(ids):
        raise errors.BadRequest("device_ids names a device more than once")
    hosts = sorted({d.split(":", 1)[0] for d in ids})
    if len(hosts) > 1:
        raise errors.BadRequest(f"device_ids must all be on one host, not on {', '.join(hosts)}")
    overlap = mig.overlapping(d.partition(":")[2] for d in sorted(ids))
    if overlap:
        # A GPU and its MIG instance are never leased at once: such a job could never start.
        whole, part = overlap[0]
        raise errors.BadRequest(
            f"device_ids names one GPU twice: {hosts[0]}:{whole} and {hosts[0]}:{part} "
            "(a GPU and its MIG instance are never leased at once)"
        )
    return len(ids), tuple(sorted(ids))
