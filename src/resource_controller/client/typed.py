"""The Python API written once as operations, so ``Client`` and ``AsyncClient`` differ
only in how they wait; interrupts mean what they mean to ``rc run`` and ``rc hold``."""

from __future__ import annotations

import codecs
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from resource_controller import errors
from resource_controller.client import calls, machine, waits
from resource_controller.client import submit as spec
from resource_controller.client.calls import Json
from resource_controller.client.models import (
    ArrayInfo,
    Device,
    DeviceDetails,
    Explanation,
    JobInfo,
    LeaseInfo,
    RunResult,
    Usage,
    detected_uuid,
    mig_instance_ids,
)

if TYPE_CHECKING:
    from resource_controller.client.calls import Op

#: A duration argument: seconds, or text such as ``"90s"``, ``"1h30m"``.
Duration = float | int | str
#: What ``after`` takes: job handles, IDs or unique prefixes, one or a list.
After = str | JobInfo | Sequence[str | JobInfo] | None


class Driven:
    def _drive(self, op: Op[Any]) -> Any:
        raise NotImplementedError

    def _iterate(self, op: Op[Any]) -> Any:
        raise NotImplementedError


D = TypeVar("D", bound=Driven)


class JobFailed(errors.ClientError):
    """``run(check=True)``: the job did not succeed; ``result`` says how it ended."""

    def __init__(self, result: RunResult) -> None:
        job = result.job
        why = f" ({job.kill_reason})" if job.kill_reason else ""
        super().__init__(f"job {job.id} {job.state} with exit code {result.exit_code}{why}")
        self.result = result


class NotGranted(errors.ClientError):
    """A hold or job left the queue without ever starting (cancelled, killed, lost)."""

    def __init__(self, job: JobInfo) -> None:
        why = job.kill_reason or "no further detail"
        target = job.device_id or job.selector or "any device"
        super().__init__(f"{job.kind} {job.id} {job.state}, never started on {target}: {why}")
        self.job = job


class CountNotHonoured(errors.ClientError):
    """The controller placed a multi-device job on fewer devices than asked for."""


def write_stdout(chunk: bytes) -> None:
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        sys.stdout.flush()
        buffer.write(chunk)
        buffer.flush()
    else:  # a text-only stdout (captured by a test runner, a notebook)
        sys.stdout.write(chunk.decode("utf-8", "replace"))
        sys.stdout.flush()


