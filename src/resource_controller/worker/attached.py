"""An attached job (``stdio`` ``tty`` or ``pipe``): its relay streams around its run.

The order is WTTY-001's: the output stream first, then the input stream, each of
which must answer ``200`` before the process starts; a failure to open either is the
job's outcome (exit code −1, ``attach <stdio> stdio: open output stream: ...``), and
the job then goes on through verify, its report and release like any other. After the
run (supervision and the output drain), the PTY master is closed, then both streams
(closing the output body ends the session at the controller).

The controller answers the output half only when the session is over. An answer (or
a broken connection) while the job still runs means nobody can see its output or
type into it again: its client left, or the relay was lost. The job is then ended
through the cancellation path, ``killed`` with that reason, so a relayed job never
holds its device for a client that is gone. Input ending alone never ends the job
.

The mode-specific parts live beside this: ``tty`` (the terminal and its frames) and
``pipe`` (raw stdin and stdout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from resource_controller import errors, wire
from resource_controller.clock import Clock
from resource_controller.core.states import JobState, Stdio
from resource_controller.h1 import aio
from resource_controller.worker import channel, runner, tty
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

ATTACHED = frozenset({Stdio.TTY.value, Stdio.PIPE.value})
#: How long the output half waits for the relay's answer after its body ends.
ANSWER_WAIT = 10.0
#: The reason of a job ended because the controller closed its session.
REASON_CLIENT_LEFT = "client left"


def is_attached(assignment: wire.Assignment) -> bool:
    """Whether the job's stdio goes through the relay."""
    return (assignment.stdio or "") in ATTACHED


def _problem(exc: errors.TransportError) -> str:
    return str(exc)


async def session_over(output: aio.Exchange) -> str:
    """Returns once the controller ended the output half: why the session is over."""
    try:
        while await output.read():
            pass
    except errors.TransportError as exc:
        return f"relay lost: {exc}"
    return REASON_CLIENT_LEFT


async def hang_up(output: aio.Exchange, over: asyncio.Task[str], wait: float = ANSWER_WAIT) -> None:
    """End the output body, then wait (bounded) for the relay's answer before closing.

    A server may drop body bytes it received but has not read once the sender hangs up
    (uvicorn answers a disconnected request with ``http.disconnect``), and the relay
    answers an output half only once it handed on the whole body: closing before that
    answer lost the last chunks of ``rc cp`` downloads. ``over`` is the one reader of
    the answer (``session_over``).
    """
    with contextlib.suppress(errors.TransportError):
        await output.finish()
    await asyncio.wait([over], timeout=wait)
    over.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await over
    output.close()


class RelaySink:
    """The job's output into the relay's output body, chunk by chunk.

    Awaiting a write is the back-pressure: a reader who is slow (or not there yet)
    slows the job's output, never a buffer. A broken stream is logged once; the job
    runs on under supervision, as a job whose client went away does.
    """

    def __init__(self, stream: aio.Exchange, job_id: str) -> None:
        self.stream = stream
        self.job_id = job_id
        self.broken = False

    async def write(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            await self.stream.write(data)
        except errors.TransportError as exc:
            self.broken = True
            log.warning(
                "job %s: relay output stream broke: %s",
                self.job_id,
                exc,
                extra={"action": "relay_output_broken", "job_id": self.job_id},
            )


async def run(
    assignment: wire.Assignment,
    *,
    to_controller: channel.Channel,
    on_log: runner.OutputSink,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings,
    base_env: Mapping[str, str],
    mig_uuids: Mapping[str, str] | None = None,
) -> runner.Outcome:
    """Open the relay, run the job in its mode, close the relay; the job's outcome.

    ``mig_uuids``: the MIG UUIDs of its devices, for ``runner.build_env``."""
    mode = assignment.stdio or ""
    job_id = assignment.job_id
    try:
        output = await to_controller.relay_output(job_id)
    except errors.TransportError as exc:
        return _attach_failed(mode, "output", exc)
    try:
        inp = await to_controller.relay_input(job_id)
    except errors.TransportError as exc:
        output.close()
        return _attach_failed(mode, "input", exc)
    over = asyncio.create_task(session_over(output), name=f"relay-over-{job_id}")
    try:
        env = runner.build_env(assignment, base_env, mig_uuids)
        argv = runner.job_argv(assignment)
        if mode == Stdio.TTY.value:
            return await _run_tty(
                assignment, argv, env, output, inp, cancel, clock, timings, hangup=over
            )
        from resource_controller.worker import pipe

        return await pipe.run(
            assignment,
            argv,
            env,
            output=output,
            inp=inp,
            sink=RelaySink(output, job_id).write,
            on_log=on_log,
            cancel=cancel,
            clock=clock,
            timings=timings,
            hangup=over,
        )
    finally:
        await hang_up(output, over)
        inp.close()


def _attach_failed(mode: str, which: str, exc: errors.TransportError) -> runner.Outcome:
    reason = f"attach {mode} stdio: open {which} stream: {_problem(exc)}"
    return runner.Outcome(JobState.FAILED, -1, reason)


async def _run_tty(
    assignment: wire.Assignment,
    argv: list[str],
    env: dict[str, str],
    output: aio.Exchange,
    inp: aio.Exchange,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings,
    hangup: asyncio.Future[str],
) -> runner.Outcome:
    got = await tty.start(argv, env=env, cwd=assignment.cwd or None, clock=clock)
    if isinstance(got, runner.Outcome):
        return got
    started, terminal = got
    sink = RelaySink(output, assignment.job_id)
    forward = asyncio.create_task(
        tty.forward_input(inp, terminal, assignment.job_id), name=f"tty-in-{assignment.job_id}"
    )
    try:
        return await runner.supervise(
            started,
            on_output=sink.write,
            cancel=cancel,
            clock=clock,
            timings=timings,
            max_runtime_seconds=float(assignment.max_runtime_seconds or 0),
            idle_timeout=float(assignment.idle_timeout_seconds or 0),
            output_grace=timings.pty_drain,
            hangup=hangup,
        )
    finally:
        forward.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await forward
        terminal.close()
