"""``rc run --array`` (EXT-ARRAY-2): submit the array once, follow each task's output as it
starts, keep one status line current, and exit with the lowest failed index's code.

The array is watched through ``GET /v1/arrays/{id}``; each started task's log is followed
by a thread of its own, with a client of its own (a transport keeps one connection, which
two threads must not share), so a chatty task never holds up another's lines.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from resource_controller import errors
from resource_controller.cli import basics, render, signals
from resource_controller.cli.arrayout import File, Lines, Screen
from resource_controller.client import calls, machine, waits

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, Protocol

    from resource_controller.client import api
    from resource_controller.client.calls import Json, Op
    from resource_controller.client.submit import Submit

    class Sink(Protocol):
        def write(self, chunk: bytes) -> None: ...
        def close(self) -> None: ...


#: Task states as the array's view sends them, in the order the status line names them.
ENDED = ("succeeded", "failed", "killed", "lost")
RUNNING = ("assigned", "running")
#: The parts of the status line after "done", in the order shown.
PARTS = (("running", RUNNING), ("queued", ("queued",)), *((s, (s,)) for s in ENDED[1:]))
#: How often the array is asked after.
POLL = waits.POLL_INTERVAL
#: A poll's own bound; an outage is waited out for ``machine.FINAL_WAIT`` as ``rc run`` does.
POLL_TIMEOUT = 5.0
#: How long a follower blocks in one read: how soon it notices it is to stop.
READ_SLICE = 0.5
#: Followers at once: as many as run (the array's cap, or what runs now), within these.
FOLLOW_MIN, FOLLOW_MAX = 4, 64
#: Bound on the followers' ends once every task has ended, and once interrupted.
JOIN_BOUND, DETACH_JOIN = 30.0, 1.0
#: Failed indexes named in the summary; the rest are counted.
SHOWN = 20
OUTPUTS = ("text", "json")


def check(values: dict[str, Any]) -> None:
    """The flags only ``--array`` takes, and those it refuses, before any request."""
    if not values.get("array"):
        for dest, flag in (
            ("output_dir", "--output-dir"),
            ("detach", "--detach"),
            ("output", "-o/--output"),
        ):
            if values.get(dest):
                raise basics.Failure(f"{flag} needs --array: it applies to an array's tasks")
        return
    if values.get("output") and values["output"] not in OUTPUTS:
        raise basics.Failure(
            f"invalid value for -o/--output: {values['output']!r} is not one of text, json"
        )
    if values.get("timeout"):
        raise basics.Failure(
            "--timeout cannot be used with --array: an array's tasks queue until they can run"
            " (Ctrl-C cancels the queued ones)"
        )


def status_text(counts: dict[str, Any], size: int) -> str:
    """``12/100 done · 8 running · 80 queued · 1 failed``: only the non-zero parts after done."""

    def n(states: Iterable[str]) -> int:
        return sum(int(counts.get(s) or 0) for s in states)

    parts = [f"{n(ENDED)}/{size} done"]
    parts.extend(f"{count} {word}" for word, states in PARTS if (count := n(states)))
    return " · ".join(parts)


def counts_of(tasks: Sequence[Json]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        state = str(t.get("state") or "")
        out[state] = out.get(state, 0) + 1
    return out


def task_code(task: Json) -> int:
    """A task's exit status as ``rc run`` gives a job's: 1 for a failure without a code."""
    code = task.get("exit_code")
    if task.get("state") == "succeeded":
        return 0
    return calls.exit_status(code) if isinstance(code, int) and code else 1


def _by_index(tasks: Sequence[Json]) -> list[Json]:
    return sorted(tasks, key=lambda t: int(t.get("index") or 0))


def failed(tasks: Sequence[Json]) -> list[Json]:
    return [t for t in _by_index(tasks) if t.get("state") != "succeeded"]


def exit_code(tasks: Sequence[Json]) -> int:
    """0 when every task succeeded, else the code of the failed task with the lowest index."""
    bad = failed(tasks)
    return task_code(bad[0]) if bad else 0


def _why(task: Json) -> str:
    code = task.get("exit_code")
    if task.get("state") == "failed" and isinstance(code, int):
        return f"exit {code}"
    return str(task.get("state") or "unknown")


def summary(array_id: str, tasks: Sequence[Json]) -> str:
    """``array ID: 97/100 succeeded; failed: 3 (exit 1), 17 (exit 2), 42 (killed)``."""
    bad = failed(tasks)
    named = ", ".join(f"{t.get('index')} ({_why(t)})" for t in bad[:SHOWN])
    more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
    good = len(tasks) - len(bad)
    return f"array {array_id}: {good}/{len(tasks)} succeeded; failed: {named}{more}"


def stoppable(op: Op[None], stop: threading.Event) -> Op[None]:
    """``op`` until it ends or ``stop`` is set; a long read is made in ``READ_SLICE`` pieces
    so that a silent task's follower still notices ``stop`` soon."""
    value: Any = None
    thrown: Exception | None = None
    while True:
        if stop.is_set():
            op.close()
            return
        try:
            step = op.send(value) if thrown is None else op.throw(thrown)
        except StopIteration:
            return
        value = thrown = None
        try:
            if isinstance(step, calls.Read) and step.idle is not None:
                value = yield from _sliced(step, stop)
            else:
                value = yield step
        except Exception as e:  # the follow decides what a failed step means
            thrown = e


