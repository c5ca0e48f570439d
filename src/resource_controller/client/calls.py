"""The client's operations without I/O, as steps yielded to a driver (blocking or asyncio),
so bodies, errors, retries and what an interrupt means are decided once."""

from __future__ import annotations

import re

from resource_controller import errors
from resource_controller.client import shapes, urls

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Mapping, Sequence
    from typing import Any, NamedTuple, TypeVar

    from resource_controller.client.submit import Submit

    Json = dict[str, Any]
    R = TypeVar("R")
    Op = Generator[Any, Any, R]
else:
    from resource_controller.client.records import NamedTuple

    Json = dict  # the same at run time; the parameters are the type checker's

MIN_ID_PREFIX = 6
AMBIGUOUS_SHOWN = 5
JOBS_PAGE = 200
_FULL_JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Call:
    """One request. ``resend``: safe to send again to the next controller; ``shield``: let
    the answer arrive before an interrupt takes effect (a submit)."""

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
        return data if self.read is None else self.read(data, request)


class Sleep(NamedTuple):
    seconds: float


class Open(NamedTuple):
    """Open a long-lived answer (a log follow)."""

    call: Call


class Read(NamedTuple):
    """The stream's next bytes, ``b""`` at its end, ``None`` after ``idle`` seconds of silence."""

    stream: Any
    idle: float | None = None


class Close(NamedTuple):
    stream: Any


class Where(NamedTuple):
    """The base URL requests go to now (it moves on a fail-over)."""


class Out(NamedTuple):
    chunk: bytes


class Note(NamedTuple):
    """A line for the person watching (``rc`` prints it; the API drops it)."""

    text: str


class JoinRelay(NamedTuple):
    """Join the job's terminal or stdio until it ends: ``rc`` only."""

    job_id: str
    stdio: str


class PolledJob(NamedTuple):
    """``GET /v1/jobs/{id}``: the job and, while it is queued, its 1-based position."""

    job: Json
    queue_position: int = 0
    waiting_for: list[Json] = []  # noqa: RUF012

    @property
    def state(self) -> str:
        return str(self.job.get("state", ""))


def exit_status(code: int) -> int:
    """Mod 256 as the OS presents it, but a multiple of 256 is 1: a failure must not read as success."""
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
    return "" if e.message == (type(e).__doc__ or "").strip() else e.message


def _no_device(e: errors.ApiError) -> errors.ClientError:
    """A submit's 409, whatever the body, is ``NoDeviceError`` (CLI-075)."""
    return errors.NoDeviceError(_message(e) or None) if e.status == 409 else e


def _not_cancellable(e: errors.ApiError) -> errors.ClientError:
    if e.status == 409:
        return errors.NotCancellableError(_message(e) or "job not cancellable")
    return e


def job_path(job_id: str) -> str:
    return "/v1/jobs/" + urls.quote(job_id, safe="/:@!$&'()*+,;=")


def device_path(device_id: str, *, segment: bool = False) -> str:
    """The ``:`` of a device ID is never percent-encoded (CLI-071)."""
    safe = "$&+=:@" if segment else "/:@!$&'()*+,;="
    return "/v1/devices/" + urls.quote(device_id, safe=safe)


def get_job(job_id: str, timeout: float | None = None) -> Call:
    return Call("GET", job_path(job_id), timeout=timeout, read=_polled)


def submit(spec: Submit, submitter: str, after: Sequence[str] = ()) -> Call:
    """The answer is the job, or with ``array`` the array (EXT-ARRAY-1)."""
    return Call(
        "POST",
        "/v1/jobs",
        body=spec.body(submitter, after),
        read=_raw if spec.array else _shaped(shapes.JOB),
        refuse=_no_device,
        resend=bool(spec.idempotency_key),
        shield=True,
    )


def _raw(data: Any, _request: str) -> Any:
    return data if isinstance(data, dict) else {}


def get_array(array_id: str, timeout: float | None = None) -> Call:
    """EXT-ARRAY-3: the array's counts and its tasks in index order."""
    path = "/v1/arrays/" + urls.quote(array_id, safe="")
    return Call("GET", path, timeout=timeout, read=_raw)


def kill(job_id: str, submitter: str, timeout: float | None = None) -> Call:
    """Resent to the next controller when one does not answer: the job ends either way; an array's
    ID ends its tasks (EXT-ARRAY-3)."""
    body = {"submitter": submitter}
    path = job_path(job_id) + "/kill"
    return Call("POST", path, body=body, timeout=timeout, refuse=_not_cancellable, resend=True)


def logs(job_id: str, *, follow: bool | None = None, offset: int = 0) -> Call:
    """``follow`` sent only when given: the route's default is to follow."""
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
    """Past ``JOBS_PAGE``, page by page with ``before``; a repeated job ends it, since a
    controller without ``before`` answers the first page again."""
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
    """The full ID of the one job whose ID starts with ``given`` (EXT-CLI-7)."""
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
    out = []
    for g in given:
        out.append((yield from resolve(g)))
    return out
