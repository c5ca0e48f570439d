"""The verify pass: proving a device clean after each job (worker.md §17).

After a job's process tree is gone and before its terminal report, every entry of
``verify_dir`` that is not a directory runs, in byte order of its name:

- a missing ``verify_dir`` turns the pass off ("clean", no delay); one that cannot be
  listed fails it: one ``chmod 000`` must not silently mark
  every device verified;
- an entry whose ``stat`` fails (a dangling symlink) fails the pass; one with no
  execute bit at all is skipped with a warning naming it and its mode; the rest run;
- each script runs directly, in its own process group, bounded by ``verify_timeout``
  through the cancellation path, with ``RC_EVENT=verify``, ``RC_DEVICE``, ``RC_JOB_ID``,
  ``RC_SUBMITTER`` and ``CUDA_VISIBLE_DEVICES``; stdout and stderr are
  captured apart, 64 KiB each;
- exit 0 passes; anything else fails, with ``verify failed: <name>: <detail>[: <stderr
  tail>]``. Every script still runs after a failure; the first
  failure's reason is the one kept;
- the whole pass is bounded by ``verify_pass_budget`` on the injected clock; a script
  running when it expires is cut short, and an unfinished pass has proven nothing
 .

What the caller does with a failure (the fault report before the terminal report, the
job's own outcome unchanged) is the lifecycle's business.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from resource_controller.clock import Clock
from resource_controller.core import durations
from resource_controller.worker import hooks, procs, runner
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

#: Each of stdout and stderr is captured up to this many bytes.
CAPTURE_CAP = 65_536
#: The stderr tail in a failure reason.
STDERR_TAIL = 200

PREFIX = "verify failed: "


@dataclass(frozen=True)
class ScriptRun:
    """How one verify script ended."""

    #: ``""`` for a pass, else the detail of VERIFY-006 (``exited 3``, ``signal: killed``,
    #: ``max_runtime exceeded (30s)``, ``run: start: ...``).
    detail: str
    stderr: bytes = b""
    stderr_truncated: bool = False

    @property
    def passed(self) -> bool:
        return not self.detail


def stderr_tail(stderr: bytes, truncated: bool) -> str:
    """Trimmed stderr, its last 200 bytes when longer, noting a capture overflow."""
    text = stderr.strip()
    if not text:
        return ""
    if len(text) > STDERR_TAIL:
        tail = "...(truncated)" + text[-STDERR_TAIL:].decode("utf-8", errors="replace")
    else:
        tail = text.decode("utf-8", errors="replace")
    if truncated:
        tail += " (stderr itself was truncated)"
    return tail


def failure_reason(name: str, run: ScriptRun) -> str:
    """``verify failed: <name>: <detail>[: <stderr tail>]``."""
    reason = f"{PREFIX}{name}: {run.detail}"
    tail = stderr_tail(run.stderr, run.stderr_truncated)
    return f"{reason}: {tail}" if tail else reason


def verify_env(
    base_env: Mapping[str, str],
    device_id: str,
    job_id: str,
    submitter: str,
    mig_uuids: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The worker's environment plus the verify variables: a hook's, with
    ``RC_EVENT=verify``."""
    return hooks.hook_env(base_env, "verify", device_id, job_id, submitter, mig_uuids)


