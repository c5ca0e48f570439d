"""Job commands (CLI §5-10) and ``rc run --explain``'s report; no request before a failing check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from resource_controller import errors
from resource_controller.cli import common, render, signals
from resource_controller.cli.common import CONTEXT_SETTINGS

if TYPE_CHECKING:
    # Loaded by _client: ``rc run --help`` and the other help pages make no request.
    from resource_controller.client import api

EXIT_INTERRUPTED = 130


def _client(as_flag: str = "") -> api.JsonClient:
    """A client for this invocation; its submitter is resolved once, on first use."""
    from resource_controller.client import api

    return api.JsonClient(submitter=as_flag or None)


def explain(client: api.JsonClient, selector: str, count: int = 1) -> None:
    """With ``--count`` hosts come from the route's ``matching``, never redone here."""
    data = client.explain(selector)
    matching = list(data.get("matching") or [])
    free = set(data.get("free") or [])
    lines = [f"selector: {data.get('selector', selector)}\n"]
    if matching:
        lines.append(f"matching ({len(matching)}):\n")
        lines.extend(f"  {dev}  {'free' if dev in free else 'busy'}\n" for dev in matching)
    else:
        lines.append("matching: (no device matches this selector)\n")
    lines.append(f"free: {len([d for d in matching if d in free])}/{len(matching)}\n")
    lines.append(f"queue depth: {data.get('queue_depth', 0)}\n")
    hosts = _hosts_with(matching, free, count) if count > 1 else {}
    if count > 1:
        held = ", ".join(f"{host} ({n} free)" for host, n in hosts.items()) or "none"
        lines.append(f"hosts with {count} matching: {held}\n")
    lines.extend(_limit_lines(data, count))
    render.out("".join(lines))
    if not matching:
        # Stdout keeps CLI-102's format; what the devices have goes on the failure line.
        hint = data.get("hint")
        detail = f": {hint}" if isinstance(hint, str) and hint else ""
        raise common.Failure(f"no device matches this selector{detail}")
    if count > 1 and not hosts:
        raise common.Failure(f"no host has {count} devices that match this selector")


def _limit_lines(data: api.Json, count: int) -> list[str]:
    """EXT-SHARE-1: this submitter's limit, and whether ``count`` devices would wait for it."""
    limit, name = data.get("submitter_limit"), str(data.get("submitter") or "")
    if not isinstance(limit, int) or isinstance(limit, bool):
        return []
    held = data.get("submitter_held")
    held = held if isinstance(held, int) and not isinstance(held, bool) else 0
    lines = [f"limit: {limit} devices for {name}, {held} held\n"]
    if count > limit:
        lines.append(
            f"submitter_limit: {count} devices is more than the limit; a submit is refused\n"
        )
    elif held + count > limit:
        from resource_controller.core import waiting

        lines.append(
            f"submitter_limit: {waiting.limit_text(limit, name)}; a job would queue until"
            " some of them end\n"
        )
    return lines


def _hosts_with(matching: list[str], free: set[str], count: int) -> dict[str, int]:
    """Hosts with at least ``count`` of the matching devices -> how many of them are free."""
    per_host: dict[str, list[str]] = {}
    for dev in matching:
        per_host.setdefault(dev.split(":", 1)[0], []).append(dev)
    return {
        host: sum(d in free for d in devs)
        for host, devs in sorted(per_host.items())
        if len(devs) >= count
    }


def _kill(given: str, as_: str, verb: str) -> None:
    client = _client(as_)
    job_id = client.resolve_job_id(given)  # EXT-CLI-7
    try:
        client.kill(job_id)
    except errors.NotCancellableError as e:
        raise common.Failure(f"not_cancellable: {e}") from e
    if verb == "kill":
        render.say(f"kill requested for {job_id}")
    else:
        render.say(f"released {job_id}")


