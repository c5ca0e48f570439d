"""``rc mcp``: an MCP server on stdio, each tool one call of the Python API, so rules match ``rc``'s.

The SDK is an optional extra imported only at start; the install advice uses the
Python running ``rc``, since a bare ``pip`` is often another interpreter's.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from resource_controller import errors
from resource_controller.cli import common, render
from resource_controller.cli.common import CONTEXT_SETTINGS

#: Exit code when the SDK is missing: a usage problem of the installation, not of a job.
EXIT_NO_SDK = 1
NO_SDK = "rc mcp needs the MCP SDK, which is an optional extra"
#: Bytes of output a ``run`` or ``logs`` answer carries by default: the tail.
TAIL_BYTES = 8000
HOLD_WAIT = 300.0

_F = TypeVar("_F", bound=Callable[..., Any])

#: The identity for this server's submits and kills (``--as``), set once at start.
_submitter: str | None = None


def checkout_root() -> Path | None:
    """The source checkout this ``rc`` runs from (an editable install), or ``None``."""
    import resource_controller

    package = Path(resource_controller.__file__).resolve().parent
    root = package.parent.parent
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def install_advice() -> str:
    """The forms that work before the package is published come first."""
    from resource_controller import version

    pip = f"{shlex.quote(sys.executable)} -m pip install"
    root = checkout_root()
    checkout = shlex.quote(f"{root if root else '<checkout>'}[mcp]")
    number = version.installed_version(default="<version>")
    wheel = shlex.quote(f"dist/resource_controller-{number}-py3-none-any.whl[mcp]")
    return (
        f"from a checkout of the source: {pip} -e {checkout};"
        f" from a wheel built from it (python -m build): {pip} {wheel};"
        f" from a package index that has it: {pip} 'resource-controller[mcp]'"
    )


def _client() -> Any:
    from resource_controller.client.sync import Client

    return Client(submitter=_submitter)


def _tail(data: bytes, limit: int) -> dict[str, Any]:
    limit = max(0, limit)
    cut = data[-limit:] if limit else b""
    return {
        "output": cut.decode("utf-8", "replace"),
        "output_bytes": len(data),
        "truncated": len(cut) < len(data),
    }


def _job(job: Any) -> dict[str, Any]:
    """The fields an agent acts on, from a ``JobInfo``."""
    out: dict[str, Any] = {
        "job_id": job.id,
        "state": job.state,
        "kind": job.kind,
        "device_id": job.device_id,
        "device_ids": list(job.device_ids),
        "submitter": job.submitter,
    }
    if job.exit_code is not None:
        out["exit_code"] = job.exit_code
    for key in ("kill_reason", "reason", "lease_epoch", "queue_position", "waiting_for"):
        if getattr(job, key):
            out[key] = getattr(job, key)
    if job.after:  # EXT-SHARE-2
        out["after"] = list(job.after)
        if job.after_any:
            out["after_any"] = True
    return out


def _device(d: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": d.id, "state": d.state, "free": d.free, "labels": d.label_map}
    for key in ("holder", "job_id", "kind", "reason", "quarantine_reason"):
        if getattr(d, key):
            out[key] = getattr(d, key)
    if d.draining:
        out["draining"] = True
    if d.max_runtime_seconds:
        out["max_runtime_seconds"] = d.max_runtime_seconds
    return out


def devices() -> list[dict[str, Any]]:
    """List every device: id, state, whether it is free, its labels, and who holds it."""
    with _client() as c:
        return [_device(d) for d in c.devices()]


def describe(device_id: str) -> dict[str, Any]:
    """Everything about one device (host:name): labels, holder, usage sheet, recent jobs."""
    with _client() as c:
        d = c.describe(device_id)
    out = _device(d.device)
    out["heartbeat_age_seconds"] = d.device.heartbeat_age_seconds
    if d.sheet:
        out["sheet"] = d.sheet
    out["recent_jobs"] = [_job(j) for j in d.recent_jobs]
    return out


def explain(selector: str) -> dict[str, Any]:
    """Which devices a label selector (e.g. 'vram>=40G') matches now, which are free, and
    how many queued jobs compete for them. Submits nothing."""
    with _client() as c:
        e = c.explain(selector)
    out: dict[str, Any] = {
        "selector": e.selector,
        "matching": e.matching,
        "free": e.free,
        "queue_depth": e.queue_depth,
    }
    if e.hint:
        out["hint"] = e.hint  # nothing matches: what the devices have for its keys
    if e.submitter_limit is not None:  # EXT-SHARE-1
        out.update(
            submitter=e.submitter,
            submitter_limit=e.submitter_limit,
            submitter_held=e.submitter_held,
        )
    return out


def run(
    argv: list[str],
    select: str = "",
    device: str = "",
    count: int = 1,
    env: dict[str, str] | None = None,
    cwd: str = "",
    timeout_seconds: float = 0,
    max_runtime_seconds: int = 0,
    tail_bytes: int = TAIL_BYTES,
    after: list[str] | None = None,
    after_any: bool = False,
) -> dict[str, Any]:
    """Run a command on a device and wait for it to finish, like `rc run`. With neither
    device nor select, any device will do. Waits in the queue while devices are busy;
    timeout_seconds > 0 gives up queueing after that long (the job is cancelled).
    max_runtime_seconds caps the run itself. after: job IDs (or 6+ character prefixes)
    to wait for; it starts once all succeeded (after_any: once all ended), and ends
    killed with kill_reason 'dependency_failed: <job>' if one fails. Returns exit_code
    (what `rc run` exits with: 0 success, the job's code, 1 for a job that ended without
    one) and the output's tail."""
    sink = bytearray()
    limit = max(0, tail_bytes)
    total = 0

    def keep(chunk: bytes) -> None:
        nonlocal total
        total += len(chunk)
        sink.extend(chunk)
        if len(sink) > limit:
            del sink[: len(sink) - limit]

    where = _where(select, device, count, env, cwd, max_runtime_seconds, after, after_any)
    with _client() as c:
        result = c.run(argv, **where, timeout=timeout_seconds or None, on_output=keep)
    out = {"exit_code": result.exit_code, **_job(result.job)}
    out["exit_code"] = result.exit_code
    out["job_exit_code"] = result.job.exit_code
    out.update(_tail(bytes(sink), limit), output_bytes=total, truncated=total > len(sink))
    return out


