"""The Python API: ``from resource_controller import Client`` (EXT-PYAPI-1..3).

``typed``'s operations, each a blocking method, carried out by ``api.JsonClient`` (what
the ``rc`` commands use), so the Python API and the command line send the same
requests, poll on the same budgets, wait out the same outages and read the same
configuration (``RC_CONTROLLER``, ``RC_TOKEN``, ``RC_SUBMITTER``, the user config file).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from resource_controller import errors
from resource_controller.client import api, machine
from resource_controller.client.typed import (
    BaseClient,
    BaseJob,
    BaseLease,
    D,
    JobFailed,
    NotGranted,
)

if TYPE_CHECKING:
    from resource_controller.client.calls import Op

__all__ = ["Client", "Job", "JobFailed", "Lease", "NotGranted"]


P = ParamSpec("P")
R = TypeVar("R")


def blocking(op: Callable[Concatenate[D, P], Op[R]]) -> Callable[Concatenate[D, P], R]:
    """The operation ``op`` as a method that blocks until it is done."""

    @functools.wraps(op)
    def method(self: D, /, *args: P.args, **kwargs: P.kwargs) -> R:
        done: R = self._drive(op(self, *args, **kwargs))
        return done

    return method


def chunks(op: Callable[Concatenate[D, P], Op[Any]]) -> Callable[Concatenate[D, P], Iterator[Any]]:
    """The output of ``op`` (its ``Out`` steps) as an iterator."""

    @functools.wraps(op)
    def method(self: D, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[Any]:
        found: Iterator[Any] = self._iterate(op(self, *args, **kwargs))
        return found

    return method


@contextlib.contextmanager
def noting_release(lease: BaseLease, exc: BaseException | None) -> Iterator[None]:
    """A release that fails while another error is on its way is noted on that error."""
    try:
        yield
    except errors.ClientError as e:
        if exc is None:
            raise
        exc.add_note(f"and the lease {lease.id} could not be released: {e}")


class Job(BaseJob):
    __doc__ = BaseJob.__doc__

    _client: Client

    refresh = blocking(BaseJob._refresh)
    wait = blocking(BaseJob._wait)
    wait_started = blocking(BaseJob._wait_started)
    logs = chunks(BaseJob._logs)
    output = blocking(BaseJob._output)
    kill = blocking(BaseJob._kill)
    release = kill


class Lease(BaseLease):
    __doc__ = BaseLease.__doc__

    job: Job

    def release(self) -> None:
        """End the hold now; an already ended hold is not an error."""
        with contextlib.suppress(errors.NotCancellableError):
            self.job._client.kill(self.id, timeout=machine.CANCEL_BOUND)


class LeaseContext:
    """``with client.lease(...) as lease:``: hold on entry, release on every exit."""

    def __init__(self, client: Client, hold: dict[str, Any]) -> None:
        self._client = client
        self._hold = hold
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        job = self._client.hold(**self._hold)
        self._lease = Lease.of(job, self._client._mig_uuids(job.device_ids))
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            with noting_release(lease, exc):
                lease.release()


_Ops = BaseClient[Job, LeaseContext]


class Client(BaseClient[Job, LeaseContext]):
    """Talk to one controller as the current user, with typed results.

    With no arguments the controller URL, token and submitter come from the same
    environment variables and user config file as ``rc``. Close it (or use it as a
    context manager) to drop the kept-alive connection.
    """

    _job_class = Job
    _lease_class = LeaseContext

    def __init__(
        self,
        controller: str | None = None,
        token: str | None = None,
        *,
        submitter: str | None = None,
    ) -> None:
        #: The command line's client underneath, for anything not wrapped here.
        self.low = api.JsonClient(controller, token, submitter=submitter)
        self.low.hold_interrupts = True
        self._now = self.low.monotonic

    @property
    def submitter(self) -> str:
        """The identity sent with submits and kills, resolved once."""
        return self.low.submitter

    def _drive(self, op: Any) -> Any:
        return self.low.drive(op)

    def _iterate(self, op: Any) -> Any:
        return self.low.iterate(op)

    def close(self) -> None:
        """Close kept-alive connections."""
        self.low.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    devices = blocking(_Ops._devices)
    describe = blocking(_Ops._describe)
    explain = blocking(_Ops._explain)
    whoami = blocking(_Ops._whoami)
    usage = blocking(_Ops._usage)
    _mig_uuids = blocking(_Ops._uuids)
    job = blocking(_Ops._job)
    jobs = blocking(_Ops._jobs)
    submit = blocking(_Ops._submit)
    submit_array = blocking(_Ops._submit_array)
    array = blocking(_Ops._array)
    run = blocking(_Ops._run)
    kill = blocking(_Ops._kill)
    release = blocking(_Ops._release)
    hold = blocking(_Ops._hold)