class _Capture(asyncio.SubprocessProtocol):
    """stdout and stderr apart, each kept up to ``CAPTURE_CAP`` bytes and read to the end."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.data = {1: bytearray(), 2: bytearray()}
        self.overflow = {1: False, 2: False}
        self.closed = {1: loop.create_future(), 2: loop.create_future()}
        self.exited: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        buf = self.data.get(fd)
        if buf is None:
            return
        room = CAPTURE_CAP - len(buf)
        if len(data) > room:
            self.overflow[fd] = True
        if room > 0:
            buf.extend(data[:room])

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        fut = self.closed.get(fd)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def run_script(
    path: str, env: Mapping[str, str], *, timeout: float, clock: Clock, timings: Timings
) -> ScriptRun:
    """Run one script to its end under ``timeout``.

    Complete when the leader has exited and both pipes reached end of file. A timeout
    takes the cancellation path (TERM, grace, KILL, reap); a clean exit that leaves
    live members in the group is a kill too. Torn down itself, it SIGKILLs
    the group on the way out.
    """
    loop = asyncio.get_running_loop()
    proto = _Capture()
    try:
        transport, _ = await loop.subprocess_exec(
            lambda: proto,
            path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        return ScriptRun("run: start: " + procs.os_error_text("exec", path, exc))
    except (ValueError, subprocess.SubprocessError) as exc:
        return ScriptRun(f"run: start: {exc}")
    pgid = transport.get_pid()
    started = clock.monotonic()
    done = asyncio.ensure_future(asyncio.gather(proto.exited, *proto.closed.values()))
    try:
        trip = ""
        while not done.done():
            if clock.monotonic() - started > timeout:
                trip = f"max_runtime exceeded ({durations.render_duration(timeout)})"
                break
            await asyncio.wait([done], timeout=timings.watchdog_period)
        if trip:
            await procs.escalate(pgid, (done,), proto.exited, grace=timings.kill_grace)
            await done
            detail = trip
        else:
            detail = await _after_exit(pgid, transport.get_returncode())
    except BaseException:
        procs.kill_group_now(pgid)
        raise
    finally:
        if not done.done():
            done.cancel()
        transport.close()
    return ScriptRun(detail, bytes(proto.data[2]), proto.overflow[2])


async def _after_exit(pgid: int, returncode: int | None) -> str:
    """The detail of a script nobody signalled: ``""`` for a clean pass."""
    code = runner.exit_code_of(returncode)
    if returncode is not None and returncode < 0:
        detail = "signal: " + procs.signal_word(-returncode)
    else:
        detail = "" if code == 0 else f"exited {code}"
    await procs.settle_group(pgid)
    if procs.group_alive(pgid):
        emptied = await procs.reap_group(pgid)
        detail = runner.REASON_STRAGGLERS_REAPED if emptied else runner.REASON_STRAGGLERS_REMAINED
    return detail


@dataclass(frozen=True)
class Pass:
    """The result of one verify pass: ``reason`` is ``""`` when the device is clean."""

    reason: str = ""
    #: How many scripts ran.
    ran: int = 0

    @property
    def clean(self) -> bool:
        return not self.reason


def _sort_key(name: str) -> bytes:
    return os.fsencode(name)


async def verify_pass(
    verify_dir: str,
    *,
    device_id: str,
    job_id: str,
    submitter: str,
    timeout: float,
    budget: float,
    clock: Clock,
    timings: Timings,
    base_env: Mapping[str, str] | None = None,
    mig_uuids: Mapping[str, str] | None = None,
) -> Pass:
    """Run the pass for one device after one job; ``mig_uuids`` for
    ``CUDA_VISIBLE_DEVICES`` on a MIG instance."""
    try:
        entries = list(os.scandir(verify_dir))
    except FileNotFoundError:
        return Pass()  # Off
    except OSError as exc:
        return Pass(PREFIX + "read verify_dir: " + procs.os_error_text("open", verify_dir, exc))
    names = sorted((e.name for e in entries if not e.is_dir(follow_symlinks=False)), key=_sort_key)
    env = verify_env(
        os.environ if base_env is None else base_env, device_id, job_id, submitter, mig_uuids
    )
    started = clock.monotonic()
    first = ""
    ran = 0
    for name in names:
        left = budget - (clock.monotonic() - started)
        if left <= 0:
            return Pass(first or _budget_reason(budget), ran)
        path = os.path.join(verify_dir, name)
        try:
            st = os.stat(path)
        except OSError as exc:
            first = first or f"{PREFIX}{name}: stat: {procs.os_error_text('stat', path, exc)}"
            continue
        if not st.st_mode & 0o111:
            log.warning(
                "device %s: verify script %s is not executable (mode %s): skipped",
                device_id,
                path,
                stat.filemode(st.st_mode),
                extra={"action": "verify_skipped", "job_id": job_id},
            )
            continue
        run = await run_script(path, env, timeout=min(timeout, left), clock=clock, timings=timings)
        ran += 1
        if run.passed:
            continue
        if clock.monotonic() - started >= budget:
            return Pass(first or _budget_reason(budget), ran)
        first = first or failure_reason(name, run)
    return Pass(first, ran)


def _budget_reason(budget: float) -> str:
    return f"{PREFIX}pass exceeded its {durations.render_duration(budget)} budget"
