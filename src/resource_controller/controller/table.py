"""Every route in one table, read by dispatch, the timer and OpenAPI: published is served."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from starlette.responses import Response

from resource_controller import wire
from resource_controller.controller import openapi
from resource_controller.controller.deps import Query, Route, RouteCall
from resource_controller.controller.routes import events, fleet, jobs, ops, tty, workers
from resource_controller.core.states import Role

WORKER, CLIENT, ADMIN = Role.WORKER, Role.CLIENT, Role.ADMIN
_CONNECTED = ("text/plain", "connected; the body carries nothing (TTY-011)")
_NO_DUPLEX = "store_error, or unsupported: no full-duplex stream (TTY-012)"
_LOOKUP = "store_error: the job could not be looked up (TTY-003)"


async def openapi_json(call: RouteCall) -> Response:
    """This document."""
    return Response(openapi.published(ROUTES), media_type="application/json")  # EXT-LIMITS-5


ROUTES: tuple[Route, ...] = (
    # Worker routes (§6).
    Route(
        "POST",
        "/v1/workers/register",
        WORKER,
        workers.register,
        body=wire.RegisterRequest,
        answer=wire.RegisterResponse,
    ),
    Route(
        "POST",
        "/v1/workers/{worker_id}/labels",
        WORKER,
        workers.push_labels,
        body=wire.LabelsPush,
        errors=(404,),
    ),
    Route(
        "GET",
        "/v1/workers/{worker_id}/assignments",
        WORKER,
        workers.assignments,
        answer=wire.AssignmentsResponse,
        empty={204: "nothing to do before the wait ran out"},
        query=(
            Query(
                "wait", "long-poll wait as a duration (e.g. 30s); honoured in (0, 1 min], else 30 s"
            ),
            Query(
                "have",
                "comma-separated IDs of the jobs the worker runs or still reports on; its"
                " running jobs not named are handed out again (their hand-out was lost)",
            ),
        ),
    ),
    Route(
        "POST",
        "/v1/workers/{worker_id}/heartbeat",
        WORKER,
        workers.heartbeat,
        body=wire.HeartbeatRequest,
        body_cap=workers.HEARTBEAT_CAP,
        body_what="heartbeat body",
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/logs",
        WORKER,
        workers.append_log,
        raw="a raw chunk of the job's output, at most 1 MiB (API-036)",
        errors=(404, 409, 413),
        failure="log_error: the job ID cannot name a log file, or the append failed (LOG-001)",
        query=(
            Query(
                "lease_epoch",
                "the sender's lease epoch; an old one is 409 stale_lease (EXT-EPOCH-3)",
            ),
        ),
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/status",
        WORKER,
        workers.status,
        body=wire.StatusReport,
        errors=(403, 404, 409),
    ),
    Route(
        "POST",
        "/v1/devices/{device_id}/fault",
        WORKER,
        workers.fault,
        body=wire.FaultReport,
        errors=(404,),
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/tty/out",
        WORKER,
        tty.worker_out,
        raw="the job's output, streamed for its life (TTY-012, TTY-032)",
        errors=(404, 409),
        failure=_NO_DUPLEX,
        text=_CONNECTED,
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/tty/in",
        WORKER,
        tty.worker_in,
        errors=(404, 409),
        failure=_LOOKUP,
        text=("application/x-ndjson", "operator input, streamed (TTY-001, TTY-031)"),
    ),
    # Client routes (§7).
    Route(
        "POST",
        "/v1/jobs",
        CLIENT,
        jobs.submit,
        body=wire.SubmitRequest,
        status=201,
        answer=wire.JobBody | wire.ArrayBody,
        errors=(409,),
    ),
    Route(
        "GET", "/v1/arrays/{array_id}", CLIENT, jobs.get_array, answer=wire.ArrayBody, errors=(404,)
    ),
    Route(
        "GET",
        "/v1/jobs",
        CLIENT,
        jobs.list_jobs,
        answer=wire.JobList,
        errors=(400,),
        query=(
            Query(
                "limit",
                "at most this many jobs, newest first (default 20)",
                schema={"type": "integer", "minimum": 1, "maximum": 200},
            ),
            Query("state", "only jobs in this state"),
            Query("device", "only jobs on this device"),
            Query("submitter", "only jobs of this submitter"),
            Query("id_prefix", "only jobs whose ID starts with this (EXT-CLI-7)"),
            Query(
                "before",
                "a job ID: only the jobs after it in this order, the next page of a listing;"
                " an unknown ID is 400",
            ),
        ),
    ),
    Route("GET", "/v1/jobs/{job_id}", CLIENT, jobs.get_job, answer=wire.JobView, errors=(404,)),
    Route(
        "POST",
        "/v1/jobs/{job_id}/kill",
        CLIENT,
        jobs.kill,
        body=wire.KillRequest,
        body_required=True,
        errors=(403, 404, 409),
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/logs",
        CLIENT,
        jobs.logs,
        errors=(400, 404),
        query=(
            Query(
                "follow",
                "true (the default): replay, then stream until the job ends; false: a snapshot",
                schema={"type": "string", "enum": ["true", "false"]},
            ),
            Query(
                "offset",
                "byte offset to start from (EXT-CLI-5); past the end a snapshot is empty",
                schema={"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
            ),
        ),
        text=("text/plain", "the stored output, raw bytes (API-049, LOG-003)"),
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/tty/out",
        CLIENT,
        tty.client_out,
        errors=(404, 409),
        failure=_LOOKUP,
        text=("application/octet-stream", "the job's output, streamed raw (TTY-001)"),
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/tty/in",
        CLIENT,
        tty.client_in,
        raw="operator input, streamed for the session's life (TTY-012, TTY-031)",
        errors=(404, 409),
        failure=_NO_DUPLEX,
        text=_CONNECTED,
    ),
    Route("GET", "/v1/devices", CLIENT, fleet.devices, answer=list[wire.DeviceView]),
    Route(
        "GET",
        "/v1/devices/{device_id}/describe",
        CLIENT,
        fleet.describe,
        answer=wire.Describe,
        errors=(404,),
    ),
    Route(
        "GET",
        "/v1/explain",
        CLIENT,
        fleet.explain,
        answer=wire.Explain,
        errors=(400,),
        query=(
            Query("selector", "the selector to explain (SEL-001)", required=True),
            Query(
                "submitter",
                "who asks: the answer then carries that submitter's limit, when one applies"
                " (EXT-SHARE-1)",
            ),
        ),
    ),
    Route("GET", "/v1/state", CLIENT, fleet.state, answer=wire.State),
    Route(
        "GET",
        "/v1/events",
        CLIENT,
        events.stream,
        query_token=True,
        query=(
            Query(
                "token",
                "the client token, read only when the Authorization header carries none "
                "(AUTH-004: for a browser EventSource)",
            ),
        ),
        text=(
            "text/event-stream",
            "server-sent events: `data: {kind, at, payload?}` frames and keepalives (EVT-002)",
        ),
    ),
    Route("GET", "/v1/whoami", CLIENT, fleet.whoami, answer=wire.Whoami),
    Route(
        "GET",
        "/v1/usage",
        CLIENT,
        fleet.usage,
        answer=wire.UsageBody,
        errors=(400,),
        query=(
            Query(
                "since",
                "the window: from the start of the hour that holds now minus this duration"
                " (units w, d, h, m, s: 7d, 36h, 1d12h) to now (EXT-ACCT-2)",
                schema={"type": "string", "default": "7d"},
            ),
            Query(
                "by",
                "what a group is (default submitter)",
                schema={"type": "string", "enum": ["submitter", "device", "host"]},
            ),
            Query(
                "limit",
                "at most this many groups, the largest first (default 1000); the total"
                " counts every one",
                schema={"type": "integer", "minimum": 1, "maximum": 1000},
            ),
        ),
    ),
    # Admin routes.
    Route("POST", "/v1/devices/{device_id}/clear", ADMIN, fleet.clear, errors=(409,)),
    Route(
        "POST",
        "/v1/devices/{device_id}/drain",
        ADMIN,
        fleet.drain,
        body=wire.DrainRequest,
        errors=(404,),
    ),
    Route("POST", "/v1/devices/{device_id}/undrain", ADMIN, fleet.undrain, errors=(404,)),
    Route(
        "DELETE",
        "/v1/devices/{device_id}",
        ADMIN,
        fleet.retire,
        answer=wire.Retired,
        errors=(404, 409),
    ),
    # Beside the API: operations, the document, the dashboard.
    Route(
        "GET",
        "/healthz",
        None,
        ops.healthz,
        examples={
            200: (
                "the store answered a read; leader: this controller runs the scheduler and"
                " the reaper (EXT-PG-8)",
                {"status": "ok", "leader": True},
            ),
            503: ("the store did not answer a read", {"status": "unavailable", "leader": False}),
        },
    ),
    Route(
        "GET",
        "/metrics",
        CLIENT,
        ops.scrape,
        text=("text/plain", "Prometheus text exposition format (EXT-METRICS-1)"),
    ),
    Route("GET", "/openapi.json", CLIENT, openapi_json, answer=dict[str, Any]),
    Route(
        "GET",
        "/",
        None,
        ops.index,
        text=("text/html", "the dashboard page, script and style inline (DASH-001)"),
    ),
)


class Found(NamedTuple):
    """What a request's method and path name: its route and the path's parameter, or
    (no route) the routes of the path under other methods, for a 405."""

    route: Route | None
    param: str
    others: list[Route]


class Table:
    """The routes by their path's segments, a template's parameter (it has one at most,
    the handler's ``param``) standing as None, so that ``find`` is a dict lookup or two."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        self._paths: dict[tuple[str | None, ...], list[Route]] = {}
        #: The segment positions some template has its parameter at.
        self._slots: list[int] = []
        for route in self.routes:
            parts = route.path.split("/")
            params = [i for i, part in enumerate(parts) if part.startswith("{")]
            if len(params) > 1:
                raise ValueError(f"{route.path}: a route takes one path parameter at most")
            key = tuple(None if i in params else part for i, part in enumerate(parts))
            self._paths.setdefault(key, []).append(route)
            self._slots += [i for i in params if i not in self._slots]

    def find(self, method: str, path: str) -> Found:
        """The route for ``method`` and ``path``, whose parameter matches one non-empty
        segment of the decoded path (API-007); a path with no parameter comes first."""
        segments = path.split("/")
        param = ""
        routes = self._paths.get(tuple(segments))
        for i in self._slots if routes is None else ():
            if i < len(segments) and segments[i]:
                routes = self._paths.get((*segments[:i], None, *segments[i + 1 :]))
                if routes is not None:
                    param = segments[i]
                    break
        for route in routes or ():
            if route.method == method:
                return Found(route, param, [])
        return Found(None, "", routes or [])
