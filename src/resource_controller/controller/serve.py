"""``rc serve``: start-up order, binding, signals and staged shutdown; every start-up failure is one
``rc: <message>`` line and exit 1, before a socket is bound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from resource_controller import crashpoints, heap, logfmt
from resource_controller.clock import Clock, SystemClock
from resource_controller.controller import app as app_module
from resource_controller.controller import sharelimits, webhooks
from resource_controller.controller.auth import Authenticator, TokenError, parse_tokens
from resource_controller.controller.deps import Services, Settings
from resource_controller.core import preempt, testtimings
from resource_controller.core.share import LIMIT_MAX, NO_LIMITS, SubmitterLimits
from resource_controller.errors import RcError
from resource_controller.store import engine, private
from resource_controller.store.facade import Store
from resource_controller.store.logrows import DatabaseLogStore
from resource_controller.store.logs import MIN_MAX_BYTES, JobLogs, LogStore

log = logging.getLogger("rc.controller")

GRACEFUL_SHUTDOWN = 5.0  #: seconds in-flight requests get after a stop signal


class ServeError(Exception):
    """The controller cannot start; the message is the one line printed."""


#: Names ``RC_TEST_TIMINGS`` may set, each a ``Settings`` field of the same name.
TEST_TIMINGS = ("sweep_interval", "grace", "unhealthy_after", "hold_off", "schedule_interval")
_INTERVALS = ("sweep_interval", "schedule_interval")  # zero would make a loop spin


def apply_test_timings(settings: Settings, raw: str | None) -> Settings:
    """``settings`` with the ``RC_TEST_TIMINGS`` overrides applied (a test hook only)."""
    try:
        changes: dict[str, Any] = testtimings.parse(raw, TEST_TIMINGS, positive=_INTERVALS)
    except testtimings.TestTimingsError as exc:
        raise ServeError(str(exc)) from None
    return dataclasses.replace(settings, **changes)


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``; an empty host means all interfaces."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ServeError(f"invalid --addr {addr!r}: expected host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


#: A peer that acknowledges nothing this long is gone: the kernel drops its connection.
PEER_SILENCE = 10
#: Keep-alive probing: first probe, interval, unanswered count (4 + 3 x 2 = PEER_SILENCE).
KEEPALIVE = (4, 2, 3)


def detect_dead_peers(sock: socket.socket) -> None:
    """Keep-alive and a user timeout on ``sock``, inherited by accepted connections: a
    vanished client sends no FIN, and its idle relay connection would look open forever."""
    idle, interval, count = KEEPALIVE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, PEER_SILENCE * 1000)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    detect_dead_peers(sock)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def open_services(
    data: Path,
    tokens_env: str | None,
    settings: Settings,
    clock: Clock | None = None,
    test_timings: str | None = None,
    database: str = "",
) -> Services:
    """Validate tokens (then the test hook), then create the data directory, the store
    (``database``, a PostgreSQL URL, else ``rc.db`` in it) and the log directory."""
    try:
        tokens = parse_tokens(tokens_env)
        settings = apply_test_timings(settings, test_timings)
        where = engine.check_database(database) if database else data / "rc.db"
        limits = share_limits(settings)
    except (TokenError, RcError, sharelimits.LimitsError) as exc:
        raise ServeError(str(exc)) from exc
    clock = clock or SystemClock()
    try:
        private.private_dir(data)
        store = Store(where, clock, priority_aging=settings.priority_aging)
        store.limits = limits
        store.preemption = preempt.Settings(bool(settings.preemption), settings.preempt_min_runtime)
        logs = open_logs(store, data, settings.max_log_bytes)
    except RcError as exc:
        if database:
            raise ServeError(str(exc)) from exc
        raise ServeError(f"open data directory {data}: {exc}") from exc
    except Exception as exc:
        # The driver error's own text, not SQLAlchemy's wrapper: SRV-011's one line ``rc: <error>``.
        why = getattr(exc, "orig", None) or exc
        raise ServeError(f"open data directory {data}: {why}") from exc
    return Services(
        store=store, logs=logs, clock=clock, auth=Authenticator(tokens), settings=settings
    )


def share_limits(settings: Settings) -> SubmitterLimits:
    """The submitter limits at start-up: the limits file when one is given,
    else ``--max-devices-per-submitter`` for everyone; ``LimitsError`` naming the line."""
    if settings.limits_file:
        return sharelimits.load(settings.limits_file, settings.max_devices_per_submitter)
    if settings.max_devices_per_submitter:
        return SubmitterLimits(default=settings.max_devices_per_submitter)
    return NO_LIMITS


def open_logs(store: Store, data: Path, max_bytes: int) -> JobLogs:
    """Job output: in the database when controllers may share it, else under ``<data>/logs``."""
    if store.database_url is not None:
        return DatabaseLogStore(store.database_url, max_bytes)
    return LogStore(data / "logs", max_bytes)


class Server(uvicorn.Server):
    """A uvicorn server whose stop signal also ends long polls and log follows at once."""

    def __init__(self, config: uvicorn.Config, svc: Services) -> None:
        super().__init__(config)
        self.svc = svc

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        with contextlib.suppress(RuntimeError):  # no loop running
            asyncio.get_running_loop().call_soon_threadsafe(self.svc.hub.shutting_down.set)
        super().handle_exit(sig, frame)


def make_server(svc: Services) -> Server:
    config = uvicorn.Config(
        app_module.create_app(svc),
        log_level="warning",
        # uvicorn's own messages go through the root handler, in the chosen format.
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN),
        timeout_keep_alive=75,
        http="httptools",
        loop="none",
    )
    return Server(config, svc)


def policy(
    priority_aging: float,
    log_retention: float,
    max_log_bytes: int,
    max_devices_per_submitter: int | None = None,
    preemption: str = "on",
    preempt_min_runtime: float = preempt.MIN_RUNTIME,
    preempt_grace: float = preempt.GRACE,
) -> dict[str, int]:
    """``rc serve``'s policy flags as ``Settings``, or ``ValueError`` naming the flag."""
    if preemption not in ("on", "off"):
        raise ValueError(f"--preemption must be on or off, got {preemption!r}")
    limit = max_devices_per_submitter
    if limit is not None and not 1 <= limit <= LIMIT_MAX:
        raise ValueError(
            f"--max-devices-per-submitter must be a number of devices in 1..{LIMIT_MAX}"
            f" (leave it out for no limit), got {limit}"
        )
    for flag, seconds in (("--priority-aging", priority_aging), ("--log-retention", log_retention)):
        if 0 < seconds < 1:
            raise ValueError(f"{flag} must be 0 (off) or at least 1s, got {seconds:g}s")
    if 0 < max_log_bytes < MIN_MAX_BYTES or max_log_bytes < 0:
        raise ValueError(
            f"--max-log-bytes must be 0 (no cap) or at least {MIN_MAX_BYTES} bytes (4KiB),"
            f" got {max_log_bytes}"
        )
    return {
        "priority_aging": int(priority_aging),
        "log_retention": int(log_retention),
        "max_log_bytes": max_log_bytes,
        "max_devices_per_submitter": limit or 0,
        "preemption": int(preemption == "on"),
        "preempt_min_runtime": int(preempt_min_runtime),
        "preempt_grace": int(preempt_grace),
    }


