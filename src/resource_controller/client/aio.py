"""The asyncio twin of ``Client`` (EXT-PYAPI-4): ``typed``'s operations, each a coroutine,
carried out by ``aio_transport`` on ``h1.aio``. A log follow is an async iterator;
``lease()`` is an async context manager. Cancelling a task behaves like an interrupt of
``rc run``/``rc hold``: while queued the job is cancelled, a ``run()`` job that started
is left running, a lease is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate

from resource_controller import errors
from resource_controller.client import config, machine
from resource_controller.client.aio_transport import AsyncTransport
from resource_controller.client.sync import P, R, noting_release
from resource_controller.client.typed import (
    BaseClient,
    BaseJob,
    BaseLease,
    D,
)

if TYPE_CHECKING:
    from resource_controller.client.calls import Op

__all__ = ["AsyncClient", "AsyncJob", "AsyncLease"]


def awaited(
    op: Callable[Concatenate[D, P], Op[R]],
) -> Callable[Concatenate[D, P], Coroutine[Any, Any, R]]:
    """The operation ``op`` as a coroutine method."""

    @functools.wraps(op)
    async def method(self: D, /, *args: P.args, **kwargs: P.kwargs) -> R:
        done: R = await self._drive(op(self, *args, **kwargs))
        return done

    return method


def async_chunks(
    op: Callable[Concatenate[D, P], Op[Any]],
) -> Callable[Concatenate[D, P], AsyncIterator[Any]]:
    """The output of ``op`` as an async iterator."""

    @functools.wraps(op)
    def method(self: D, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Any]:
        found: AsyncIterator[Any] = self._iterate(op(self, *args, **kwargs))
        return found

    return method


class AsyncJob(BaseJob):
    """``Job`` for ``AsyncClient``: the same fields, its calls awaited."""

    _client: AsyncClient

    refresh = awaited(BaseJob._refresh)
    wait = awaited(BaseJob._wait)
    wait_started = awaited(BaseJob._wait_started)
    logs = async_chunks(BaseJob._logs)
    output = awaited(BaseJob._output)
    kill = awaited(BaseJob._kill)
    release = kill


class AsyncLease(BaseLease):
    """``Lease`` for ``AsyncClient``."""

    job: AsyncJob

    async def release(self) -> None:
        """End the hold now; an already ended hold is not an error."""
        with contextlib.suppress(errors.NotCancellableError):
            await self.job._client.kill(self.id, timeout=machine.CANCEL_BOUND)


class AsyncLeaseContext:
    """``async with client.lease(...) as lease:``: hold on entry, release on every exit."""

    def __init__(self, client: AsyncClient, hold: dict[str, Any]) -> None:
        self._client = client
        self._hold = hold
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        job = await self._client.hold(**self._hold)
        self._lease = AsyncLease.of(job, await self._client._mig_uuids(job.device_ids))
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            with noting_release(lease, exc):
                # Shielded: a cancelled task must still give the devices back.
                await asyncio.shield(lease.release())


_Ops = BaseClient[AsyncJob, AsyncLeaseContext]


class AsyncClient(BaseClient[AsyncJob, AsyncLeaseContext]):
    """``Client`` for asyncio programs: same configuration, same methods.

    Use ``async with AsyncClient() as client:`` or ``await client.aclose()``.
    """

    _job_class = AsyncJob
    _lease_class = AsyncLeaseContext

    def __init__(
        self,
        controller: str | None = None,
        token: str | None = None,
        *,
        submitter: str | None = None,
    ) -> None:
        self._settings = config.settings()
        url, tok, origin, hint = self._settings.connection(controller, token)
        self._http = AsyncTransport(url, tok, origin=origin, missing_token=hint)
        self._submitter = submitter
        self._now = time.monotonic

    @property
    def submitter(self) -> str:
        """The identity sent with submits and kills, resolved once."""
        if self._submitter is None:
            self._submitter = self._settings.submitter()
        return self._submitter

    def _drive(self, op: Any) -> Any:
        return self._http.drive(op)

    def _iterate(self, op: Any) -> Any:
        return self._http.iterate(op)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    devices = awaited(_Ops._devices)
    describe = awaited(_Ops._describe)
    explain = awaited(_Ops._explain)
    whoami = awaited(_Ops._whoami)
    usage = awaited(_Ops._usage)
    _mig_uuids = awaited(_Ops._uuids)
    job = awaited(_Ops._job)
    jobs = awaited(_Ops._jobs)
    submit = awaited(_Ops._submit)
    submit_array = awaited(_Ops._submit_array)
    array = awaited(_Ops._array)
    run = awaited(_Ops._run)
    kill = awaited(_Ops._kill)
    release = awaited(_Ops._release)
    hold = awaited(_Ops._hold)