def _sliced(step: calls.Read, stop: threading.Event) -> Op[bytes | None]:
    idle = float(step.idle or 0.0)
    waited = 0.0
    while True:
        piece = max(0.01, min(READ_SLICE, idle - waited))
        chunk: bytes | None = yield calls.Read(step.stream, piece)
        waited += piece
        if chunk is not None or waited >= idle or stop.is_set():
            return chunk


class Follower(threading.Thread):
    """One task's output, from its start to its end, into its sink."""

    def __init__(
        self,
        task: Json,
        make_client: Callable[[], api.JsonClient],
        sink: Sink,
        screen: Screen,
        stop: threading.Event,
        done: threading.Event,
    ) -> None:
        super().__init__(name=f"rc-array-task-{task.get('index')}", daemon=True)
        self.task_id, self.index = str(task.get("id") or ""), task.get("index")
        self.make_client, self.sink, self.screen = make_client, sink, screen
        self.stop, self.done = stop, done

    def run(self) -> None:
        client = None
        try:
            client = self.make_client()
            follow = waits.follow(
                self.task_id, client.monotonic, machine.FINAL_WAIT, self.sink.write
            )
            client.drive(stoppable(follow, self.stop), say=self.screen.say)
        except errors.ClientError as e:
            self.screen.say(f"task {self.index} (job {self.task_id}): log stream ended: {e}")
        except (OSError, ValueError) as e:
            self.screen.say(f"task {self.index}: log stream ended: cannot write output: {e}")
        finally:
            with contextlib.suppress(OSError, ValueError):
                self.sink.close()
            if client is not None:
                client.close()
            self.done.set()


def started(task: Json) -> bool:
    """Whether a task has output to follow: it runs, or it ended after being placed."""
    state = task.get("state")
    return state in RUNNING or (state in ENDED and bool(task.get("device_id")))


def follow_limit(tasks: Sequence[Json], max_running: int) -> int:
    running = sum(1 for t in tasks if t.get("state") in RUNNING)
    return min(FOLLOW_MAX, max(FOLLOW_MIN, running, max_running))


def run(client: api.JsonClient, wanted: Submit, values: dict[str, Any]) -> int:
    """``rc run --array``: its exit code (``check`` has passed)."""
    output_dir = str(values.get("output_dir") or "")
    if output_dir:
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            raise basics.Failure(f"--output-dir {output_dir}: {e.strerror or e}") from None
    body: Json = client.drive(
        machine.submit(wanted, client.submitter, client.monotonic), say=render.say
    )
    array_id = str(body.get("id") or "")
    render.say(f"array {array_id}: {body.get('size')} tasks ({body.get('spec') or wanted.array})")
    if values.get("output") == "json":
        render.out(render.json_compact(body))
        return 0
    if values.get("detach"):
        render.out(array_id + "\n")
        return 0
    from resource_controller.client import api

    def make_client() -> api.JsonClient:
        return api.JsonClient(submitter=client.submitter)

    return Watch(client, body, Screen(), make_client, output_dir).run()


