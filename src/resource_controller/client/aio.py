"""The asyncio twin of ``Client``: the same methods, awaited.

Built on ``h1.aio``, the worker's HTTP/1.1 (through ``aio_transport``), with the
requests, bodies, error mapping and polling budgets of ``api``: the
two clients can differ only in how they wait, never in what they send. A log follow
is an async iterator; ``lease()`` is an async context manager.

Cancelling a task behaves like an interrupt of ``rc run``/``rc hold``: while queued
the job is cancelled, a ``run()`` job that started is left running, a lease is
released.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from resource_controller import errors
from resource_controller.client import api, config, messages, options, shapes, waits
from resource_controller.client.aio_transport import AsyncTransport
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
from resource_controller.client.sync import (
    CANCEL_BOUND,
    FINAL_WAIT,
    JobFailed,
    NotGranted,
    write_stdout,
)


class AsyncJob(JobInfo):
    """``Job`` for ``AsyncClient``: the same fields, its calls awaited."""

    _client: AsyncClient

    @classmethod
    def bind(
        cls, client: AsyncClient, data: api.Json, position: int = 0, waits: Any = None
    ) -> AsyncJob:
        job = cls(id=str(data.get("id") or ""))
        job._client = client
        job._load(data, position, waits)
        return job

    async def refresh(self) -> AsyncJob:
        """Read the job again; returns itself."""
        view = await self._client._get_job(self.id)
        self._load(view.job, view.queue_position, view.waiting_for)
        return self

    async def wait(self, timeout: Duration | None = None) -> AsyncJob:
        """Until the job ends; ``timeout`` raises ``WaitTimeout``."""
        bound = options.seconds(timeout, "timeout") or None
        self._load(await self._client._wait_terminal(self.id, bound))
        return self

    async def wait_started(self, timeout: Duration | None = None) -> AsyncJob:
        """Until the job leaves the queue; ``timeout`` raises ``WaitTimeout``."""
        limit = options.seconds(timeout, "timeout")
        self._load(await self._client._wait_scheduled(self.id, limit or None))
        return self

    async def logs(self, follow: bool = False, *, text: bool = False) -> AsyncIterator[Any]:
        """The stored output, or with ``follow=True`` all of it until the job ends."""
        chunks = (
            self._client._output(self.id)
            if follow
            else self._client._http.stream(
                "GET", api.job_path(self.id) + "/logs", query={"follow": "false"}
            )
        )
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        async for chunk in chunks:
            if not text:
                yield chunk
            elif piece := decoder.decode(chunk):
                yield piece
        if text and (tail := decoder.decode(b"", final=True)):
            yield tail

    async def output(self) -> bytes:
        """Everything stored so far."""
        return b"".join([c async for c in self.logs()])

    async def kill(self) -> None:
        """Cancel or stop the job; ownership as for ``Client``."""
        await self._client.kill(self.id)

    release = kill


class AsyncLease(LeaseInfo):
    """``Lease`` for ``AsyncClient``."""

    _job: AsyncJob

    @property
    def job(self) -> AsyncJob:
        return self._job

    async def release(self) -> None:
        """End the hold now; an already ended hold is not an error."""
        with contextlib.suppress(errors.NotCancellableError):
            await self._job._client.kill(self.id, timeout=CANCEL_BOUND)

    @classmethod
    def of(cls, job: AsyncJob, mig_uuids: dict[str, str] | None = None) -> AsyncLease:
        info = LeaseInfo.from_job(job, mig_uuids)
        lease = cls(**{f: getattr(info, f) for f in info.__dataclass_fields__})
        object.__setattr__(lease, "_job", job)
        return lease

    @classmethod
    async def granted(cls, job: AsyncJob) -> AsyncLease:
        """``of`` with the MIG UUIDs of its instances, as their worker last reported them
        (one describe each); one that cannot be read is left out."""
        uuids: dict[str, str] = {}
        for device_id in mig_instance_ids(job.device_ids):
            with contextlib.suppress(errors.RcError):
                details = await job._client.describe(device_id)
                uuids[device_id.partition(":")[2]] = detected_uuid(details.raw)
        return cls.of(job, uuids)


class AsyncLeaseContext:
    """``async with client.lease(...) as lease:``: hold on entry, release on every exit."""

    def __init__(self, hold: Callable[[], Any]) -> None:
        self._hold = hold
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        self._lease = await AsyncLease.granted(await self._hold())
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            # Shielded: a cancelled task must still give the devices back.
            await asyncio.shield(lease.release())
        except errors.ClientError as e:
            if exc is None:
                raise
            exc.add_note(f"and the lease {lease.id} could not be released: {e}")


class AsyncClient:
    """``Client`` for asyncio programs: same configuration, same methods.

    Use ``async with AsyncClient() as client:`` or ``await client.aclose()``.
    """

    def __init__(
        self,
        controller: str | None = None,
        token: str | None = None,
        *,
        submitter: str | None = None,
    ) -> None:
        self._settings = config.settings()
        if controller:
            url, origin = controller, "given to the client"
        else:
            url, origin = self._settings.controller(), self._settings.controller_origin()
        tok = token if token is not None else self._settings.token()
        hint = self._settings.missing_token if token is None else None
        self._http = AsyncTransport(url, tok, origin=origin, missing_token=hint)
        self._submitter = submitter

    @property
    def submitter(self) -> str:
        """The identity sent with submits and kills, resolved once."""
        if self._submitter is None:
            self._submitter = self._settings.submitter()
        return self._submitter

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- the requests ----------------------------------------------------------------

    async def _get_job(self, job_id: str, timeout: float | None = None) -> api.PolledJob:
        path = api.job_path(job_id)
        data = await self._http.request("GET", path, timeout=timeout)
        return api.parse_polled_job(data, f"GET {path}")

    async def _resolve(self, given: str) -> str:
        query = api.prefix_query(given)
        if query is None:
            return given
        return api.pick_prefix_match(
            given, await self._http.request("GET", "/v1/jobs", query=query)
        )

    async def _state(self) -> api.Json:
        data: api.Json = shapes.normalise(
            await self._http.request("GET", "/v1/state"), shapes.STATE
        )
        return data

    async def _submit(self, command: Sequence[str] | None, **kw: Any) -> api.Json:
        body = api.submit_body(self.submitter, command, **kw)
        # The exchange runs shielded: a task cancelled while the answer is on its way
        # waits for it, cancels the job the controller may have committed, and only then
        # stops, so no hold or job is left behind that nobody knows the ID of.
        sent = asyncio.ensure_future(self._http.request("POST", "/v1/jobs", body=body))
        try:
            data = await asyncio.shield(sent)
        except asyncio.CancelledError:
            await asyncio.shield(self._withdraw(sent))
            raise
        except errors.ApiError as e:
            raise api.submit_refusal(e) from e
        job: api.Json = shapes.normalise(data, shapes.JOB)
        return job

    async def _withdraw(self, sent: asyncio.Future[Any]) -> None:
        """Cancel the job a submit abandoned by its caller made, once its answer names it."""
        try:
            data = await asyncio.wait_for(sent, CANCEL_BOUND)
            job_id = str(shapes.normalise(data, shapes.JOB)["id"])
        except Exception:
            return  # refused or never answered: no job to cancel
        await self._cancel(job_id)

    # ---- polling loops: the rules are waits.py's, as api.JsonClient's ----------------

    async def _wait_scheduled(self, job_id: str, limit: float | None) -> api.Json:
        wait = waits.UntilScheduled(job_id, None if limit is None else time.monotonic() + limit)
        return await self._wait(wait)

    async def _wait_terminal(self, job_id: str, bound: float | None) -> api.Json:
        return await self._wait(waits.UntilTerminal(job_id, bound, time.monotonic()))

    async def _wait(self, wait: waits.UntilScheduled) -> api.Json:
        while True:
            bound = wait.timeout(time.monotonic())  # a passed deadline is no failed poll
            try:
                view = await self._get_job(wait.job_id, bound)
            except errors.ClientError as e:
                wait.failed(e)
            else:
                if wait.reached(view):
                    return view.job
            await asyncio.sleep(wait.pause(time.monotonic()))

    async def _output(self, job_id: str) -> AsyncIterator[bytes]:
        """Follow to the end, resuming a broken stream as ``waits.StreamResume`` says."""
        resume = waits.StreamResume()
        path = api.job_path(job_id) + "/logs"
        while True:
            try:
                query = messages.logs_query(offset=resume.offset)
                async for chunk in self._http.stream("GET", path, query=query):
                    resume.delivered(chunk)
                    yield chunk
                return
            except errors.TransportError:
                if resume.broke():
                    raise
                await asyncio.sleep(resume.pause)

    # ---- the fleet -------------------------------------------------------------------

    async def devices(self) -> list[Device]:
        """Every device with its state and holder, by ID."""
        return [Device.from_view(v) for v in (await self._state()).get("devices") or []]

    async def describe(self, device_id: str) -> DeviceDetails:
        """Everything about one device."""
        data = await self._http.request("GET", api.device_path(device_id) + "/describe")
        return DeviceDetails.from_json(shapes.normalise(data, shapes.DESCRIBE))

    async def explain(self, selector: str) -> Explanation:
        """What ``selector`` matches now; submits nothing."""
        data = await self._http.request("GET", "/v1/explain", query={"selector": selector})
        return Explanation.from_json(shapes.normalise(data, shapes.EXPLAIN), selector)

    async def whoami(self) -> dict[str, str]:
        """This token's role, and its name when it has one."""
        data = await self._http.request("GET", "/v1/whoami")
        return {str(k): str(v) for k, v in (data or {}).items()}

    async def usage(self, since: str = "7d", by: str = "submitter", limit: int = 0) -> Usage:
        """Who held what over the last ``since``, per ``by``, as
        ``Client.usage``."""
        check_usage(since, by)
        ask = messages.UsageAsk(since, by, limit)
        return Usage.from_json(ask.read(await self._http.request("GET", ask.path, query=ask.query)))

    # ---- jobs ------------------------------------------------------------------------

    async def job(self, job_id: str) -> AsyncJob:
        """A handle for an existing job, by ID or unique prefix."""
        view = await self._get_job(await self._resolve(job_id))
        return AsyncJob.bind(self, view.job, view.queue_position, view.waiting_for)

    async def jobs(
        self, *, device: str = "", state: str = "", submitter: str = "", limit: int = 20
    ) -> list[AsyncJob]:
        """Job history, newest first; any ``limit``, read a page at a time as
        ``Client.jobs`` does."""
        found: list[api.Json] = []
        while True:
            asked = messages.jobs_page_size(limit, len(found))
            before = str(found[-1].get("id") or "") if found else ""
            query = messages.jobs_query(device, state, submitter, asked, before)
            data = await self._http.request("GET", "/v1/jobs", query=query)
            if not messages.add_jobs_page(found, data, asked) or len(found) >= limit:
                return [AsyncJob.bind(self, j) for j in found]

    async def submit(
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
    ) -> AsyncJob:
        """Queue ``argv`` and return its handle at once; see ``Client.submit``."""
        command = options.check_argv(argv)
        want = options.target(device, select, count)
        given = options.after_ids(after, after_any, no_wait)
        job = await self._submit(
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
            after=[await self._resolve(g) for g in given],
            after_any=after_any,
        )
        return AsyncJob.bind(self, job)

    async def run(
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
        """Run ``argv`` and wait for it, like ``rc run``; see ``Client.run``."""
        want = options.target(device, select, count)
        job = await self.submit(
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
        await self._leave_queue(job, timeout, want.count)
        captured: list[bytes] | None = [] if capture else None
        if job.started_at is not None or not job.terminal:
            sink: Callable[[bytes], object] = write_stdout
            if captured is not None:
                sink = captured.append
            elif on_output is not None:
                sink = on_output
            async for chunk in self._output(job.id):
                sink(chunk)
            await job.wait(FINAL_WAIT)
        output = b"".join(captured) if captured is not None else None
        result = RunResult(run_exit_code(job), job, output)
        if check and not result.ok:
            raise JobFailed(result)
        return result

    async def _leave_queue(self, job: AsyncJob, timeout: Duration | None, count: int) -> None:
        limit = options.seconds(timeout, "timeout")
        if job.state == "queued":
            try:
                await job.wait_started(limit or None)
            except BaseException:
                await asyncio.shield(self._cancel(job.id))
                raise
        shortfall = options.count_shortfall(job.raw, count)
        if shortfall:
            await self._cancel(job.id)
            raise options.CountNotHonoured(shortfall)

    async def _cancel(self, job_id: str) -> None:
        with contextlib.suppress(errors.ClientError):
            await self.kill(job_id, timeout=CANCEL_BOUND)

    async def kill(self, job_id: str, *, timeout: float | None = None) -> None:
        """Cancel a queued job or stop a running one."""
        path = api.job_path(await self._resolve(job_id)) + "/kill"
        try:
            await self._http.request(
                "POST", path, body={"submitter": self.submitter}, timeout=timeout
            )
        except errors.ApiError as e:
            raise api.kill_refusal(e) from e

    async def release(self, job_id: str) -> None:
        """End a hold (or any job) early."""
        await self.kill(job_id)

    # ---- holds -----------------------------------------------------------------------

    async def hold(
        self,
        *,
        ttl: Duration,
        reason: str | None = None,
        select: str = "",
        device: str | Sequence[str] = "",
        count: int = 1,
        timeout: Duration | None = None,
        wait: bool = True,
    ) -> AsyncJob:
        """Take a hold and return it once granted; see ``Client.hold``."""
        want = options.target(device, select, count)
        ttl_seconds = options.ceiling(ttl, "ttl")
        why = options.default_reason() if reason is None else reason
        api.check_hold(ttl_seconds, why)
        job = AsyncJob.bind(
            self,
            await self._submit(
                None,
                device=want.device,
                device_ids=want.device_ids,
                selector=select,
                max_runtime_seconds=ttl_seconds,
                kind="hold",
                reason=why,
                count=want.count,
            ),
        )
        if not wait:
            return job
        await self._leave_queue(job, timeout, want.count)
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
    ) -> AsyncLeaseContext:
        """``async with client.lease(ttl="30m") as lease:``; see ``Client.lease``."""
        options.target(device, select, count)  # refused before any request
        options.ceiling(ttl, "ttl")
        return AsyncLeaseContext(
            lambda: self.hold(
                ttl=ttl,
                reason=reason,
                select=select,
                device=device,
                count=count,
                timeout=timeout,
            )
        )