def default_reason() -> str:
    """So a person looking at ``rc devices`` can find who holds the lease."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog} (pid {os.getpid()} on {socket.gethostname()})"


class BaseJob(JobInfo, Driven):
    """A job or hold with the calls that act on it; ``wait``/``refresh`` update fields."""

    _client: BaseClient[Any, Any]

    @classmethod
    def bind(cls: type[J], client: BaseClient[Any, Any], data: Json, view: Any = None) -> J:
        job = cls(id=str(data.get("id") or ""))
        job._client = client
        job._load(data, *(() if view is None else (view.queue_position, view.waiting_for)))
        return job

    def _drive(self, op: Op[Any]) -> Any:
        return self._client._drive(op)

    def _iterate(self, op: Op[Any]) -> Any:
        return self._client._iterate(op)

    def _refresh(self: J, /) -> Op[J]:
        """Read the job again; returns itself."""
        view = yield calls.get_job(self.id)
        self._load(view.job, view.queue_position, view.waiting_for)
        return self

    def _wait(self: J, /, timeout: Duration | None = None) -> Op[J]:
        """Block until the job ends and return itself, updated.

        Past ``timeout``, ``WaitTimeout`` (the job is left alone); six failed polls, ``PollGiveUp``."""
        bound = spec.seconds(timeout, "timeout") or None
        now = self._client._now
        deadline = None if bound is None else now() + bound
        wait = waits.Wait(self.id, terminal=True, now=now(), deadline=deadline, bound=bound)
        self._load((yield from waits.until(wait, now)).job)
        return self

    def _wait_started(self: J, /, timeout: Duration | None = None) -> Op[J]:
        """Block until the job leaves the queue (it may have ended without starting)."""
        limit = spec.seconds(timeout, "timeout")
        now = self._client._now
        wait = waits.Wait(self.id, now=now(), deadline=now() + limit if limit > 0 else None)
        self._load((yield from waits.until(wait, now)).job)
        return self

    def _logs(self, /, follow: bool = False, *, text: bool = False) -> Op[None]:
        """The job's stored output, or with ``follow=True`` everything until it ends.
        Chunks are ``bytes``, or ``str`` with ``text=True``."""
        if follow:
            source = waits.follow(self.id, self._client._now, waits.QUIET)
        else:
            source = _snapshot(self.id)
        if not text:
            return (yield from source)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        value: Any = None
        while True:
            try:
                step = source.send(value)
            except StopIteration:
                break
            if isinstance(step, calls.Out):
                value = None
                if piece := decoder.decode(step.chunk):
                    yield calls.Out(piece)  # type: ignore[arg-type]
            else:
                value = yield step
        if tail := decoder.decode(b"", final=True):
            yield calls.Out(tail)  # type: ignore[arg-type]
        return None

    def _output(self, /) -> Op[bytes]:
        """Everything stored so far, as one ``bytes``."""
        parts = []
        stream = yield calls.Open(calls.logs(self.id, follow=False))
        while chunk := (yield calls.Read(stream)):
            parts.append(chunk)
        return b"".join(parts)

    def _kill(self, /) -> Op[None]:
        """Cancel the job if queued, or have its worker stop it.
        Only its submitter or an admin may (``NotJobOwner``)."""
        yield calls.kill(self.id, self._client.submitter)


J = TypeVar("J", bound=BaseJob)


def _snapshot(job_id: str) -> Op[None]:
    stream = yield calls.Open(calls.logs(job_id, follow=False))
    while chunk := (yield calls.Read(stream)):
        yield calls.Out(chunk)


class BaseLease(LeaseInfo):
    """Devices held for this process; ``job`` is the hold behind it."""

    job: Any

    @classmethod
    def of(cls: type[L], job: BaseJob, mig_uuids: Mapping[str, str] | None = None) -> L:
        info = LeaseInfo.from_job(job, mig_uuids)
        lease = cls(**{f: getattr(info, f) for f in info.__dataclass_fields__})
        object.__setattr__(lease, "job", job)  # the view is frozen; the handle rides along
        return lease


L = TypeVar("L", bound=BaseLease)


#: What ``lease()`` gives: ``LeaseContext`` or ``AsyncLeaseContext``.
C = TypeVar("C")


class BaseClient(Driven, Generic[J, C]):
    """What ``Client`` and ``AsyncClient`` do; see either."""

    _job_class: type[J]
    _lease_class: Callable[[Any, dict[str, Any]], C]
    _now: Callable[[], float]

    @property
    def submitter(self) -> str:
        raise NotImplementedError

    def _bind(self, data: Json, view: Any = None) -> J:
        return self._job_class.bind(self, data, view)

    def _devices(self, /) -> Op[list[Device]]:
        """Every device with its state and holder, by ID."""
        state = yield calls.state()
        return [Device.from_view(v) for v in state.get("devices") or []]

    def _describe(self, /, device_id: str) -> Op[DeviceDetails]:
        """Everything about one device; unknown is ``NotFound``."""
        return DeviceDetails.from_json((yield calls.describe(device_id)))

    def _explain(self, /, selector: str) -> Op[Explanation]:
        """What ``selector`` matches now and which are free; submits nothing."""
        return Explanation.from_json((yield calls.explain(selector, self.submitter)), selector)

    def _whoami(self, /) -> Op[dict[str, str]]:
        """This token's role, and its name when it has one."""
        return {str(k): str(v) for k, v in (yield calls.whoami()).items()}

    def _usage(self, /, since: str = "7d", by: str = "submitter", limit: int = 0) -> Op[Usage]:
        """Who held what over the last ``since`` (``7d``, ``36h``), per submitter, device
        or host, largest first."""
        from resource_controller.core import usage

        if not isinstance(since, str) or not isinstance(by, str):
            raise TypeError("since and by are text: since='7d', by='submitter'")
        usage.parse_since(since)
        usage.check_by(by)
        return Usage.from_json((yield calls.usage(since, by, limit)))

    def _uuids(self, /, device_ids: Sequence[str]) -> Op[dict[str, str]]:
        """Device name -> MIG UUID; one that cannot be read is left out, so
        ``CUDA_VISIBLE_DEVICES`` is left unset rather than guessed (EXT-MIG-2)."""
        uuids: dict[str, str] = {}
        for device_id in mig_instance_ids(device_ids):
            try:
                uuids[device_id.partition(":")[2]] = detected_uuid(
                    (yield calls.describe(device_id))
                )
            except errors.RcError:
                continue
        return uuids

    def _job(self, /, job_id: str) -> Op[J]:
        """A handle for an existing job, by ID or unique prefix of 6+ characters."""
        view = yield calls.get_job((yield from calls.resolve(job_id)))
        return self._bind(view.job, view)

    def _jobs(
        self, /, *, device: str = "", state: str = "", submitter: str = "", limit: int = 20
    ) -> Op[list[J]]:
        """Job history, newest first; a ``limit`` past one page is read page by page."""
        found = yield from calls.jobs(device=device, state=state, submitter=submitter, limit=limit)
        return [self._bind(j) for j in found]

    def _submit(
        self,
        /,
        argv: Sequence[str],
        *,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        env: Mapping[str, str] | None = None,
        cwd: str = "",
        priority: int = 0,
        max_runtime: Duration | None = None,
        idle_timeout: Duration | None = None,
        no_wait: bool = False,
        after: After = None,
        after_any: bool = False,
        retries: int = 0,
        retry_on: str = "",
    ) -> Op[J]:
        """Queue ``argv`` for a device and return its ``Job`` at once.
        ``after``: jobs it waits for (to succeed, or just end with ``after_any``);
        ``retries``: attempts after the first, on ``retry_on`` ends (lost, failed, any)."""
        wanted = _spec(argv, locals())
        return self._bind((yield from machine.submit(wanted, self.submitter, self._now)))

    def _submit_array(self, /, argv: Sequence[str], array: str, **where: Any) -> Op[ArrayInfo]:
        """Queue one task of ``argv`` per index of ``array`` (``"0-99%8"``: at most 8 at once),
        each told ``RC_ARRAY_ID`` and ``RC_ARRAY_INDEX``; the array at once (EXT-ARRAY-1).
        ``where``: ``submit()``'s arguments, but ``no_wait`` (a task queues until it can run)."""
        wanted = spec.Submit(spec.argv(argv), array=array, **where)
        return ArrayInfo.of((yield from machine.submit(wanted, self.submitter, self._now)))

    def _array(self, /, array_id: str) -> Op[ArrayInfo]:
        """An array by its ID: its counts and its tasks (``kill(array_id)`` ends them)."""
        return ArrayInfo.of((yield calls.get_array(array_id)))

    def _run(
        self,
        /,
        argv: Sequence[str],
        *,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        env: Mapping[str, str] | None = None,
        cwd: str = "",
        priority: int = 0,
        max_runtime: Duration | None = None,
        idle_timeout: Duration | None = None,
        timeout: Duration | None = None,
        no_wait: bool = False,
        after: After = None,
        after_any: bool = False,
        retries: int = 0,
        retry_on: str = "",
        capture: bool = False,
        check: bool = False,
        on_output: Callable[[bytes], object] | None = None,
    ) -> Op[RunResult]:
        """Run ``argv`` on a device and block until it ends, like ``rc run``.
        Output goes to stdout, ``RunResult.output`` (``capture``) or ``on_output``."""
        wanted = _spec(argv, locals())
        limit = spec.seconds(timeout, "timeout")
        captured: list[bytes] = []
        sink = captured.append if capture else on_output or write_stdout
        ran = yield from machine.run(wanted, self.submitter, self._now, timeout=limit, sink=sink)
        _raise_for(ran)
        result = RunResult(ran.code, self._bind(ran.job), b"".join(captured) if capture else None)
        if check and not result.ok:
            raise JobFailed(result)
        return result

    def _kill(self, /, job_id: str, *, timeout: float | None = None) -> Op[None]:
        """Cancel a queued job or stop a running one, by ID or prefix."""
        yield calls.kill((yield from calls.resolve(job_id)), self.submitter, timeout)

    def _release(self, /, job_id: str) -> Op[None]:
        """End a hold (or any job) early: the same operation as ``kill``."""
        return (yield from self._kill(job_id))

    def _hold(
        self,
        /,
        *,
        ttl: Duration,
        reason: str | None = None,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        timeout: Duration | None = None,
        wait: bool = True,
    ) -> Op[J]:
        """Take a hold as ``rc hold`` does and return it once granted (``release`` ends it).
        ``ttl`` is required so the hold ends even if this process dies."""
        wanted = spec.hold(
            ttl,
            default_reason() if reason is None else reason,
            device=device,
            select=select,
            count=count,
        )
        limit = spec.seconds(timeout, "timeout")
        data = yield from machine.submit(wanted, self.submitter, self._now)
        if not wait:
            return self._bind(data)
        if data.get("state") == "queued":
            left = yield from machine.queue(
                str(data["id"]),
                wanted.target,
                self.submitter,
                self._now,
                timeout=limit,
                kind="hold",
            )
            if isinstance(left, machine.RunEnd):
                _raise_for(left)
            else:
                data = left
        refused = yield from machine.placed(wanted, self.submitter, data)
        if refused is not None:
            _raise_for(refused)
            raise NotGranted(self._bind(data))
        return self._bind(data)

    def lease(
        self,
        *,
        ttl: Duration,
        reason: str | None = None,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        timeout: Duration | None = None,
    ) -> C:
        """``with client.lease(ttl="30m") as lease:`` holds devices for the block
        (``async with`` for ``AsyncClient``), released on leaving it."""
        spec.devices(device, select, count)  # refused before any request, as hold would
        spec.ceiling(ttl, "ttl")
        hold = {"ttl": ttl, "reason": reason, "select": select, "device": device}
        return self._lease_class(self, {**hold, "count": count, "timeout": timeout})


_WHERE = (
    "device", "select", "count", "env", "cwd", "priority", "max_runtime", "idle_timeout",
    "no_wait", "after", "after_any", "retries", "retry_on",
)  # fmt: skip


def _spec(argv: Sequence[str], given: Mapping[str, Any]) -> spec.Submit:
    return spec.Submit(spec.argv(argv), **{name: given[name] for name in _WHERE})


def _raise_for(ran: machine.RunEnd) -> None:
    if ran.interrupt is not None:
        raise ran.interrupt
    if ran.kind == "gave_up":
        raise waits.WaitTimeout(ran.message)
    if ran.kind == "lost":
        raise waits.LostContact(ran.message, str(ran.job.get("id", "")))
    if ran.kind == "count":
        raise CountNotHonoured(ran.message)
