"""What the client puts on the wire and how it reads the answers.

Pure pieces with no connection: request paths, the submit body, the refusals a status
maps to, the job view, and the job-ID prefix lookup. ``api.JsonClient`` and the asyncio
client both build on them, so the two cannot disagree about a body or an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from resource_controller import errors
from resource_controller.client import shapes, urls

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any, NamedTuple

    #: A job, device view or other controller object, exactly as the controller sent it.
    Json = dict[str, Any]
else:
    from resource_controller.client.records import NamedTuple

    Json = dict  # the same at run time; the parameters are the type checker's

#: The shortest job ID prefix the client resolves, and how many of the jobs
#: an ambiguous one matches are named.
MIN_ID_PREFIX = 6


AMBIGUOUS_SHOWN = 5


#: A complete job ID as this controller makes them (a UUID), used as given.
_FULL_JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class JobIdError(errors.ClientError):
    """A job ID prefix that is too short or matches several jobs."""


class PolledJob(NamedTuple):
    """``GET /v1/jobs/{id}``: the job and, while it is queued, its 1-based position.

    A named tuple, not a dataclass: ``dataclasses`` (with ``inspect``) would cost
    ``rc run`` more at start-up than this whole module.
    """

    job: Json
    #: 0 when the job is not queued (the controller omits the key then).
    queue_position: int = 0
    #: What the queued job waits for, one entry per device; empty otherwise.
    #: (The default list is shared: nothing ever appends to a view's.)
    waiting_for: list[Json] = []  # noqa: RUF012

    @property
    def state(self) -> str:
        """The job's state word."""
        return str(self.job.get("state", ""))


def exit_status(code: int) -> int:
    """The process exit status for a job's non-zero code.

    As the OS would present it (mod 256, so -1 reads 255), except that a multiple of
    256 becomes 1: a failed job must never read as success.
    """
    status = code % 256
    return status if status else 1


def new_idempotency_key() -> str:
    """A fresh random UUID4, without paying for the ``uuid`` module's import."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def job_path(job_id: str) -> str:
    """``/v1/jobs/{id}`` with the ID inserted as typed; only what HTTP forbids is escaped."""
    return "/v1/jobs/" + urls.quote(job_id, safe="/:@!$&'()*+,;=")


def device_path(device_id: str, *, segment: bool = False) -> str:
    """``/v1/devices/{id}``; the ``:`` of a device ID is never percent-encoded.

    ``segment`` encodes every other reserved character, as ``clear`` and ``retire`` do.
    """
    safe = "$&+=:@" if segment else "/:@!$&'()*+,;="
    return "/v1/devices/" + urls.quote(device_id, safe=safe)


def _controller_message(e: errors.ApiError) -> str:
    """The message the controller sent, or ``""`` when it sent none (not the class default)."""
    default = (type(e).__doc__ or "").strip()
    return "" if e.message == default else e.message


def submit_body(
    submitter: str,
    command: Sequence[str] | None,
    *,
    device: str = "",
    selector: str = "",
    cwd: str = "",
    env: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    max_runtime_seconds: int = 0,
    idle_timeout_seconds: int = 0,
    no_wait: bool = False,
    kind: str = "",
    reason: str = "",
    stdio: str = "",
    count: int = 1,
    device_ids: Sequence[str] = (),
    after: Sequence[str] = (),
    after_any: bool = False,
) -> Json:
    """The submit body: zero and empty values left out, ``command`` and
     ``submitter`` always sent; ``count`` only when it is not 1 and no ``device_ids``
     list implies it; ``after`` the full IDs of the jobs it waits for
    ."""
    body: dict[str, Any] = {"submitter": submitter}
    if command is not None:
        body["command"] = list(command)
    key = new_idempotency_key() if idempotency_key is None else idempotency_key
    optional: dict[str, Any] = {
        "device_id": device,
        "device_ids": list(device_ids) or None,
        "selector": selector,
        "cwd": cwd,
        "env": dict(env) if env else None,
        "idempotency_key": key,
        "priority": priority,
        "max_runtime_seconds": max_runtime_seconds,
        "idle_timeout_seconds": idle_timeout_seconds,
        "no_wait": no_wait,
        "kind": kind,
        "reason": reason,
        "stdio": stdio,
        "after": list(after) or None,
        "after_any": after_any,
    }
    body.update({k: v for k, v in optional.items() if v})
    if count != 1 and not device_ids:
        body["count"] = count
    return body


def check_hold(ttl_seconds: int, reason: str) -> None:
    """A hold's own rules, checked before any request: a positive TTL and a reason."""
    if ttl_seconds <= 0:
        raise ValueError(f"a hold needs a positive TTL (got {ttl_seconds}s)")
    if not reason.strip():
        raise ValueError("a hold needs a reason")


