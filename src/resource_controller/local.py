"""``rc up``: a controller and a worker for this machine in one process.

Tokens are generated on first start (mode 0600), the client side written to the user
config file, the devices what ``nvidia-smi`` lists (``devices: auto``) or
``slot0..slotN-1``. Stopping stops the worker first, so running jobs end ``killed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from resource_controller import heap, logfmt
from resource_controller.client import config as client_config
from resource_controller.client import config_write
from resource_controller.controller import serve as controller
from resource_controller.controller.deps import Services, Settings
from resource_controller.core.identity import as_name
from resource_controller.store import private
from resource_controller.worker import gpus

TOKENS_FILE = "up-tokens"
ROLES = ("worker", "client", "admin")


def default_data_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local/share")
    return Path(base) / "rc"


def load_or_create_tokens(data: Path) -> tuple[dict[str, str], bool]:
    """The role tokens of this local setup; True when they were generated just now."""
    path = data / TOKENS_FILE
    if path.exists():
        pairs = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        if all(pairs.get(r) for r in ROLES):
            return pairs, False
    tokens = {role: secrets.token_urlsafe(24) for role in ROLES}
    private.private_dir(data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{r}={tokens[r]}\n" for r in ROLES))
    return tokens, True


def tokens_env(tokens: dict[str, str], user: str | None = None) -> str:
    """``RC_TOKENS`` for the in-process controller; the client token carries the local
    user's name, so what this user submits is recorded under it."""
    if user is None:
        try:
            user = os.environ.get("USER") or getpass.getuser()
        except (OSError, KeyError):
            user = ""
    name = as_name(user)
    return ",".join(
        f"{tokens[r]}:{r}" + (f":{name}" if r == "client" and name else "") for r in ROLES
    )


def gpu_names() -> list[str]:
    """The devices ``nvidia-smi -L`` lists; empty when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", *gpus.LIST_ARGS],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    listed, _ = gpus.parse_list(out)
    return listed.device_names()


def say(log_format: str, message: str, level: str = "INFO") -> None:
    """``rc up``'s line for the person at the terminal (``logfmt.say``)."""
    logfmt.say(log_format, message, level, logger="rc.up")


#: How long ``rc up`` waits for its worker to register before giving up.
READY_TIMEOUT = 60.0
LOCK_FILE = "up.lock"


class NotReady(Exception):
    """The controller or the worker of ``rc up`` could not start."""


def lock_data_dir(data: Path) -> int:
    """Hold ``<data>/up.lock``: two ``rc up`` would share a database; ``NotReady`` for the second."""
    import fcntl

    private.private_dir(data)
    path = data / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
        os.close(fd)
        raise NotReady(
            f"data directory {data} is in use by another rc up{holder}: {exc.strerror}"
        ) from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def run(data: Path | None, addr: str, devices: int, force: bool, log_format: str = "text") -> int:
    """The whole ``rc up`` process; returns its exit status."""
    import logging

    logfmt.configure(log_format, logging.WARNING, "%(levelname)s %(name)s: %(message)s")
    data = data or default_data_dir()
    try:
        lock_fd = lock_data_dir(data)
    except (NotReady, OSError) as exc:
        say(log_format, str(exc), "ERROR")
        return 1
    try:
        return _run_locked(data, addr, devices, force, log_format)
    finally:
        os.close(lock_fd)


def _run_locked(data: Path, addr: str, devices: int, force: bool, log_format: str) -> int:
    try:
        tokens, fresh = load_or_create_tokens(data)
        env = tokens_env(tokens)
        svc = controller.open_services(data, env, Settings())
        host, port = controller.parse_addr(addr)
        sock = controller.bind(host, port)
    except (controller.ServeError, OSError) as exc:
        say(log_format, str(exc), "ERROR")
        return 1
    url = f"http://{host if host != '0.0.0.0' else '127.0.0.1'}:{sock.getsockname()[1]}"
    gpus = gpu_names()
    names = gpus or [f"slot{i}" for i in range(devices)]
    hostname = socket.gethostname()

    def ready(offered: list[str]) -> None:
        """Both halves are up: now the client settings and the banner."""
        update = config_write.update_client_config(url, tokens["client"], force)
        say(
            log_format,
            f"controller on {url} (data {data}); devices: "
            + ", ".join(f"{hostname}:{n}" for n in offered),
        )
        for line in settings_report(update, url):
            say(log_format, line)
        if fresh and log_format == "json":
            # Logs never carry a token: under JSON the file is named instead.
            say(log_format, f"admin token written to {data / TOKENS_FILE} (mode 0600)")
        elif fresh:
            say(log_format, f"admin token (also in {data / TOKENS_FILE}): {tokens['admin']}")
        say(log_format, dashboard_line(url, data / TOKENS_FILE, update.path))
        say(log_format, try_line(gpus=bool(gpus)))

    heap.settle()
    try:
        # The stock loop, not uvloop: the worker half runs on the loop ``rc worker``
        # runs on, so its pipes, terminals and child processes behave as tested there.
        asyncio.run(
            _main(
                svc,
                sock,
                url,
                tokens["worker"],
                hostname,
                names,
                data / "worker",
                ready,
                lambda line: say(log_format, line),
                gpus_listed=bool(gpus),
            )
        )
    except (NotReady, client_config.ClientConfigError) as exc:
        say(log_format, str(exc), "ERROR")
        return 1
    finally:
        svc.executor.shutdown(wait=True)
        svc.store.close()
    return 0