def _where(
    select: str,
    device: str,
    count: int,
    env: dict[str, str] | None,
    cwd: str,
    max_runtime_seconds: int,
    after: list[str] | None,
    after_any: bool,
) -> dict[str, Any]:
    """What ``run`` and ``submit`` ask for, as ``Client.submit`` takes it."""
    return {
        "select": select,
        "device": device,
        "count": count,
        "env": env,
        "cwd": cwd,
        "max_runtime": max_runtime_seconds or None,
        "after": after or None,
        "after_any": after_any,
    }


def submit(
    argv: list[str],
    select: str = "",
    device: str = "",
    count: int = 1,
    env: dict[str, str] | None = None,
    cwd: str = "",
    max_runtime_seconds: int = 0,
    after: list[str] | None = None,
    after_any: bool = False,
) -> dict[str, Any]:
    """Start a command on a device without waiting for it; returns its job_id and state
    (queued while devices are busy). after: job IDs (or prefixes) it waits for, as in
    run; a pipeline is submit after submit, each naming the one before. Read its output
    with logs, stop it with kill."""
    where = _where(select, device, count, env, cwd, max_runtime_seconds, after, after_any)
    with _client() as c:
        return _job(c.submit(argv, **where))


def logs(job_id: str, wait_seconds: float = 0, tail_bytes: int = TAIL_BYTES) -> dict[str, Any]:
    """A job's state and the tail of its stored output. wait_seconds > 0 first waits up
    to that long for the job to finish (done tells whether it did)."""
    with _client() as c:
        job = c.job(job_id)
        if wait_seconds > 0 and not job.terminal:
            try:
                job.wait(timeout=wait_seconds)
            except errors.ClientError:
                job.refresh()
        data = job.output()
    return {**_job(job), "done": job.terminal, **_tail(data, tail_bytes)}


def kill(job_id: str) -> dict[str, Any]:
    """Cancel a queued job or stop a running one (only your own, unless the token is
    admin). A running job ends shortly after, not at once."""
    with _client() as c:
        c.kill(job_id)
        return {**_job(c.job(job_id)), "kill_requested": True}


