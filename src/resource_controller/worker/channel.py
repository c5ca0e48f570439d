"""The worker's typed channel to the controller: one method per route it calls (WRK-031).

Bodies leave out every field at its default, but the registration's ``labels`` (absent,
null and ``{}`` differ, WRK-043). Every answer feeds the reconnection tracker (WRK-032);
with several controllers (EXT-PG-5) a request moves on after a refused connection, no
answer or a 5xx.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from resource_controller import errors, wire
from resource_controller.clock import Clock
from resource_controller.core import durations
from resource_controller.h1 import aio, core
from resource_controller.h1.aio import Answer
from resource_controller.worker import reconnect
from resource_controller.worker.timings import DEFAULT, Timings

#: Bound on opening a relay stream (a streaming request has no overall bound).
RELAY_CONNECT_TIMEOUT = 120.0
INSTANCE_HEADER = "Rc-Controller-Instance"
INSTANCE_HEADER_KEY = INSTANCE_HEADER.lower()

#: The request was never sent, so another controller may take it.
CONNECT_ERRORS = (errors.ConnectFailed,)

#: No HTTP answer came back (a caller's own bound is a ``TimeoutError``).
TRANSPORT_ERRORS = (errors.TransportError, TimeoutError)


class StartupError(Exception):
    """The worker cannot start; the message is the ``rc: <message>`` line (WRK-002)."""


class RegisterError(StartupError):
    """Registration failed; the message is the ``register: ...`` line of WRK-045."""


# ---- reading answers -----------------------------------------------------------------


def status_line(resp: Answer) -> str:
    """``404 Not Found``: how a refusal is named in messages."""
    return f"{resp.status_code} {resp.reason_phrase}".strip()


def error_text(exc: BaseException) -> str:
    """A transport error in one line; a bare timeout says so rather than nothing."""
    if isinstance(exc, (TimeoutError, errors.TimedOut)):
        return "request timed out"
    return str(exc) or type(exc).__name__


class Kills(list[str]):
    """A poll's kill flags; ``grace``: seconds to SIGKILL of those that stop a preemption's
    victim (EXT-PREEMPT-2), which the other kills take from ``kill_grace``."""

    def __init__(self, ids: Iterable[str] = (), grace: dict[str, float] | None = None) -> None:
        super().__init__(ids)
        self.grace = grace or {}


class PollAnswer(NamedTuple):
    """What one successful poll carried: 204 is both lists empty."""

    assignments: list[wire.Assignment]
    kills: list[str]


def parse_poll_body(body: bytes) -> PollAnswer:
    """Decode a 200 poll answer (WRK-060, WRK-064, EXT-COMPAT-1); ``ValueError`` if
    undecodable. Unknown assignment fields are ignored."""
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("poll answer is not a JSON object")
    raw_assignments = data.get("assignments") or []
    raw_kills = data.get("kills") or []
    if not isinstance(raw_assignments, list) or not isinstance(raw_kills, list):
        raise ValueError("poll answer lists are not lists")
    known = wire.Assignment.model_fields
    assignments = []
    for item in raw_assignments:
        if not isinstance(item, dict):
            raise ValueError("an assignment is not a JSON object")
        fields = {
            k: wire.null_means_empty(known[k].annotation, v) for k, v in item.items() if k in known
        }
        assignments.append(wire.Assignment.model_validate(fields))
    if not all(isinstance(k, str) for k in raw_kills):
        raise ValueError("a kill is not a job ID string")
    raw_grace = data.get("kill_grace")
    grace = {
        str(k): float(v)
        for k, v in (raw_grace.items() if isinstance(raw_grace, dict) else ())
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
    }
    return PollAnswer(assignments, Kills(raw_kills, grace))


# ---- writing bodies ------------------------------------------------------------------


def body_of(model: BaseModel, *, always: Sequence[str] = ()) -> dict[str, Any]:
    """``model`` as a JSON body: fields at their default left out, except ``always``."""
    trimmed = model.model_dump(mode="json", exclude_defaults=True)
    if not always:
        return trimmed
    full = model.model_dump(mode="json")
    return {k: full[k] if k in always else trimmed[k] for k in full if k in always or k in trimmed}


def status_body(
    worker_id: str,
    state: str,
    *,
    exit_code: int | None = None,
    reason: str = "",
    lease_epoch: int | None = None,
    gpu: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``POST /v1/jobs/{id}/status`` (WRK-101, EXT-EPOCH-3, EXT-ACCT-1), as the outbox keeps it."""
    report = wire.StatusReport(
        worker_id=worker_id,
        state=state,
        exit_code=exit_code,
        reason=reason,
        lease_epoch=lease_epoch or None,
        **(gpu or {}),
    )
    return body_of(report, always=("worker_id", "state"))


