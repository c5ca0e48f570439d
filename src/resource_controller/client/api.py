"""``JsonClient``: what the ``rc`` commands and Python programs share (CLI §3).

Commands are thin: each one calls a method here, so the command line and the Python
API cannot disagree about a route, a body or a polling budget. Results are the
controller's JSON objects as plain dicts (the ``--json`` outputs print them verbatim);
only the job view, which wraps a job with its queue position, gets a small record.

The two polling loops are the only code in the client that retries. Their
rules are ``waits.py``'s (shared with the asynchronous client), and their clock and
sleep are injectable so that tests count polls instead of waiting them out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from resource_controller import errors
from resource_controller.client import config, shapes
from resource_controller.client.messages import (
    AMBIGUOUS_SHOWN as AMBIGUOUS_SHOWN,
)
from resource_controller.client.messages import (
    JOBS_PAGE as JOBS_PAGE,
)
from resource_controller.client.messages import (
    MIN_ID_PREFIX as MIN_ID_PREFIX,
)
from resource_controller.client.messages import (
    JobIdError as JobIdError,
)
from resource_controller.client.messages import (  # the client's surface: api.X
    Json as Json,
)
from resource_controller.client.messages import (
    PolledJob as PolledJob,
)
from resource_controller.client.messages import (
    UsageAsk,
    add_jobs_page,
    jobs_page_size,
    jobs_query,
    logs_query,
)
from resource_controller.client.messages import (
    check_hold as check_hold,
)
from resource_controller.client.messages import (
    device_path as device_path,
)
from resource_controller.client.messages import (
    exit_status as exit_status,
)
from resource_controller.client.messages import (
    job_path as job_path,
)
from resource_controller.client.messages import (
    kill_refusal as kill_refusal,
)
from resource_controller.client.messages import (
    new_idempotency_key as new_idempotency_key,
)
from resource_controller.client.messages import (
    parse_polled_job as parse_polled_job,
)
from resource_controller.client.messages import (
    pick_prefix_match as pick_prefix_match,
)
from resource_controller.client.messages import (
    prefix_query as prefix_query,
)
from resource_controller.client.messages import (
    submit_body as submit_body,
)
from resource_controller.client.messages import (
    submit_refusal as submit_refusal,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    POLL_INTERVAL as POLL_INTERVAL,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    SCHEDULED_GIVE_UP as SCHEDULED_GIVE_UP,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    SCHEDULED_POLL_TIMEOUT as SCHEDULED_POLL_TIMEOUT,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    STREAM_GIVE_UP as STREAM_GIVE_UP,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    TERMINAL_GIVE_UP as TERMINAL_GIVE_UP,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    TERMINAL_POLL_TIMEOUT as TERMINAL_POLL_TIMEOUT,
)
from resource_controller.client.waits import (  # the client's surface: api.X
    PollGiveUp as PollGiveUp,
)
from resource_controller.client.waits import StreamResume, UntilScheduled, UntilTerminal
from resource_controller.client.waits import (  # the client's surface: api.X
    WaitTimeout as WaitTimeout,
)
from resource_controller.core.states import ACTIVE, TERMINAL

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    # Imported when a JsonClient first needs it: h11 pulls in typing and dataclasses,
    # and every command's --help (and the Python API's views) would pay for it otherwise.
    from resource_controller.client import transport


#: States a job never leaves.
TERMINAL_STATES = TERMINAL
#: Jobs holding a device.
ACTIVE_STATES = ACTIVE


def _view_id(view: Json) -> str:
    device = view.get("device")
    return str(device.get("id") or "") if isinstance(device, dict) else ""


def _leased(view: Json) -> bool:
    """A device view with a live lease: the view names its holder or job."""
    return bool(view.get("holder") or view.get("job_id"))


class JsonClient:
    """Talk to one controller with one token, as the current user: its routes as
    methods, answers as the controller's JSON (what ``rc`` calls; ``Client`` wraps it).

    With no arguments the controller URL, token and submitter come from the
    environment and the user config file, exactly as for ``rc``.
    """

    def __init__(
        self,
        controller: str | None = None,
        token: str | None = None,
        *,
        submitter: str | None = None,
        settings: config.Settings | None = None,
        http: transport.Transport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings or config.settings()
        if http is None:
            if controller:
                url, origin = controller, "given to the client"
            else:
                url, origin = self._settings.controller(), self._settings.controller_origin()
            tok = token if token is not None else self._settings.token()
            from resource_controller.client import transport

            # Where a missing token was looked for, when the settings were asked.
            hint = self._settings.missing_token if token is None else None
            http = transport.Transport(url, tok, origin=origin, missing_token=hint)
        self._http = http
        self._submitter = submitter
        self._sleep = sleep
        self._monotonic = monotonic

    @property
    def submitter(self) -> str:
        """The identity sent with submits and kills, resolved once."""
        if self._submitter is None:
            self._submitter = self._settings.submitter()
        return self._submitter

    def close(self) -> None:
        """Close kept-alive connections."""
        self._http.close()

    def relay_target(self) -> tuple[str, str]:
        """(base URL, token) for the relay's full-duplex streams."""
        return self._http.base_url, self._http.token

    def __enter__(self) -> JsonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- jobs ------------------------------------------------------------------------

    def submit(
        self,
        command: Sequence[str] | None,
        *,
        device: str = "",
        selector: str = "",
        count: int = 1,
        device_ids: Sequence[str] = (),
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
        after: Sequence[str] = (),
        after_any: bool = False,
        timeout: float | None = None,
    ) -> Json:
        """Submit a job or hold and return the created job.

        Neither ``device`` nor ``selector`` means any device. ``count`` asks
        for that many devices on one host and ``device_ids`` pins to a list of them in
        place of ``device``, implying the count. ``after`` names (by full
        ID, ``resolve_job_ids``) the jobs to wait for: only their success lets it start,
        any end with ``after_any``. A fresh idempotency key is generated
        unless one is given (``""`` sends none).
        Raises ``NoDeviceError`` on 409, whatever the body.
        """
        body = submit_body(
            self.submitter,
            command,
            device=device,
            selector=selector,
            cwd=cwd,
            env=env,
            idempotency_key=idempotency_key,
            priority=priority,
            max_runtime_seconds=max_runtime_seconds,
            idle_timeout_seconds=idle_timeout_seconds,
            no_wait=no_wait,
            kind=kind,
            reason=reason,
            stdio=stdio,
            count=count,
            device_ids=device_ids,
            after=after,
            after_any=after_any,
        )
        try:
            resp = self._http.request("POST", "/v1/jobs", body=body, timeout=timeout)
        except errors.ApiError as e:
            raise submit_refusal(e) from e
        job: Json = shapes.normalise(resp.json(), shapes.JOB)
        return job

    def hold(
        self,
        *,
        ttl_seconds: int,
        reason: str,
        device: str = "",
        selector: str = "",
        count: int = 1,
        device_ids: Sequence[str] = (),
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> Json:
        """Submit a hold: a lease for a person, no command, ending at its TTL.

        ``ttl_seconds`` goes out as ``max_runtime_seconds`` and must be positive;
        ``reason`` must not be blank (a hold without one cannot be told from a leak); both raise ``ValueError`` before any request. Neither ``device`` nor
        ``selector`` means any device. A fresh idempotency key is sent
        unless one is given. Raises ``NoDeviceError`` on 409. End the hold
        early with ``kill``.
        """
        check_hold(ttl_seconds, reason)
        return self.submit(
            None,
            device=device,
            selector=selector,
            count=count,
            device_ids=device_ids,
            idempotency_key=idempotency_key,
            max_runtime_seconds=ttl_seconds,
            kind="hold",
            reason=reason,
            timeout=timeout,
        )

    def get_job(self, job_id: str, *, timeout: float | None = None) -> PolledJob:
        """One job with its queue position."""
        resp = self._http.request("GET", job_path(job_id), timeout=timeout)
        return parse_polled_job(resp.json(), resp.request)

    def kill(
        self, job_id: str, *, submitter: str | None = None, timeout: float | None = None
    ) -> None:
        """Cancel a queued job or stop a running one; ``NotCancellableError`` on 409."""
        body = {"submitter": self.submitter if submitter is None else submitter}
        try:
            self._http.request("POST", job_path(job_id) + "/kill", body=body, timeout=timeout)
        except errors.ApiError as e:
            raise kill_refusal(e) from e

    def jobs(
        self,
        *,
        device: str = "",
        limit: int = 0,
        state: str = "",
        submitter: str = "",
        timeout: float | None = None,
    ) -> list[Json]:
        """Job history, newest first: only non-empty filters are sent.

        More than one page (``JOBS_PAGE``, the controller's most) is read a page at a
        time, each asking for the jobs ``before`` the last one read; ``timeout``
        bounds each request.
        """
        found: list[Json] = []
        while True:
            asked = jobs_page_size(limit, len(found))
            before = str(found[-1].get("id") or "") if found else ""
            query = jobs_query(device, state, submitter, asked, before)
            data = self._http.request("GET", "/v1/jobs", query=query, timeout=timeout).json()
            if not add_jobs_page(found, data, asked) or len(found) >= limit:
                return found

    def resolve_job_id(self, given: str, *, timeout: float | None = None) -> str:
        """The full ID of the job ``given`` names: itself, or a unique prefix.

        A complete ID is used as given, without a request. Anything else must be at
        least ``MIN_ID_PREFIX`` characters and is looked up with ``id_prefix``: no match
        is ``not_found``; several raise ``JobIdError`` naming up to five of them.
        """
        query = prefix_query(given)
        if query is None:
            return given
        data = self._http.request("GET", "/v1/jobs", query=query, timeout=timeout).json()
        return pick_prefix_match(given, data)

    def resolve_job_ids(self, given: Sequence[str], *, timeout: float | None = None) -> list[str]:
        """``resolve_job_id`` of each, in order (``rc run --after``)."""
        return [self.resolve_job_id(g, timeout=timeout) for g in given]

    def follow_logs(
        self, job_id: str, *, follow: bool | None = None, offset: int = 0
    ) -> transport.Stream:
        """The job's stored output as an iterator of byte chunks; close it when done.

        ``follow=None`` sends no query (the route's default: replay, then follow until
        the job is terminal); ``True``/``False`` send ``?follow=``, ``False``
        being the snapshot that never waits. ``offset`` skips bytes already seen
        and is sent only when positive.
        """
        query = logs_query(follow=follow, offset=offset)
        return self._http.stream("GET", job_path(job_id) + "/logs", query=query)

    def output(
        self,
        job_id: str,
        *,
        reconnect: bool = True,
        on_break: Callable[[errors.ClientError], None] | None = None,
    ) -> Iterator[bytes]:
        """Follow the job's output to its end, resuming where a broken stream stopped.

        ``waits.StreamResume`` decides where a broken stream reopens and when breaks in
        a row give up (EXT-CLI-5; with ``reconnect=False`` the first break is final); ``on_break`` hears of each break. A refusal from the controller
        (``not_found``, ``logs_not_stored``) is final at once.
        """
        resume = StreamResume(reconnect=reconnect)
        while True:
            try:
                stream = self.follow_logs(job_id, offset=resume.offset)
                with stream:
                    for chunk in stream:
                        resume.delivered(chunk)
                        yield chunk
                return
            except errors.TransportError as e:
                if resume.broke():
                    raise
                if on_break is not None:
                    on_break(e)
                self._sleep(resume.pause)

    # ---- fleet -----------------------------------------------------------------------

    def state(self, *, timeout: float | None = None) -> Json:
        """Devices, active jobs and the queue (``GET /v1/state``)."""
        data: Json = self._http.request("GET", "/v1/state", timeout=timeout).json()
        out: Json = shapes.normalise(data, shapes.STATE)
        return out

    def explain(self, selector: str, *, timeout: float | None = None) -> Json:
        """What a selector matches right now, and this submitter's limit when one
        applies; submits nothing."""
        query = {"selector": selector, "submitter": self.submitter}
        data: Json = self._http.request("GET", "/v1/explain", query=query, timeout=timeout).json()
        out: Json = shapes.normalise(data, shapes.EXPLAIN)
        return out

    def describe(self, device_id: str, *, timeout: float | None = None) -> Json:
        """Everything about one device."""
        data: Json = self._http.request(
            "GET", device_path(device_id) + "/describe", timeout=timeout
        ).json()
        out: Json = shapes.normalise(data, shapes.DESCRIBE)
        return out

    def usage(
        self, since: str = "", by: str = "", limit: int = 0, *, timeout: float | None = None
    ) -> Json:
        """Who held what over a window (``GET /v1/usage``): ``since`` a
        duration (``7d``), ``by`` submitter, device or host, each the controller's
        default when empty; ``limit`` groups at most (0: the controller's default)."""
        ask = UsageAsk(since, by, limit)
        return ask.read(
            self._http.request("GET", ask.path, query=ask.query, timeout=timeout).json()
        )

    def whoami(self, *, timeout: float | None = None) -> Json:
        """The token's role, and its name when it has one."""
        data: Json = self._http.request("GET", "/v1/whoami", timeout=timeout).json()
        return data

    def clear(self, device_id: str, *, timeout: float | None = None) -> None:
        """(admin) Return a quarantined device to the pool."""
        self._http.request("POST", device_path(device_id, segment=True) + "/clear", timeout=timeout)

    def retire(self, device_id: str, *, timeout: float | None = None) -> Json:
        """(admin) Remove a device from the fleet; returns ``{"retired", "note"}``."""
        data: Json = self._http.request(
            "DELETE", device_path(device_id, segment=True), timeout=timeout
        ).json()
        return data

    def drain(self, device_id: str, reason: str = "", *, timeout: float | None = None) -> None:
        """(admin) Let a device finish what it runs and take nothing new."""
        self._http.request(
            "POST",
            device_path(device_id, segment=True) + "/drain",
            body={"submitter": self.submitter, "reason": reason},
            timeout=timeout,
        )

    def undrain(self, device_id: str, *, timeout: float | None = None) -> None:
        """(admin) Let a draining device take work again."""
        self._http.request(
            "POST", device_path(device_id, segment=True) + "/undrain", timeout=timeout
        )

    def wait_idle(
        self,
        device_ids: Sequence[str],
        *,
        on_wait: Callable[[list[Json]], None] | None = None,
    ) -> None:
        """Return once none of ``device_ids`` has a live lease (``rc drain --wait``).

        Polls ``/v1/state`` every ``POLL_INTERVAL``; there is no deadline of its own (the
        caller's Ctrl-C is one). ``on_wait`` hears the views still held whenever that set
        changes. A device that disappears (retired) counts as idle. ``SCHEDULED_GIVE_UP``
        consecutive failed polls give up with ``PollGiveUp``.
        """
        wanted = set(device_ids)
        failures = 0
        last: set[tuple[str, str]] | None = None
        while True:
            try:
                views = self.state(timeout=SCHEDULED_POLL_TIMEOUT).get("devices") or []
                failures = 0
            except errors.TransportError as e:  # a refusal (ApiError) is final at once
                failures += 1
                if failures >= SCHEDULED_GIVE_UP:
                    raise PollGiveUp(f"gave up waiting for devices to go idle: {e}") from e
                self._sleep(POLL_INTERVAL)
                continue
            held = [v for v in views if _view_id(v) in wanted and _leased(v)]
            if not held:
                return
            now = {(_view_id(v), str(v.get("job_id") or v.get("holder") or "")) for v in held}
            if now != last and on_wait is not None:
                on_wait(held)
            last = now
            self._sleep(POLL_INTERVAL)

    # ---- polling loops ---------------------------------------------------------------

    def wait_until_scheduled(
        self,
        job_id: str,
        *,
        on_position: Callable[[int], None] | None = None,
        deadline: float | None = None,
        on_view: Callable[[PolledJob], None] | None = None,
    ) -> Json:
        """Poll until the job leaves the queue and return it.

        ``on_position`` hears each new queue position while the job is queued;
        ``on_view`` hears every view polled while it is queued (what it waits for,
        EXT-WHY-2, can change while the position does not).
        ``deadline`` is a ``monotonic`` instant; passing it raises ``WaitTimeout``
        at once. Seventeen consecutive failed polls raise ``PollGiveUp``, which says
        nothing about the deadline. A returned job may be terminal without
        ever having started: the caller checks.
        """
        wait = UntilScheduled(job_id, deadline)
        last_position: int | None = None
        while True:
            bound = wait.timeout(self._monotonic())  # a passed deadline is no failed poll
            try:
                view = self.get_job(job_id, timeout=bound)
            except errors.ClientError as e:
                wait.failed(e)
            else:
                if wait.reached(view):
                    return view.job
                if view.queue_position != last_position:
                    last_position = view.queue_position
                    if on_position is not None:
                        on_position(view.queue_position)
                if on_view is not None:
                    on_view(view)
            self._sleep(wait.pause(self._monotonic()))

    def wait_until_terminal(self, job_id: str, *, bound: float | None = None) -> Json:
        """Poll until the job is terminal and return it.

        ``bound`` (seconds) caps the whole wait; passing it raises ``WaitTimeout``
        naming the bound, the job and its last known state. Six consecutive failed
        polls raise ``PollGiveUp`` naming the job and its last known state.
        """
        wait = UntilTerminal(job_id, bound, self._monotonic())
        while True:
            bound = wait.timeout(self._monotonic())  # a passed deadline is no failed poll
            try:
                view = self.get_job(job_id, timeout=bound)
            except errors.ClientError as e:
                wait.failed(e)
            else:
                if wait.reached(view):
                    return view.job
            self._sleep(wait.pause(self._monotonic()))
