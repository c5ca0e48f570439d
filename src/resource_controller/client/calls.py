"""The client's operations without I/O: the controller's routes as ``Call`` values, and
the other steps an operation asks its driver for.

An operation is a ``Call`` (one request) or a generator that yields steps and is sent
what each step gave: a ``Call``'s answer, read (or its ``ClientError``, thrown in); the
bytes of a ``Read``; nothing for a ``Sleep``. The blocking client (``api.JsonClient``)
and the asyncio one (``aio``) are the two drivers, so everything an operation decides
(bodies, paths, errors, retries, bounds) is decided once, here and in the modules that
build on it (``waits``, ``machine``). A ``KeyboardInterrupt``, an ``rc`` interrupt or a
cancelled task is thrown in as well, so the operation decides what it means.
"""

from __future__ import annotations

import re

from resource_controller import errors
from resource_controller.client import shapes, urls

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Mapping, Sequence
    from typing import Any, NamedTuple, TypeVar

    from resource_controller.client.submit import Submit

    #: A job, device view or other controller object, exactly as the controller sent it.
    Json = dict[str, Any]
    R = TypeVar("R")
    #: An operation that yields steps and returns an ``R``.
    Op = Generator[Any, Any, R]
else:
    from resource_controller.client.records import NamedTuple

    Json = dict  # the same at run time; the parameters are the type checker's

#: The shortest job ID prefix the client resolves, and how many of the jobs an
#: ambiguous one matches are named (EXT-CLI-7).
MIN_ID_PREFIX = 6
AMBIGUOUS_SHOWN = 5
#: The most jobs one ``GET /v1/jobs`` answers; a longer listing is read a page at a time.
JOBS_PAGE = 200
#: A complete job ID as this controller makes them (a UUID), used as given.
_FULL_JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# ---- the steps ---------------------------------------------------------------------


class Call:
    """One request and how its answer is read.

    ``timeout`` bounds the wait for each controller's answer (``None``: the transport's
    ``REQUEST_BOUND``); ``resend`` says that a request the controller may have seen can
    be sent again to the next controller of the list (reads, and a submit with its
    idempotency key); ``refuse`` maps a refusal onto its own error; ``shield`` asks the
    Python API to let the answer arrive before an interrupt takes effect (a submit).
    """

    __slots__ = ("body", "method", "path", "query", "read", "refuse", "resend", "shield", "timeout")

    def __init__(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
        read: Callable[[Any, str], Any] | None = None,
        refuse: Callable[[errors.ApiError], errors.ClientError] | None = None,
        resend: bool | None = None,
        shield: bool = False,
    ) -> None:
        self.method, self.path, self.query, self.body = method, path, query or None, body
        self.timeout = timeout
        self.read = read
        self.refuse = refuse
        self.resend = method == "GET" if resend is None else resend
        self.shield = shield

    def answer(self, data: Any, request: str) -> Any:
        """The answer's JSON as the operation wants it (``request`` names it in errors)."""
        return data if self.read is None else self.read(data, request)


class Sleep(NamedTuple):
    """Pause; the driver's clock decides how."""

    seconds: float


class Open(NamedTuple):
    """Open a long-lived answer (a log follow); gives a stream with its ``base`` URL."""

    call: Call


class Read(NamedTuple):
    """The stream's next bytes, ``b""`` at its end, ``None`` after ``idle`` seconds of
    silence (the stream stays open); ``idle`` ``None`` waits as long as it takes."""

    stream: Any
    idle: float | None = None


class Close(NamedTuple):
    """Drop a stream; safe on one already ended."""

    stream: Any


class Where(NamedTuple):
    """The base URL the driver's requests go to now (it moves on a fail-over)."""


class Out(NamedTuple):
    """Bytes of a job's output, for whoever reads them."""

    chunk: bytes


class Note(NamedTuple):
    """A line for the person watching (``rc`` prints it on stderr; the API drops it)."""

    text: str


class JoinRelay(NamedTuple):
    """Join the job's terminal or stdio (``tty``, ``pipe``) until it ends: ``rc`` only."""

    job_id: str
    stdio: str


# ---- answers -----------------------------------------------------------------------


