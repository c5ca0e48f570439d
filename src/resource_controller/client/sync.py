"""The Python API: ``from resource_controller import Client``.

A typed layer over ``api.JsonClient``, the object the ``rc`` commands use, so that the
Python API and the command line send the same requests, poll on the same budgets and
read the same configuration (``RC_CONTROLLER``, ``RC_TOKEN``, ``RC_SUBMITTER``, the
user config file). What it adds is what a program wants instead of a terminal:

- typed results (``models``) and a ``Job`` handle with ``wait``, ``logs``, ``kill``;
- ``run()``, which blocks like ``rc run`` and returns the exit code ``rc run`` would
  exit with, optionally with the output;
- ``lease()``, a context manager that holds devices as ``rc hold`` does and releases
  them on every way out of the block.

Interrupts mean what they mean to ``rc run`` and ``rc hold`` (CLI §4.3, §5): a
``KeyboardInterrupt`` while queued cancels the job; once a ``run()`` job started it is
left running (it holds a live process); a lease is released.
"""

from __future__ import annotations

import codecs
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from resource_controller import errors
from resource_controller.client import api, options
from resource_controller.client.models import (
    Device,
    DeviceDetails,
    Explanation,
    JobInfo,
    LeaseInfo,
    RunResult,
    Usage,
    detected_uuid,
    mig_instance_ids,
    run_exit_code,
)
from resource_controller.client.options import Duration, check_usage

#: Bound on the final wait after the output stream ends.
FINAL_WAIT = 300.0
#: Bound on cancelling a queued job or releasing a lease.
CANCEL_BOUND = 10.0

WaitTimeout = api.WaitTimeout


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


def write_stdout(chunk: bytes) -> None:
    """Copy output to this process's stdout as it arrives, flushed."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        sys.stdout.flush()
        buffer.write(chunk)
        buffer.flush()
    else:  # a text-only stdout (captured by a test runner, a notebook)
        sys.stdout.write(chunk.decode("utf-8", "replace"))
        sys.stdout.flush()


def decode_chunks(chunks: Iterator[bytes]) -> Iterator[str]:
    """Bytes to text without splitting a UTF-8 character across chunks."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for chunk in chunks:
        text = decoder.decode(chunk)
        if text:
            yield text
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


class Job(JobInfo):
    """A job or hold on the controller, with the calls that act on it.

    The fields (``JobInfo``) are the controller's view when the handle was made or
    last ``refresh``-ed; ``wait`` and ``refresh`` update them in place.
    """

    _client: Client

    @classmethod
    def bind(cls, client: Client, data: api.Json, position: int = 0, waits: Any = None) -> Job:
        """A handle for the job object ``data``."""
        job = cls(id=str(data.get("id") or ""))
        job._client = client
        job._load(data, position, waits)
        return job

    def _view(self, view: api.PolledJob) -> Job:
        self._load(view.job, view.queue_position, view.waiting_for)
        return self

    def refresh(self) -> Job:
        """Read the job again (``GET /v1/jobs/{id}``); returns itself."""
        return self._view(self._client.low.get_job(self.id))

    def wait(self, timeout: Duration | None = None) -> Job:
        """Block until the job ends and return itself, updated.

        ``timeout`` bounds the wait (seconds or ``"10m"``); passing it raises
        ``WaitTimeout`` and leaves the job alone. Six consecutive failed polls raise
        ``PollGiveUp``.
        """
        bound = options.seconds(timeout, "timeout") or None
        self._load(self._client.low.wait_until_terminal(self.id, bound=bound))
        return self

    def wait_started(self, timeout: Duration | None = None) -> Job:
        """Block until the job leaves the queue; it may have ended without starting.

        ``timeout`` raises ``WaitTimeout`` and leaves the job queued.
        """
        limit = options.seconds(timeout, "timeout")
        deadline = time.monotonic() + limit if limit > 0 else None
        self._load(self._client.low.wait_until_scheduled(self.id, deadline=deadline))
        return self

    def logs(self, follow: bool = False, *, text: bool = False) -> Iterator[Any]:
        """The job's stored output: what is stored now, or with ``follow=True``
         everything until the job ends, resuming a broken stream where it stopped
        . Chunks are ``bytes``, or ``str`` with ``text=True``.
        """
        low = self._client.low
        if follow:
            chunks: Iterator[bytes] = low.output(self.id)
        else:
            chunks = _closing(low.follow_logs(self.id, follow=False))
        return decode_chunks(chunks) if text else chunks

    def output(self) -> bytes:
        """Everything stored so far, as one ``bytes`` (``logs()`` joined)."""
        return b"".join(self.logs())

    def kill(self) -> None:
        """Cancel the job if queued, or have its worker stop it.

        Only its submitter (this client's) or an admin token may:
        otherwise ``NotJobOwner``. An ended job raises ``NotCancellableError``.
        """
        self._client.kill(self.id)

    release = kill