def fault_body(reason: str) -> dict[str, Any]:
    """``POST /v1/devices/{id}/fault``: ``{"reason": ...}``."""
    return body_of(wire.FaultReport(reason=reason), always=("reason",))


def heartbeat_body(running: Sequence[str], pending: Sequence[str]) -> dict[str, Any]:
    request = wire.HeartbeatRequest(
        running_job_ids=list(running) or None, pending_job_ids=list(pending) or None
    )
    return body_of(request)


def registration_body(request: wire.RegisterRequest | wire.LabelsPush) -> dict[str, Any]:
    """A registration or a labels push: ``labels`` always, as ``null`` if empty."""
    return body_of(request, always=("labels", "declared_labels"))


# ---- the channel ---------------------------------------------------------------------


def target_of(path: str, params: Mapping[str, str] | None = None) -> str:
    """``path`` percent-encoded where it must be (IDs go in unescaped), then the query."""
    target = urllib.parse.quote(path, safe="/!$&'()*+,;=:@[]%")
    if params:
        target += "?" + urllib.parse.urlencode(params)
    return target


class Channel:
    """The worker's requests to one controller, over one client opened by ``open``."""

    def __init__(
        self,
        base_url: str,
        token: str,
        clock: Clock,
        contact: reconnect.Reconnect,
        *,
        connect: aio.Connect = aio.open_tcp,
        timings: Timings = DEFAULT,
    ) -> None:
        self._timings = timings
        #: Requests go to ``_bases[_at]`` until it refuses a connection or answers 5xx.
        self._bases = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        self._ends: list[core.Endpoint] = []
        self._at = 0
        self._token = token
        self._clock = clock
        self._contact = contact
        self._connect = connect
        self._client: aio.HttpClient | None = None
        #: Set by ``register`` (or from the outbox's records before it; WRK-033).
        self.worker_id = ""

    @property
    def _base(self) -> str:
        return self._bases[self._at]

    def _next(self) -> None:
        self._at = (self._at + 1) % len(self._bases)

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[aio.HttpClient]:
        """The client; ``StartupError`` for a bad URL, or one a proxy is meant to carry."""
        try:
            self._ends = [core.endpoint(url) for url in self._bases]
        except ValueError as exc:
            raise StartupError(f"controller_url {exc}") from None
        for end in self._ends:
            if refusal := core.proxy_refusal(end, os.environ):
                raise StartupError(refusal)
        headers = {"Authorization": core.bearer(self._token), "Content-Type": "application/json"}
        self._client = aio.HttpClient(headers, connect=self._connect)
        try:
            yield self._client
        finally:
            await self._client.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
        again: bool = False,
    ) -> Answer:
        """One request; any answer is contact. ``again``: safe to send to the next at once."""
        assert self._client is not None, "the channel is not open"
        target = target_of(path, params)
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else content
        bound = self._timings.request_timeout if timeout is None else timeout
        several = len(self._bases) > 1
        for step in range(len(self._bases)):
            last = step == len(self._bases) - 1
            try:
                resp = await self._client.request(
                    method, self._ends[self._at], target, data, timeout=bound
                )
            except CONNECT_ERRORS:
                self._next()
                if last:
                    raise
                continue
            except TRANSPORT_ERRORS:
                self._next()
                if last or not again:
                    raise
                continue
            self._contact.observe(
                self._clock.monotonic(), resp.headers.get(INSTANCE_HEADER_KEY, "")
            )
            if resp.status_code >= 500 and several:
                self._next()
                if again and not last:
                    continue
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- one method per route --------------------------------------------------------

    async def register(self, request: wire.RegisterRequest) -> str:
        """Register; store and return the worker ID. ``RegisterError`` on any failure."""
        try:
            resp = await self._request(
                "POST", "/v1/workers/register", body=registration_body(request), again=True
            )
        except TRANSPORT_ERRORS as exc:
            raise RegisterError(f"register: {error_text(exc)}") from exc
        if resp.status_code != 200:
            raise RegisterError(f"register: controller returned {status_line(resp)}")
        try:
            worker_id = wire.RegisterResponse.model_validate(resp.json()).worker_id
        except ValueError as exc:
            raise RegisterError(f"register: unreadable answer: {exc}") from exc
        self.worker_id = worker_id
        return worker_id

    async def _tell(
        self, path: str, body: dict[str, Any], timeout: float | None = None, again: bool = True
    ) -> str:
        """A POST: ``""`` when accepted, else what went wrong."""
        try:
            resp = await self._request("POST", path, body=body, timeout=timeout, again=again)
        except TRANSPORT_ERRORS as exc:
            return error_text(exc)
        return "" if resp.is_success else f"controller returned {status_line(resp)}"

    async def heartbeat(self, running: Sequence[str], pending: Sequence[str]) -> str:
        """One heartbeat; ``""`` when accepted, else what went wrong."""
        body = heartbeat_body(running, pending)
        return await self._tell(f"/v1/workers/{self.worker_id}/heartbeat", body)

    async def poll(self, wait: float, have: Sequence[str] = ()) -> PollAnswer | str:
        """One long poll asking the controller to wait up to ``wait`` seconds: the answer,
        or what made it a poll error. ``have`` names the jobs this process has, so that a
        job whose hand-out answer was lost is handed out again."""
        path = f"/v1/workers/{self.worker_id}/assignments"
        params = {"wait": durations.render_duration(wait), "have": ",".join(have)}
        bound = wait + self._timings.poll_margin
        try:
            resp = await self._request("GET", path, params=params, timeout=bound, again=True)
        except TRANSPORT_ERRORS as exc:
            return error_text(exc)
        if resp.status_code == 204:
            return PollAnswer([], [])
        if resp.status_code != 200:
            return f"controller returned {status_line(resp)}"
        try:
            return parse_poll_body(resp.content)
        except (ValueError, ValidationError) as exc:
            return f"undecodable answer: {exc}"

    async def report_running(self, job_id: str, body: dict[str, Any], timeout: float) -> str:
        """One attempt, never moved on at once: a status report is not safe to repeat."""
        return await self._tell(f"/v1/jobs/{job_id}/status", body, timeout, again=False)

    async def status(self, job_id: str, body: Mapping[str, Any], timeout: float) -> Answer:
        return await self._request(
            "POST", f"/v1/jobs/{job_id}/status", body=dict(body), timeout=timeout
        )

    async def fault(self, device_id: str, body: Mapping[str, Any], timeout: float) -> Answer:
        return await self._request(
            "POST", f"/v1/devices/{device_id}/fault", body=dict(body), timeout=timeout
        )

    async def append_log(
        self, job_id: str, chunk: bytes, lease_epoch: int | None, timeout: float | None = None
    ) -> Answer:
        """Raw output bytes, epoch echoed; never sent twice here, that is ``logship``'s call."""
        params = {"lease_epoch": str(lease_epoch)} if lease_epoch else None
        return await self._request(
            "POST", f"/v1/jobs/{job_id}/logs", content=chunk, params=params, timeout=timeout
        )

    async def relay_output(self, job_id: str) -> aio.Exchange:
        """``POST /v1/jobs/{id}/tty/out``, its body left open (WTTY-001)."""
        return await self._relay("POST", job_id, "out", "application/octet-stream")

    async def relay_input(self, job_id: str) -> aio.Exchange:
        return await self._relay("GET", job_id, "in", "application/json")

    async def _relay(self, method: str, job_id: str, half: str, content_type: str) -> aio.Exchange:
        """One half of a relay; its answer is no contact (WRK-032)."""
        return await aio.relay(
            self._base,
            method,
            f"/v1/jobs/{job_id}/tty/{half}",
            self._token,
            content_type=content_type,
            timeout=RELAY_CONNECT_TIMEOUT,
            connect=self._connect,
        )

    async def push_labels(self, request: wire.LabelsPush) -> str:
        """The interval labels push; ``""`` when accepted, else the problem."""
        path = f"/v1/workers/{self.worker_id}/labels"
        return await self._tell(path, registration_body(request))