class Watch:
    """The wait for an array's end: the status line, the followers, and Ctrl-C."""

    def __init__(
        self,
        client: api.JsonClient,
        body: Json,
        screen: Screen,
        make_client: Callable[[], api.JsonClient],
        output_dir: str = "",
    ) -> None:
        self.client, self.body, self.screen = client, body, screen
        self.make_client, self.output_dir = make_client, output_dir
        self.array_id = str(body.get("id") or "")
        self.size = int(body.get("size") or len(body.get("tasks") or []))
        self.max_running = int(body.get("max_running") or 0)
        self.stop, self.freed = threading.Event(), threading.Event()
        self.followers: dict[str, Follower] = {}
        self.live: list[Follower] = []

    @property
    def tasks(self) -> list[Json]:
        return list(self.body.get("tasks") or [])

    def run(self) -> int:
        try:
            return self._wait()
        except (signals.Interrupted, KeyboardInterrupt):
            self.stop.set()
            return self._detach()
        finally:
            self.stop.set()  # a follower left behind by a failure stops writing

    def _wait(self) -> int:
        now = self.client.monotonic
        heard = now()
        next_poll = now() + POLL
        todo, ended, limit = self._seen()
        while True:
            self._start_followers(todo, limit)
            if ended and not todo and not self.live:
                break
            self.freed.wait(max(0.0, next_poll - now()))
            self.freed.clear()
            if now() < next_poll:
                continue
            next_poll = now() + POLL
            try:
                self.body = self.client.get_array(self.array_id, timeout=POLL_TIMEOUT)
                heard = now()
            except (errors.TransportError, errors.ApiError) as e:
                if isinstance(e, errors.ApiError) and e.status < 500:
                    raise
                if now() - heard >= machine.FINAL_WAIT:
                    return self._lost(e)
                continue
            todo, ended, limit = self._seen()
        self._join(JOIN_BOUND)
        tasks = self.tasks
        self.screen.status(status_text(counts_of(tasks), self.size), final=True)
        code = exit_code(tasks)
        if code:
            self.screen.say(summary(self.array_id, tasks))
        return code

    def _seen(self) -> tuple[list[Json], bool, int]:
        """Once per look at the array: the status line, then (the started tasks not yet
        followed, in index order; whether every task ended; how many to follow at once)."""
        tasks = self.tasks
        self.screen.status(status_text(self.body.get("counts") or counts_of(tasks), self.size))
        todo = [t for t in _by_index(tasks) if started(t) and t.get("id") not in self.followers]
        todo.reverse()  # popped from the end: the lowest index first
        ended = all(t.get("state") in ENDED for t in tasks)
        return todo, ended, follow_limit(tasks, self.max_running)

    def _start_followers(self, todo: list[Json], limit: int) -> None:
        """Followers for the next tasks of ``todo`` while fewer than ``limit`` are live."""
        self.live = [f for f in self.live if f.is_alive()]
        while todo and len(self.live) < limit:
            task = todo.pop()
            sink: Sink
            if self.output_dir:
                path = os.path.join(self.output_dir, f"{task.get('index')}.log")
                try:
                    sink = File(path)
                except OSError as e:
                    raise basics.Failure(f"--output-dir: cannot write {path}: {e.strerror}") from e
            else:
                sink = Lines(task.get("index"), self.screen)
            follower = Follower(task, self.make_client, sink, self.screen, self.stop, self.freed)
            self.followers[str(task.get("id") or "")] = follower
            self.live.append(follower)
            follower.start()

    def _join(self, bound: float) -> None:
        end = time.monotonic() + bound
        for f in self.live:
            f.join(max(0.0, end - time.monotonic()))
        left = [f for f in self.live if f.is_alive()]
        if left:
            self.stop.set()
            shown = ", ".join(str(f.index) for f in left[:SHOWN])
            self.screen.say(f"gave up following the output of tasks {shown} (rc logs ID shows it)")

    def _lost(self, error: errors.ClientError) -> int:
        self.stop.set()
        self._join(DETACH_JOIN)
        self.screen.status(self.screen.line, final=True)
        self.screen.say(
            f"lost contact with array {self.array_id}: {error}; its tasks may still be running,"
            f" and rc cannot tell how they end: rc jobs --array {self.array_id} shows them"
        )
        return machine.EXIT_LOST

    def _detach(self) -> int:
        """Ctrl-C: the queued tasks are cancelled, the running ones left running, and the
        command that stops them said."""
        end = time.monotonic() + machine.CANCEL_BOUND
        with contextlib.suppress(errors.ClientError):
            self.body = self.client.get_array(self.array_id, timeout=machine.DETACH_CHECK)
        tasks = _by_index(self.tasks)
        queued = [t for t in tasks if t.get("state") == "queued"]
        cancelled, missed = self._cancel(queued, len(queued) == len(tasks), end)
        self._join(DETACH_JOIN)
        self.screen.status(self.screen.line, final=True)
        running = sum(1 for t in tasks if t.get("state") in RUNNING)
        said = f"array {self.array_id}: cancelled {cancelled} queued tasks"
        if missed:
            said += f" ({missed} could not be cancelled)"
        if running or missed:
            said += (
                f"; detached from {running} running tasks: they go on and hold their devices"
                f" (watch them with rc jobs --array {self.array_id}; rc kill {self.array_id} stops them)"
            )
        self.screen.say(said)
        return machine.EXIT_INTERRUPTED

    def _cancel(self, queued: Sequence[Json], none_started: bool, end: float) -> tuple[int, int]:
        """(cancelled, not cancelled): each queued task killed, lowest index first (the next
        to start), within ``end``; when none has started, the array's ID ends them at once."""
        submitter = self.client.submitter
        if none_started and queued:
            try:
                self.client.kill(self.array_id, submitter=submitter, timeout=machine.CANCEL_BOUND)
                return len(queued), 0
            except errors.ClientError:
                pass
        done = missed = 0
        for task in queued:
            left = end - time.monotonic()
            if left <= 0:
                missed += 1
                continue
            try:
                self.client.kill(str(task.get("id") or ""), submitter=submitter, timeout=left)
                done += 1
            except errors.NotCancellableError:
                pass  # it ended meanwhile: nothing left queued
            except errors.ClientError:
                missed += 1
        return done, missed