class PolledJob(NamedTuple):
    """``GET /v1/jobs/{id}``: the job and, while it is queued, its 1-based position."""

    job: Json
    #: 0 when the job is not queued (the controller omits the key then).
    queue_position: int = 0
    #: What the queued job waits for; empty otherwise (never appended to).
    waiting_for: list[Json] = []  # noqa: RUF012

    @property
    def state(self) -> str:
        """The job's state word."""
        return str(self.job.get("state", ""))


def exit_status(code: int) -> int:
    """A job's non-zero code as the OS presents it (mod 256, so -1 reads 255), except that
    a multiple of 256 becomes 1: a failed job must never read as success (CLI-050)."""
    return code % 256 or 1


def _shaped(shape: shapes.Shape) -> Callable[[Any, str], Any]:
    return lambda data, _request: shapes.normalise(data, shape)


def _polled(data: Any, request: str) -> PolledJob:
    data = shapes.normalise(data, shapes.JOB_VIEW)
    job = data.get("job") if isinstance(data, dict) else None
    if not isinstance(job, dict):
        raise errors.TransportError(f"{request}: controller sent no job object")
    position = data.get("queue_position") or 0
    waits = data.get("waiting_for")
    return PolledJob(
        job,
        position if isinstance(position, int) else 0,
        [w for w in waits if isinstance(w, dict)] if isinstance(waits, list) else [],
    )


def _message(e: errors.ApiError) -> str:
    """The message the controller sent, ``""`` when it sent none (not the class default)."""
    return "" if e.message == (type(e).__doc__ or "").strip() else e.message


def _no_device(e: errors.ApiError) -> errors.ClientError:
    """A submit's 409, whatever the body, is ``NoDeviceError`` (CLI-075)."""
    return errors.NoDeviceError(_message(e) or None) if e.status == 409 else e


def _not_cancellable(e: errors.ApiError) -> errors.ClientError:
    """A kill's 409 is ``NotCancellableError`` with the controller's message (CLI-075)."""
    if e.status == 409:
        return errors.NotCancellableError(_message(e) or "job not cancellable")
    return e


# ---- the routes ----------------------------------------------------------------------


def job_path(job_id: str) -> str:
    """``/v1/jobs/{id}`` with the ID inserted as typed; only what HTTP forbids is escaped."""
    return "/v1/jobs/" + urls.quote(job_id, safe="/:@!$&'()*+,;=")


def device_path(device_id: str, *, segment: bool = False) -> str:
    """``/v1/devices/{id}``; the ``:`` of a device ID is never percent-encoded (CLI-071).

    ``segment`` encodes every other reserved character, as ``clear`` and ``retire`` do.
    """
    safe = "$&+=:@" if segment else "/:@!$&'()*+,;="
    return "/v1/devices/" + urls.quote(device_id, safe=safe)


def get_job(job_id: str, timeout: float | None = None) -> Call:
    return Call("GET", job_path(job_id), timeout=timeout, read=_polled)


def submit(spec: Submit, submitter: str, after: Sequence[str] = ()) -> Call:
    """``POST /v1/jobs``: the job created (a repeated key answers the same job)."""
    return Call(
        "POST",
        "/v1/jobs",
        body=spec.body(submitter, after),
        read=_shaped(shapes.JOB),
        refuse=_no_device,
        resend=bool(spec.idempotency_key),
        shield=True,
    )


def kill(job_id: str, submitter: str, timeout: float | None = None) -> Call:
    """Cancel a queued job or stop a running one; a 409 is ``NotCancellableError``.

    Sent again to the next controller when one does not answer: the job ends either way.
    """
    body = {"submitter": submitter}
    path = job_path(job_id) + "/kill"
    return Call("POST", path, body=body, timeout=timeout, refuse=_not_cancellable, resend=True)


def logs(job_id: str, *, follow: bool | None = None, offset: int = 0) -> Call:
    """``GET /v1/jobs/{id}/logs``: ``follow`` only when given (the route's default is to
    follow), ``offset`` only when positive (EXT-CLI-5)."""
    query = {"follow": "" if follow is None else "true" if follow else "false"}
    query["offset"] = str(offset) if offset > 0 else ""
    return Call("GET", job_path(job_id) + "/logs", query={k: v for k, v in query.items() if v})


