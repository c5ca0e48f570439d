"""What every route needs, here rather than in a framework so that authentication always comes first
and a bad body is ``400 bad_request``, never a 422."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pydantic
import pydantic_core
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from resource_controller import errors
from resource_controller.clock import Clock
from resource_controller.controller.auth import Authenticator, satisfies
from resource_controller.controller.hub import Hub
from resource_controller.controller.metrics import Metrics
from resource_controller.controller.peers import Peers
from resource_controller.core import expiry, limits, preempt
from resource_controller.core.identity import Caller
from resource_controller.core.states import Role
from resource_controller.store.facade import Store
from resource_controller.store.logs import DEFAULT_MAX_BYTES, JobLogs

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)


@dataclass
class Settings:
    """Controller settings fixed at start-up. The durations are the spec's; only tests
    shorten them (``RC_TEST_TIMINGS``, ``controller/serve.py``)."""

    retain_disconnected_jobs: bool = False
    #: Seconds between safety-net scheduling passes.
    schedule_interval: float = 1.0
    #: Seconds between reaper passes; the first runs one interval after start.
    sweep_interval: float = expiry.SWEEP_INTERVAL
    #: Worker silence before its devices go ``unknown``.
    grace: float = expiry.GRACE
    #: Worker silence before it is written off (``worker_lost``, jobs ``lost``).
    unhealthy_after: float = expiry.UNHEALTHY_AFTER
    #: Start-up window without lease expiry or write-off: start + this.
    hold_off: float = expiry.HOLD_OFF
    #: Where webhook events go; empty means no notifier at all.
    webhook_url: str = ""
    #: ``--priority-aging``: seconds of waiting per step of effective priority; 0 = off.
    priority_aging: int = 0
    #: ``--log-retention``: stored output of jobs ended longer ago is deleted; 0 = kept.
    log_retention: int = 0
    #: ``--max-log-bytes``: the cap on one job's stored output; 0 = none.
    max_log_bytes: int = DEFAULT_MAX_BYTES
    #: ``--max-devices-per-submitter``: the default submitter limit; 0 = none.
    max_devices_per_submitter: int = 0
    #: ``--limits``: the limits file, read at start-up and again on SIGHUP; '' = none.
    limits_file: str = ""
    #: ``--preemption on|off``, ``--preempt-min-runtime``, ``--preempt-grace`` (EXT-PREEMPT).
    preemption: int = 1
    preempt_min_runtime: int = preempt.MIN_RUNTIME
    preempt_grace: int = preempt.GRACE


@dataclass
class Services:
    """The controller's long-lived parts, shared by routes and loops."""

    store: Store
    logs: JobLogs
    clock: Clock
    auth: Authenticator
    settings: Settings
    hub: Hub = field(default_factory=Hub)
    metrics: Metrics = field(default_factory=Metrics)
    instance: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: One thread runs every store call: serialised, and the loop never blocks on a commit.
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
    )

    #: This controller among the others on one database, and whether it leads.
    peers: Peers = field(init=False)

    def __post_init__(self) -> None:
        self.hub.events.clock = self.clock.now  # the event ``at`` is the controller's clock
        self.peers = Peers(self.store.database_url, self.instance, self.clock.now)
        if not self.peers.alone:
            self.hub.forward = self.peers.forward

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def log_store(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a log store call: on a thread when the store is a database, at once on files."""
        return await asyncio.to_thread(fn, *args) if self.logs.remote else fn(*args)

    def now(self) -> int:
        return int(self.clock.now())


@dataclass(slots=True)
class RouteCall:
    """One request as its handler gets it, once the route's role and body were checked."""

    svc: Services
    request: Request
    #: The token's caller (role and optional name); None on the routes without a token.
    caller: Caller | None
    #: The path's one parameter (a job, worker or device ID); '' when it has none.
    param: str = ""
    #: The route's JSON body, validated; None when the route takes none.
    body: Any = None

    @property
    def who(self) -> Caller:
        """The caller of a route that takes a token: dispatch authenticated it."""
        if self.caller is None:
            raise TypeError("this route takes no token, so it has no caller")
        return self.caller


Handler = Callable[[RouteCall], Awaitable[Response]]


@dataclass(frozen=True)
class Query:
    """A query parameter a route reads, as the OpenAPI document describes it."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Route:
    """One route: dispatch, authentication, the request timer and the OpenAPI document read it."""

    method: str
    #: The template: ``{name}`` is one non-empty path segment, the handler's ``param``.
    path: str
    #: The role the token must satisfy (AUTH-002); None: no token at all.
    role: Role | None
    handler: Handler
    #: The JSON body dispatch reads (after authentication, AUTH-003) and validates.
    body: type[pydantic.BaseModel] | None = None
    #: An empty body is refused instead of read as ``{}``.
    body_required: bool = False
    #: The body's cap in bytes, and what a refusal calls it.
    body_cap: int = limits.BODY_BYTES
    body_what: str = "JSON body"
    #: AUTH-004: the token may come as ``?token=`` when the header has none.
    query_token: bool = False
    # What the OpenAPI document says besides (controller-api.md §4, §6, §7).
    #: The success's status and, for a JSON answer, its type.
    status: int = 200
    answer: Any = None
    #: Statuses answered with an ``ErrorBody`` besides 401 and 403.
    errors: tuple[int, ...] = ()
    #: A documented 500 and what it means.
    failure: str = ""
    #: What a raw (not JSON) request body carries, for a route that reads it itself.
    raw: str = ""
    query: tuple[Query, ...] = ()
    #: Answers without a body: status -> description.
    empty: dict[int, str] = field(default_factory=dict)
    #: A success that is not JSON: (media type, description).
    text: tuple[str, str] | None = None
    #: Answers with a small fixed JSON object: status -> (description, example).
    examples: dict[int, tuple[str, dict[str, str | bool]]] = field(default_factory=dict)


def authorize(svc: Services, header: str | None, required: Role, fallback: str = "") -> Caller:
    """The caller of an ``Authorization`` header (or of ``fallback`` when the header
    carries no token: AUTH-004), refused unless its role satisfies ``required``."""
    token = svc.auth.bearer(header) or fallback
    caller = svc.auth.caller_of(token) if token else None
    if caller is None:
        raise errors.Unauthorized("a valid bearer token is required")
    if not satisfies(caller.role, required):
        raise errors.Forbidden(f"a {caller.role.value} token cannot use a {required.value} route")
    return caller


def parse_model(raw: bytes, model: type[M], *, empty_ok: bool = True) -> M:
    """Validate a JSON body; absent fields default, ``null`` and unknown fields are the
    models' to judge (``wire._Request``, ``wire._ClientRequest``)."""
    if not raw.strip():
        if not empty_ok:
            raise errors.BadRequest("a JSON body is required")
        raw = b"{}"
    try:
        data = pydantic_core.from_json(raw)
    except ValueError:
        raise errors.BadRequest("body is not valid JSON") from None
    if b"\\u0000" in raw and (where := _nul_at(data)) is not None:
        # No argv, environment, path or name can hold one, and PostgreSQL's text cannot.
        raise errors.BadRequest(f"{where or 'body'}: a string holds a NUL character (\\u0000)")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        unknown = [str(e["loc"][-1]) for e in exc.errors() if e.get("type") == "extra_forbidden"]
        if unknown:
            raise errors.BadRequest(unknown_fields(unknown, model)) from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        if first.get("type") == "json_invalid":
            raise errors.BadRequest("body is not valid JSON") from None
        raise errors.BadRequest(f"{where}: {first.get('msg', 'invalid')}") from None
    except ValueError:
        raise errors.BadRequest("body is not valid JSON") from None


def _nul_at(data: Any, where: str = "") -> str | None:
    """Where in a parsed body a string (or a key) holds a NUL character; None if nowhere."""
    if isinstance(data, str):
        return where if "\x00" in data else None
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{where}.{key}" if where else str(key)
            if "\x00" in key:
                return here
            if (found := _nul_at(value, here)) is not None:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            if (found := _nul_at(value, f"{where}.{i}" if where else str(i))) is not None:
                return found
    return None


#: How many unknown fields a refusal names, so that a hostile body gets a short answer.
UNKNOWN_FIELDS_SHOWN = 5


def unknown_fields(names: list[str], model: type[pydantic.BaseModel]) -> str:
    """The refusal of unknown fields, each named, a near miss with the field meant."""
    import difflib

    known = list(model.model_fields)
    said = []
    for name in names[:UNKNOWN_FIELDS_SHOWN]:
        shown = repr(name[:64])
        close = difflib.get_close_matches(name[:64], known, n=1, cutoff=0.6)
        said.append(f"{shown} (did you mean {close[0]}?)" if close else shown)
    if len(names) > UNKNOWN_FIELDS_SHOWN:
        said.append(f"and {len(names) - UNKNOWN_FIELDS_SHOWN} more")
    plural = "s" if len(names) > 1 else ""
    return (
        f"unknown field{plural} {', '.join(said)}: this controller does not know"
        f" {'them' if plural else 'it'}; the fields are {', '.join(known)}"
    )


async def disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_capped(
    request: Request, cap: int, what: str = "JSON body", code: str = "body_too_large"
) -> bytes:
    """The raw body, ``413`` past ``cap`` bytes: a declared ``Content-Length`` over it
    before a byte is read, a chunked (or lying) one as it streams, keeping nothing past it."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and len(declared) <= 20 and int(declared) > cap:
        raise errors.TooLarge(f"{what} exceeds {cap} bytes", code=code)
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > cap:
            raise errors.TooLarge(f"{what} exceeds {cap} bytes", code=code)
        parts.append(part)
    return b"".join(parts)