def hold(
    ttl_seconds: int,
    reason: str,
    select: str = "",
    device: str = "",
    count: int = 1,
    timeout_seconds: float = HOLD_WAIT,
) -> dict[str, Any]:
    """Hold a device for yourself with no command (like `rc hold`) until ttl_seconds pass
    or you release it. Waits up to timeout_seconds while devices are busy (then gives up
    and cancels). Returns the hold's job_id, device_ids, cuda_visible_devices and the
    lease epoch. Always release it when done."""
    from resource_controller.client.models import LeaseInfo

    with _client() as c:
        job = c.hold(
            ttl=ttl_seconds,
            reason=reason,
            select=select,
            device=device,
            count=count,
            timeout=timeout_seconds or None,
        )
        uuids = c._mig_uuids(job.device_ids)
    lease = LeaseInfo.from_job(job, uuids)
    return {
        **_job(job),
        "cuda_visible_devices": lease.cuda_visible_devices,
        "epoch": lease.epoch,
        "ttl_seconds": lease.ttl_seconds,
    }


def usage(since: str = "7d", by: str = "submitter") -> dict[str, Any]:
    """Who held the devices over the last `since` (e.g. '7d', '36h', '2w'), one entry per
    submitter, device or host (`by`), largest first: jobs, device_hours, gpu_hours
    (weighted by measured GPU utilisation, absent where none was measured) and share of
    the window's device-hours; plus the total."""
    with _client() as c:
        u = c.usage(since, by)
    out: dict[str, Any] = {
        "by": u.by,
        "since": u.raw.get("since"),
        "until": u.raw.get("until"),
        "groups": u.raw.get("groups") or [],
        "total": u.raw.get("total") or {},
    }
    if u.more:
        out["more"] = u.more
    return out


def release(job_id: str) -> dict[str, Any]:
    """End a hold (or any job of yours) early and give the device back."""
    with _client() as c:
        c.release(job_id)
        return {**_job(c.job(job_id)), "released": True}


TOOLS: Mapping[str, Callable[..., Any]] = {
    "devices": devices,
    "describe": describe,
    "explain": explain,
    "run": run,
    "submit": submit,
    "logs": logs,
    "kill": kill,
    "hold": hold,
    "release": release,
    "usage": usage,
}


def _as_tool_error(fn: _F, tool_error: type[Exception]) -> _F:
    """Turn the project's errors into tool errors the agent reads (code first)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (errors.RcError, ValueError, TypeError) as e:
            raise tool_error(str(e)) from e

    return call  # type: ignore[return-value]


def build_server() -> Any:
    """The MCP server with every tool registered; imports the SDK (``ImportError`` without)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from resource_controller.cli.main import installed_version

    server = MCPServer(
        name="resource-controller",
        version=installed_version(),
        instructions=(
            "Exclusive leases on shared devices (GPUs). Use run to execute a command on a"
            " device and get its exit code and output; submit+logs for long jobs; hold and"
            " release to keep a device for yourself. Give back what you take."
        ),
        log_level="WARNING",
    )
    for name, fn in TOOLS.items():
        server.add_tool(_as_tool_error(fn, ToolError), name=name)
    return server


@click.command(
    "mcp",
    cls=common.RcCommand,
    context_settings=CONTEXT_SETTINGS,
    short_help="Serve the rc tools to an AI agent over MCP (stdio).",
)
@common.as_option()
def mcp(as_: str) -> None:
    """Run a Model Context Protocol server on stdin/stdout for an AI agent.

    Tools: devices, describe, explain, run, submit, logs, kill, hold, release, usage. They use
    the same controller, token and submitter as rc (RC_CONTROLLER, RC_TOKEN,
    RC_SUBMITTER, the config file), so the agent can end only its own jobs unless the
    token is admin.

    Needs the optional extra mcp, installed into the Python that runs rc, from a
    checkout (make install puts it in .venv), a wheel built from one, or a package
    index that has the package:

    \b
      pip install -e '.[mcp]'
      pip install 'dist/resource_controller-VERSION-py3-none-any.whl[mcp]'
      pip install 'resource-controller[mcp]'

    \b
    Example client configuration:
      {"command": "rc", "args": ["mcp"]}
    """
    global _submitter
    _submitter = as_ or None
    try:
        server = build_server()
    except ImportError as e:
        render.say(f"{NO_SDK} ({e}); install it into this rc's Python, {install_advice()}")
        raise SystemExit(EXIT_NO_SDK) from e
    from resource_controller.cli import signals

    signals.restore_defaults()  # the SDK's own loop handles an interrupt (EOF or ^C)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        raise SystemExit(130) from None