@click.command("kill", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("job_id")
@common.as_option()
def kill(job_id: str, as_: str) -> None:
    """Cancel a queued job, or have its worker stop a running one (owner or admin).

    JOB_ID may be a unique prefix of at least 6 characters. Only the job's submitter
    (the same --as, RC_SUBMITTER or derived identity) or an admin token may kill it;
    anyone else gets not_job_owner. A running job is stopped by its worker shortly
    after this returns. A job that already finished is not_cancellable (exit 1).
    """
    _kill(job_id, as_, "kill")


@click.command("release", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("job_id")
@common.as_option()
def release(job_id: str, as_: str) -> None:
    """End a hold (or any job) early; the same operation as kill.

    JOB_ID may be a unique prefix of at least 6 characters; the hold's ID is printed
    when it is granted. The same ownership rule as rc kill applies.
    """
    _kill(job_id, as_, "release")


def _copy_stream(chunks: Any) -> None:
    with chunks:
        for chunk in chunks:
            render.write_bytes(chunk)


@click.command("attach", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("job_id")
def attach(job_id: str) -> None:
    """Re-stream a job's output from the start, following it until the job ends.

    Read-only: it holds nothing and never affects the job. Exits 0 when the stream
    ends, whatever the job's outcome (use rc jobs for that); Ctrl-C exits 130.
    JOB_ID may be a unique prefix of at least 6 characters.
    """
    client = _client()
    try:
        _copy_stream(client.follow_logs(client.resolve_job_id(job_id)))  # EXT-CLI-7
    except signals.Interrupted:
        raise SystemExit(EXIT_INTERRUPTED) from None


@click.command("logs", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.option("-f", "--follow", is_flag=True, help="Replay, then follow until the job ends.")
@click.argument("job_id")
def logs(follow: bool, job_id: str) -> None:
    """Print a job's stored output (exactly the stored bytes).

    Without -f, the bytes stored so far, at once; with -f, all of them and then new
    output until the job ends. JOB_ID may be a unique prefix of at least 6
    characters.
    """
    client = _client()
    try:
        job_id = client.resolve_job_id(job_id)  # EXT-CLI-7
        view = client.get_job(job_id)
        if view.job.get("stdio") in ("tty", "pipe"):
            raise common.Failure("logs_not_stored: logs are not stored for attached jobs")
        _copy_stream(client.follow_logs(job_id, follow=follow))
    except signals.Interrupted:
        if follow:
            raise SystemExit(EXIT_INTERRUPTED) from None
        raise


#: 50 pages of ``api.JOBS_PAGE``: a long history, but not all of it on a typo.
MAX_LISTED = 10_000


@click.command("jobs", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.option(
    "-n",
    "--limit",
    type=common.INT,
    default=None,
    help=f"Max jobs, 1..{MAX_LISTED} (0: the controller's default; 20 unless --array).",
)
@click.option("--device", default="", help="Exact device ID.")
@click.option("--submitter", default="", help="Exact submitter.")
@click.option("--state", default="", help="Exact state (queued, running, failed, ...).")
@click.option("--array", "array_id", default="", help="Only this array's tasks, in index order.")
@click.option("-o", "--output", default="text", help="text or json (one line).")
def jobs(
    limit: int | None, device: str, submitter: str, state: str, array_id: str, output: str
) -> None:
    """Search job history fleet-wide, newest first, finished jobs included.

    Filters combine: --device and --submitter match exactly; --state is one of
    queued, assigned, running, succeeded, failed, killed, lost. -n takes
    1..10000 (0: the controller's default, 20); past 200 the history is read a page
    at a time. -o json prints the controller's job objects on one line, each with
    its exit_code and kill_reason when it has them. --array ID lists that array's
    tasks in index order (every one unless -n is given; the filters apply to them).
    """
    fmt = common.output_format(output)
    if state:
        common.check_job_state(state)
    if limit is not None and not 0 <= limit <= MAX_LISTED:
        raise click.UsageError(
            f"-n must be in 1..{MAX_LISTED} (0: the controller's default, 20), got {limit}"
        )
    if array_id:
        _array_tasks(array_id, limit or 0, device, submitter, state, fmt)
        return
    limit = 20 if limit is None else limit
    found = _client().jobs(device=device, limit=limit, state=state, submitter=submitter)
    if fmt == "json":
        render.out(render.json_compact(found))
        return
    from resource_controller.cli import timefmt

    now = timefmt.utc_now()
    rows = [["JOB", "DEVICE", "STATE", "SUBMITTER", "STARTED", "DURATION", "COMMAND"]]
    for job in found:
        started = timefmt.parse(job.get("started_at"))
        finished = timefmt.parse(job.get("finished_at"))
        duration = "-"
        if started is not None:
            duration = timefmt.compact_between(started, finished or now)
        cells = [
            job.get("id") or "",
            common.devices_text(job),
            _state_cell(job),
            job.get("submitter") or "",
            timefmt.rfc3339(started) if started is not None else "",
            duration,
            render.command_text(job.get("command")),
        ]
        rows.append([cell or "-" for cell in cells])
    render.out(render.table(rows))


def _array_tasks(
    array_id: str, limit: int, device: str, submitter: str, state: str, fmt: str
) -> None:
    """EXT-ARRAY-3: an array's tasks, as ``GET /v1/arrays/{id}`` lists them."""
    view = _client().get_array(array_id)
    if submitter and view.get("submitter") != submitter:
        tasks = []
    else:
        tasks = [
            t
            for t in view.get("tasks") or []
            if (not state or t.get("state") == state)
            and (not device or t.get("device_id") == device)
        ]
    tasks = tasks[:limit] if limit else tasks
    if fmt == "json":
        render.out(render.json_compact(tasks))
        return
    rows = [["INDEX", "JOB", "DEVICE", "STATE", "EXIT"]]
    for t in tasks:
        code = t.get("exit_code")
        cells = [str(t.get("index")), t.get("id"), t.get("device_id"), t.get("state")]
        rows.append([str(c or "-") for c in cells] + ["-" if code is None else str(code)])
    render.out(render.table(rows))


def _state_cell(job: api.Json) -> str:
    state = str(job.get("state") or "")
    reason = job.get("kill_reason")
    return f"{state} ({reason})" if reason else state


@click.command(
    "ps",
    cls=common.RcCommand,
    context_settings={**CONTEXT_SETTINGS, "allow_extra_args": True},
)
@click.option("--tasks", is_flag=True, help="List each task of an array as a job of its own.")
@click.option("-o", "--output", default="text", help="text or json (one line).")
def ps(tasks: bool, output: str) -> None:
    """Active jobs, then the queue with per-device positions and what each waits for.

    The queue is how to find a waiting job's ID, to rc kill it. An array is one line
    with its counts (rc kill ARRAY_ID ends its tasks; --tasks lists them instead).
    -o json prints the controller's job objects on one line, in the table's order,
    each queued one with its waiting_for when the controller tells.
    """
    fmt = common.output_format(output)  # before any request, as rc jobs
    client = _client()
    state = client.state()
    # A WAITING FOR column only when the controller tells; otherwise the base table.
    waits = state.get("queued_waiting_for")
    if fmt == "json":
        render.out(render.json_compact(_ps_objects(state, waits)))
        return
    why = isinstance(waits, dict) and bool(waits)
    rows = [["JOB", "DEVICE", "STATE", "SUBMITTER", "COMMAND", *(["WAITING FOR"] if why else [])]]
    arrays: dict[str, api.Json] = {}  # array -> its first task listed
    for job in state.get("jobs") or []:
        if not tasks and job.get("array_id"):
            arrays.setdefault(str(job["array_id"]), job)
            continue
        rows.append(_ps_row(job, str(job.get("state") or ""), *([""] if why else [])))
    counters: dict[str, int] = {}
    for job in state.get("queued") or []:
        if not tasks and job.get("array_id"):
            arrays.setdefault(str(job["array_id"]), job)
            continue
        device = common.devices_text(job)
        counters[device] = counters.get(device, 0) + 1
        extra = [_waiting_cell(job, waits)] if why else []
        rows.append(_ps_row(job, f"queued (#{counters[device]})", *extra))
    if arrays:
        from resource_controller.cli.arrayrun import status_text
    for array_id, first in arrays.items():
        view = client.get_array(array_id)
        progress = status_text(view.get("counts") or {}, int(view.get("size") or 0))
        row = [array_id, "-", f"array {view.get('spec')}: {progress}"]
        rows.append(row + _ps_row(first, "")[3:] + ([""] if why else []))
    render.out(render.table(rows))


def _ps_objects(state: api.Json, waits: Any) -> list[api.Json]:
    """Active jobs first, then the queue in scheduling order."""
    found: list[api.Json] = list(state.get("jobs") or [])
    for job in state.get("queued") or []:
        entries = waits.get(str(job.get("id") or "")) if isinstance(waits, dict) else None
        found.append({**job, "waiting_for": entries} if isinstance(entries, list) else job)
    return found


def _waiting_cell(job: api.Json, waits: Any) -> str:
    """What a queued job waits for, short; empty when the controller said nothing."""
    from resource_controller.core import waiting

    entries = waits.get(str(job.get("id") or "")) if isinstance(waits, dict) else None
    if not isinstance(entries, list):
        return ""
    pinned = not job.get("selector") and bool(job.get("device_id"))
    return waiting.cell(waiting.blockers_from_wire(entries), pinned=pinned)


def _ps_row(job: api.Json, state: str, *extra: str) -> list[str]:
    return [
        str(job.get("id") or ""),
        common.devices_text(job),
        state,
        str(job.get("submitter") or ""),
        render.command_text(job.get("command")),
        *extra,
    ]