def dashboard_line(url: str, tokens_file: Path, client_file: Path) -> str:
    """Where the dashboard is, and which token its prompt wants (never the token itself)."""
    return (
        f"dashboard: {url}/ (paste the admin token from {tokens_file} to act on"
        f" anything, or the client token in {client_file} for your own jobs)"
    )


def try_line(*, gpus: bool) -> str:
    """A first command that works here: ``nvidia-smi`` only where there is one."""
    first = "rc run -- nvidia-smi" if gpus else "rc run -- hostname"
    return f"try:  {first}   |   rc devices   |   rc ps   (Ctrl-C stops)"


def settings_report(update: config_write.ClientConfigUpdate, url: str) -> list[str]:
    """What ``rc up`` did to the user config file, truthfully."""
    path = update.path
    lines = []
    if "controller" in update.written:
        lines.append(f"client settings written to {path}")
    else:
        other = update.kept.get("controller")
        if other == url:
            lines.append(f"client settings in {path} already point here")
        else:
            lines.append(
                f"{path} names another controller ({other}); kept it, so rc commands go"
                f" there: rc up --force replaces it, or RC_CONTROLLER={url} for one shell"
            )
    if "token" in update.kept and "controller" in update.written:
        lines.append(f"kept the token already in {path} (rc up --force replaces it)")
    if "token" in update.kept and update.kept.get("controller") == url:
        lines.append(
            f"kept the token already in {path}; if rc commands answer unauthorized,"
            " rc up --force replaces it"
        )
    return lines


async def _main(
    svc: Services,
    sock: socket.socket,
    url: str,
    token: str,
    host: str,
    names: list[str],
    state_dir: Path,
    ready: Callable[[list[str]], None] = lambda _names: None,
    tell: Callable[[str], None] = lambda _line: None,
    gpus_listed: bool = False,
) -> None:
    """Serve until stopped; ``gpus_listed``: ``devices: auto``."""
    from resource_controller.worker import agent as worker_agent
    from resource_controller.worker import config as worker_config

    server = controller.make_server(svc)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # First signal: stop in order. Second: the default action, at once.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_DFL)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="controller")
    agent: worker_agent.Agent | None = None
    working: asyncio.Task[None] | None = None
    try:
        deadline = loop.time() + READY_TIMEOUT
        while not server.started and not serving.done() and not stop.is_set():
            if loop.time() > deadline:
                raise NotReady(f"the controller did not start within {READY_TIMEOUT:g}s")
            await asyncio.sleep(0.01)
        if serving.done() and not server.started:
            raise NotReady(f"the controller could not start on {url}: {_task_error(serving)}")
        # The worker's outbox lives beside the controller's data, not in /var/lib.
        config = worker_config.make_config(
            url,
            [] if gpus_listed else names,
            token=token,
            host=host,
            state_dir=str(state_dir),
            devices_auto=gpus_listed,
        )
        agent = worker_agent.Agent(config)
        working = asyncio.create_task(agent.run(stop), name="worker")
        # The banner only once the worker has registered.
        while not agent.worker_id and not stop.is_set():
            if working.done():
                raise NotReady(f"the worker could not start: {_task_error(working)}")
            if serving.done():
                raise NotReady(f"the controller stopped: {_task_error(serving)}")
            if loop.time() > deadline:
                raise NotReady(f"the worker did not register within {READY_TIMEOUT:g}s")
            await asyncio.sleep(0.01)
        if not stop.is_set():
            ready([d.name for d in agent.devices])
            await asyncio.wait({working, serving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        if working is not None:
            with contextlib.suppress(Exception):
                await working
            if agent is not None:
                await _report_stop(svc, agent.stopped_jobs, tell)
        svc.hub.shutting_down.set()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving


#: After the worker stopped, how long the controller still answers, so that a client
#: blocked on one of the jobs it ended reads that job's end (clients poll every 0.5 s).
CLIENT_LINGER = 1.5


async def _report_stop(svc: Services, job_ids: list[str], tell: Callable[[str], None]) -> None:
    """Say what the stop did to the work, then let blocked clients read it."""
    ended = []
    for job_id in job_ids:
        try:
            ended.append(await svc.db(svc.store.views.job, job_id))
        except Exception as exc:  # the stop goes on; it says what it could not read
            tell(f"stopping: could not read job {job_id}: {exc}")
    if ended:
        jobs = ", ".join(f"{j.id} on {j.device_id} ({j.state})" for j in ended)
        tell(f"stopping: the worker ended {len(ended)} running job(s): {jobs}")
        await asyncio.sleep(CLIENT_LINGER)
    try:
        queued = await svc.db(svc.store.views.queued)
        active = [j for j in await svc.db(svc.store.views.active) if j.id not in job_ids]
    except Exception as exc:
        tell(f"stopping: could not read the queue: {exc}")
    else:
        if queued:
            tell(f"{len(queued)} queued job(s) wait for the next rc up")
        if active:
            names = ", ".join(f"{j.id} ({j.state})" for j in active)
            tell(f"{len(active)} job(s) handed to the worker as it stopped: {names}")
    tell("stopped")


def _task_error(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return str(exc) or type(exc).__name__ if exc is not None else "it stopped"