WEBHOOK_ENV = "RC_WEBHOOK_URL"


def webhook_url(flag: str, environ: dict[str, str] | None = None) -> str:
    """The flag wins; empty, ``RC_WEBHOOK_URL``; both empty, no notifier.
    ``ServeError`` for a URL that cannot be posted to (``webhooks.check_url``)."""
    env = os.environ if environ is None else environ
    url = flag or env.get(WEBHOOK_ENV, "")
    if url and (problem := webhooks.check_url(url, env)):
        raise ServeError(problem)
    return url


def run(
    addr: str,
    data: Path,
    retain: bool,
    webhook: str = "",
    log_format: str = "text",
    database: str = "",
    limits_file: str = "",
    **policy: int,
) -> int:
    """The whole ``rc serve`` process; its exit status."""
    logfmt.configure(log_format, logging.INFO)
    # Events at the default level, not migration steps or requests.
    for name in ("alembic", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        svc = open_services(
            data,
            os.environ.get("RC_TOKENS"),
            Settings(
                retain_disconnected_jobs=retain,
                webhook_url=webhook_url(webhook),
                limits_file=limits_file,
                **policy,
            ),
            test_timings=os.environ.get(testtimings.VARIABLE),
            database=database,
        )
        crashpoints.arm(os.environ.get(crashpoints.VARIABLE))  # a test hook only
        host, port = parse_addr(addr)
        sock = bind(host, port)
    except (ServeError, crashpoints.CrashPointError) as exc:
        logfmt.say(log_format, str(exc), "ERROR", logger="rc.serve")
        return 1
    # Our no-op handlers are what uvicorn restores, so a clean stop exits 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    if svc.settings.webhook_url:
        log.info("event webhook configured url=%s", svc.settings.webhook_url)
    if svc.store.limits.on:
        log.info("submitter limits: %s", sharelimits.describe(svc.store.limits))
    log.info("controller listening addr=%s data=%s", addr, data)
    server = make_server(svc)
    heap.settle()
    try:
        _run_loop(server.serve(sockets=[sock]))
    finally:
        svc.executor.shutdown(wait=True)
        svc.store.close()
    return 0


def _run_loop(main: object) -> None:
    try:
        import uvloop

        uvloop.run(main)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]