def state(timeout: float | None = None) -> Call:
    return Call("GET", "/v1/state", timeout=timeout, read=_shaped(shapes.STATE))


def explain(selector: str, submitter: str) -> Call:
    query = {"selector": selector, "submitter": submitter}
    return Call("GET", "/v1/explain", query=query, read=_shaped(shapes.EXPLAIN))


def describe(device_id: str) -> Call:
    return Call("GET", device_path(device_id) + "/describe", read=_shaped(shapes.DESCRIBE))


def usage(since: str = "", by: str = "", limit: int = 0) -> Call:
    """``GET /v1/usage``, sending only what differs from the controller's defaults."""
    query = {"since": since, "by": by, "limit": str(limit) if limit else ""}
    return Call(
        "GET", "/v1/usage", query={k: v for k, v in query.items() if v}, read=_shaped(shapes.USAGE)
    )


def whoami() -> Call:
    return Call("GET", "/v1/whoami", read=lambda data, _r: data or {})


def device_action(device_id: str, action: str, body: Any = None) -> Call:
    """(admin) ``clear``, ``drain``, ``undrain`` a device, or retire it (``""``)."""
    path = device_path(device_id, segment=True) + (f"/{action}" if action else "")
    return Call("POST" if action else "DELETE", path, body=body)


def jobs(
    *, device: str = "", state: str = "", submitter: str = "", limit: int = 0
) -> Op[list[Json]]:
    """Job history, newest first, only non-empty filters sent; past ``JOBS_PAGE`` a page
    at a time, each asking for the jobs ``before`` the last one read. A page that
    repeats a job read already ends it: a controller without ``before`` (the reference)
    answers the first page again."""
    found: list[Json] = []
    while True:
        asked = min(limit - len(found), JOBS_PAGE) if limit else 0
        query = {"device": device, "state": state, "submitter": submitter}
        query.update(limit=str(asked) if asked else "", before=found[-1]["id"] if found else "")
        call = Call("GET", "/v1/jobs", query={k: v for k, v in query.items() if v})
        data = yield call
        page: list[Json] = shapes.normalise(data, shapes.JOB_LIST).get("jobs") or []
        seen = {j.get("id") for j in found}
        if any(j.get("id") in seen for j in page):
            return found
        found.extend(page)
        if not (asked and len(page) == asked and page) or len(found) >= limit:
            return found


class JobIdError(errors.ClientError):
    """A job ID prefix that is too short or matches several jobs."""


def resolve(given: str) -> Op[str]:
    """The full ID of the job ``given`` names: itself (a complete ID, no request), or the
    one job whose ID starts with it (EXT-CLI-7); none is ``not_found``, several raise
    ``JobIdError`` naming up to five."""
    if _FULL_JOB_ID.fullmatch(given):
        return given
    if len(given) < MIN_ID_PREFIX:
        raise JobIdError(
            f"job ID {given!r} is too short: give the full ID or a prefix of at least"
            f" {MIN_ID_PREFIX} characters"
        )
    query = {"id_prefix": given, "limit": str(AMBIGUOUS_SHOWN + 1)}
    data = yield Call("GET", "/v1/jobs", query=query)
    # Filtered here too, so a controller that ignores the filter cannot pick a wrong job.
    listed = data.get("jobs") if isinstance(data, dict) else None
    found = [str(j.get("id") or "") for j in listed or [] if isinstance(j, dict)]
    found = [i for i in found if i.startswith(given)]
    if given in found or len(found) == 1:
        return given if given in found else found[0]
    if not found:
        raise errors.api_error("not_found", f"no job ID starts with {given!r}", 404)
    shown = ", ".join(found[:AMBIGUOUS_SHOWN]) + (", ..." if len(found) > AMBIGUOUS_SHOWN else "")
    raise JobIdError(
        f"job ID prefix {given!r} is ambiguous: it matches {shown} (give more characters)"
    )


def resolve_all(given: Sequence[str]) -> Op[list[str]]:
    """``resolve`` of each, in order (``after``)."""
    out = []
    for g in given:
        out.append((yield from resolve(g)))
    return out