def _closing(stream: Any) -> Iterator[bytes]:
    with stream:
        yield from stream


class Lease(LeaseInfo):
    """Devices held for this process: ids, ``cuda_visible_devices``, epoch."""

    _job: Job

    @property
    def job(self) -> Job:
        """The hold behind the lease."""
        return self._job

    def release(self) -> None:
        """End the hold now; an already ended hold is not an error."""
        with contextlib.suppress(errors.NotCancellableError):
            self._job._client.kill(self.id, timeout=CANCEL_BOUND)

    @classmethod
    def of(cls, job: Job) -> Lease:
        info = LeaseInfo.from_job(job, mig_uuids_of(job._client, job.device_ids))
        lease = cls(**{f: getattr(info, f) for f in info.__dataclass_fields__})
        object.__setattr__(lease, "_job", job)  # the view is frozen; the handle rides along
        return lease


def mig_uuids_of(client: Client, device_ids: Sequence[str]) -> dict[str, str]:
    """Device name -> MIG UUID of each MIG instance among ``device_ids``, as its worker
    last reported it (one describe each); one that cannot be read is left
    out, so ``CUDA_VISIBLE_DEVICES`` is left unset rather than guessed."""
    uuids: dict[str, str] = {}
    for device_id in mig_instance_ids(device_ids):
        with contextlib.suppress(errors.RcError):
            uuids[device_id.partition(":")[2]] = detected_uuid(client.low.describe(device_id))
    return uuids


@contextlib.contextmanager
def _interrupts_held_back() -> Iterator[list[int]]:
    """SIGINT noted, not raised, inside the block (only in the main thread with Python's
    own handler in place: elsewhere the block runs as it is); the list says if one came."""
    seen: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield seen
        return
    signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class LeaseContext:
    """``with client.lease(...) as lease:``: hold on entry, release on every exit."""

    def __init__(self, client: Client, hold: Callable[[], Job]) -> None:
        self._client = client
        self._hold = hold
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        self._lease = Lease.of(self._hold())
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            lease.release()
        except errors.ClientError as e:
            if exc is None:
                raise
            exc.add_note(f"and the lease {lease.id} could not be released: {e}")