def submit_refusal(e: errors.ApiError) -> errors.ClientError:
    """A submit's error as raised: any 409 is ``NoDeviceError``."""
    if e.status == 409:
        return errors.NoDeviceError(_controller_message(e) or None)
    return e


def kill_refusal(e: errors.ApiError) -> errors.ClientError:
    """A kill's error as raised: a 409 is ``NotCancellableError`` with the message."""
    if e.status == 409:
        return errors.NotCancellableError(_controller_message(e) or "job not cancellable")
    return e


def parse_polled_job(data: Any, request: str) -> PolledJob:
    """``GET /v1/jobs/{id}``'s body as a ``PolledJob``; no job object is a protocol failure."""
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


#: The most jobs one ``GET /v1/jobs`` answers. A longer listing is read a page
#: at a time, each page asking for the jobs ``before`` the last one read.
JOBS_PAGE = 200


def jobs_query(
    device: str, state: str, submitter: str, limit: int, before: str = ""
) -> dict[str, str]:
    """``GET /v1/jobs``'s query: only what is set; a ``limit`` of 0 is the
    controller's default."""
    query = {"device": device, "limit": str(limit) if limit else "", "state": state}
    query.update(submitter=submitter, before=before)
    return {k: v for k, v in query.items() if v}


def jobs_page_size(limit: int, have: int) -> int:
    """How many jobs the next page asks for: what is still wanted, at most a page; 0
    (the controller's default, one page) when the caller set no limit."""
    return min(limit - have, JOBS_PAGE) if limit else 0


def add_jobs_page(found: list[Json], data: Any, asked: int) -> bool:
    """Append one ``GET /v1/jobs`` answer to ``found``; True when another page may follow.

    None does after a short page, or when the caller set no limit. A page that repeats
    a job already read ends the listing too: a controller without ``before`` (the
    reference) answers the first page again, and is read once.
    """
    page: list[Json] = shapes.normalise(data, shapes.JOB_LIST).get("jobs") or []
    seen = {j.get("id") for j in found}
    if any(j.get("id") in seen for j in page):
        return False
    found.extend(page)
    return asked > 0 and len(page) == asked and bool(page)


def prefix_query(given: str) -> dict[str, str] | None:
    """The lookup that resolves a job ID prefix; ``None`` for a complete ID.

    Raises ``JobIdError`` for a prefix shorter than ``MIN_ID_PREFIX``.
    """
    if _FULL_JOB_ID.fullmatch(given):
        return None
    if len(given) < MIN_ID_PREFIX:
        raise JobIdError(
            f"job ID {given!r} is too short: give the full ID or a prefix of at least"
            f" {MIN_ID_PREFIX} characters"
        )
    return {"id_prefix": given, "limit": str(AMBIGUOUS_SHOWN + 1)}


def pick_prefix_match(given: str, data: Any) -> str:
    """The one job ``prefix_query``'s answer names: ``not_found`` for none, ``JobIdError``
    naming up to five for several."""
    # Filtered here too, so a controller that ignores the filter cannot pick a wrong job.
    jobs = data.get("jobs") if isinstance(data, dict) else None
    found = [str(j.get("id") or "") for j in jobs or [] if isinstance(j, dict)]
    found = [i for i in found if i.startswith(given)]
    if given in found or len(found) == 1:
        return given if given in found else found[0]
    if not found:
        raise errors.api_error("not_found", f"no job ID starts with {given!r}", 404)
    shown = ", ".join(found[:AMBIGUOUS_SHOWN])
    more = ", ..." if len(found) > AMBIGUOUS_SHOWN else ""
    raise JobIdError(
        f"job ID prefix {given!r} is ambiguous: it matches {shown}{more} (give more characters)"
    )


def logs_query(*, follow: bool | None = None, offset: int = 0) -> dict[str, str] | None:
    """``GET /v1/jobs/{id}/logs``'s query: ``follow`` only when
    given (None is the route's default), ``offset`` only when positive; None when empty."""
    query: dict[str, str] = {}
    if follow is not None:
        query["follow"] = "true" if follow else "false"
    if offset > 0:
        query["offset"] = str(offset)
    return query or None


class UsageAsk:
    """One ``GET /v1/usage`` without I/O: what to send and how to read the
    answer, so the blocking and the asyncio clients ask and read it alike."""

    path = "/v1/usage"

    def __init__(self, since: str = "", by: str = "", limit: int = 0) -> None:
        #: Only what differs from the controller's defaults.
        query = {"since": since, "by": by, "limit": str(limit) if limit else ""}
        self.query = {k: v for k, v in query.items() if v}

    @staticmethod
    def read(data: Any) -> Json:
        """The answer with ``null`` lists and maps made empty."""
        out: Json = shapes.normalise(data, shapes.USAGE)
        return out