class Client:
    """Talk to one controller as the current user, with typed results.

    With no arguments the controller URL, token and submitter come from the same
    environment variables and user config file as ``rc``. Close it
    (or use it as a context manager) to drop the kept-alive connection.
    """

    def __init__(
        self,
        controller: str | None = None,
        token: str | None = None,
        *,
        submitter: str | None = None,
    ) -> None:
        #: The command line's client underneath, for anything not wrapped here.
        self.low = api.JsonClient(controller, token, submitter=submitter)

    @property
    def submitter(self) -> str:
        """The identity sent with submits and kills, resolved once."""
        return self.low.submitter

    def close(self) -> None:
        """Close kept-alive connections."""
        self.low.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the fleet -------------------------------------------------------------------

    def devices(self) -> list[Device]:
        """Every device with its state and holder, by ID."""
        return [Device.from_view(v) for v in self.low.state().get("devices") or []]

    def describe(self, device_id: str) -> DeviceDetails:
        """Everything about one device; unknown is ``NotFound``."""
        return DeviceDetails.from_json(self.low.describe(device_id))

    def explain(self, selector: str) -> Explanation:
        """What ``selector`` matches now and which are free; submits nothing."""
        return Explanation.from_json(self.low.explain(selector), selector)

    def whoami(self) -> dict[str, str]:
        """This token's role, and its name when it has one."""
        return {str(k): str(v) for k, v in self.low.whoami().items()}

    def usage(self, since: str = "7d", by: str = "submitter", limit: int = 0) -> Usage:
        """Who held what over the last ``since`` (``7d``, ``36h``, ``2w``), per
        submitter, device or host, largest first: jobs, device-hours,
        GPU-hours weighted by utilisation where known, and each group's share. A
        ``since`` that is not a duration is ``ValueError`` before any request."""
        check_usage(since, by)
        return Usage.from_json(self.low.usage(since, by, limit))

    # ---- jobs ------------------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """A handle for an existing job, by ID or unique prefix of 6+ characters."""
        view = self.low.get_job(self.low.resolve_job_id(job_id))
        return Job.bind(self, view.job, view.queue_position, view.waiting_for)

    def jobs(
        self, *, device: str = "", state: str = "", submitter: str = "", limit: int = 20
    ) -> list[Job]:
        """Job history, newest first, finished jobs included.

        Any ``limit``: past the controller's page (200) the history is read a page at
        a time (``GET /v1/jobs?before=``); 0 is the controller's default.
        """
        found = self.low.jobs(device=device, state=state, submitter=submitter, limit=limit)
        return [Job.bind(self, j) for j in found]

    def submit(
        self,
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
        after: str | JobInfo | Sequence[str | JobInfo] | None = None,
        after_any: bool = False,
    ) -> Job:
        """Queue ``argv`` for a device and return its ``Job`` at once.

         ``device`` is an exact ID (``host:gpu0``), or several on one host as a list
         (all at once), ``select`` a label selector; with neither, any
         device. ``count`` asks for several devices on one host.
         ``no_wait`` refuses with ``NoDeviceError`` instead of queueing. ``after`` names the
         jobs it waits for (handles, IDs or unique prefixes of 6+ characters, at most 64):
         it starts only once each has succeeded, or ended in any state with ``after_any``;
         if one ends otherwise, it ends ``killed`` with ``dependency_failed: <ID>``
        .
        """
        command = options.check_argv(argv)
        want = options.target(device, select, count)
        given = options.after_ids(after, after_any, no_wait)
        job = self.low.submit(
            command,
            device=want.device,
            device_ids=want.device_ids,
            selector=select,
            cwd=cwd,
            env=env,
            priority=priority,
            max_runtime_seconds=options.ceiling(max_runtime, "max_runtime"),
            idle_timeout_seconds=options.ceiling(idle_timeout, "idle_timeout"),
            no_wait=no_wait,
            count=want.count,
            after=self.low.resolve_job_ids(given),
            after_any=after_any,
        )
        return Job.bind(self, job)

    def run(
        self,
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
        after: str | JobInfo | Sequence[str | JobInfo] | None = None,
        after_any: bool = False,
        capture: bool = False,
        check: bool = False,
        on_output: Callable[[bytes], object] | None = None,
    ) -> RunResult:
        """Run ``argv`` on a device and block until it ends, like ``rc run``.

        Queues while the device is busy; ``timeout`` gives up queueing after that long
        (cancels the job, raises ``WaitTimeout``). The output goes to this process's
        stdout as it comes, or is collected into ``RunResult.output`` with
        ``capture=True``, or is handed chunk by chunk to ``on_output``. Returns the exit
        code ``rc run`` would exit with; ``check=True`` raises ``JobFailed`` for a
        non-zero one. A job that never started (killed while queued) ends with exit
        code 1 and its ``kill_reason``.
        """
        want = options.target(device, select, count)
        job = self._taken(
            lambda: self.submit(
                argv,
                select=select,
                device=device,
                count=count,
                env=env,
                cwd=cwd,
                priority=priority,
                max_runtime=max_runtime,
                idle_timeout=idle_timeout,
                no_wait=no_wait,
                after=after,
                after_any=after_any,
            )
        )
        self._leave_queue(job, timeout, want.count)
        captured: list[bytes] | None = [] if capture else None
        if job.started_at is not None or not job.terminal:
            sink: Callable[[bytes], object] = write_stdout
            if captured is not None:
                sink = captured.append
            elif on_output is not None:
                sink = on_output
            for chunk in self.low.output(job.id):
                sink(chunk)
            job.wait(FINAL_WAIT)
        output = b"".join(captured) if captured is not None else None
        result = RunResult(run_exit_code(job), job, output)
        if check and not result.ok:
            raise JobFailed(result)
        return result

    def _taken(self, submit: Callable[[], Job]) -> Job:
        """``submit()``, a Ctrl-C that lands before its answer held back until the job
        is known, then cancelling it: the controller may have queued it already, and a
        job nobody waits for must not keep its place."""
        with _interrupts_held_back() as interrupted:
            job = submit()
        if interrupted:
            self._cancel(job.id)
            raise KeyboardInterrupt
        return job

    def _leave_queue(self, job: Job, timeout: Duration | None, count: int) -> None:
        """WAIT_QUEUE: an interrupt or our own deadline cancels the job."""
        limit = options.seconds(timeout, "timeout")
        if job.state == "queued":
            try:
                job.wait_started(limit or None)
            except BaseException:
                self._cancel(job.id)
                raise
        shortfall = options.count_shortfall(job.raw, count)
        if shortfall:
            self._cancel(job.id)
            raise options.CountNotHonoured(shortfall)

    def _cancel(self, job_id: str) -> None:
        """Kill a job we gave up on, bounded; a job already ended is fine."""
        with contextlib.suppress(errors.ClientError):
            self.low.kill(job_id, timeout=CANCEL_BOUND)

    def kill(self, job_id: str, *, timeout: float | None = None) -> None:
        """Cancel a queued job or stop a running one, by ID or prefix."""
        self.low.kill(self.low.resolve_job_id(job_id), timeout=timeout)

    def release(self, job_id: str) -> None:
        """End a hold (or any job) early: the same operation as ``kill``."""
        self.kill(job_id)

    # ---- holds -----------------------------------------------------------------------

    def hold(
        self,
        *,
        ttl: Duration,
        reason: str | None = None,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        timeout: Duration | None = None,
        wait: bool = True,
    ) -> Job:
        """Take a hold as ``rc hold`` does and return it once granted.

        ``ttl`` is required: the controller ends the hold then even if this process
        dies. ``reason`` defaults to naming this program, pid and host. Queues while
        the device is busy; ``timeout`` gives up (cancels it, ``WaitTimeout``); an
        interrupt while queued cancels it too. ``wait=False`` returns at once, maybe
        still queued. A hold that ends without being granted raises ``NotGranted``.
        End it with ``release``.
        """
        want = options.target(device, select, count)
        ttl_seconds = options.ceiling(ttl, "ttl")

        def submit() -> Job:
            raw = self.low.hold(
                ttl_seconds=ttl_seconds,
                reason=options.default_reason() if reason is None else reason,
                device=want.device,
                device_ids=want.device_ids,
                selector=select,
                count=want.count,
            )
            return Job.bind(self, raw)

        if not wait:
            return submit()
        job = self._taken(submit)
        self._leave_queue(job, timeout, want.count)
        if job.terminal and job.started_at is None:
            raise NotGranted(job)
        return job

    def lease(
        self,
        *,
        ttl: Duration,
        reason: str | None = None,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        timeout: Duration | None = None,
    ) -> LeaseContext:
        """``with client.lease(ttl="30m") as lease:`` holds devices for the block.

        Entering waits until the hold is granted (as ``hold``) and gives a ``Lease``
        with ``device_ids``, ``cuda_visible_devices`` and ``epoch``; leaving the block
        releases it, also on an exception or ``KeyboardInterrupt``. The in-process
        replacement of ``with flock(...)`` on the device host.
        """
        options.target(device, select, count)  # refused before any request
        options.ceiling(ttl, "ttl")

        def take() -> Job:
            return self.hold(
                ttl=ttl,
                reason=reason,
                select=select,
                device=device,
                count=count,
                timeout=timeout,
            )

        return LeaseContext(self, take)
