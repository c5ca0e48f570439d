"""A driver for the client's operations with no I/O at all: a script answers each step.

``Steps(reply).run(op)`` carries an operation out as ``api.JsonClient`` would, but every
request, read and open is answered by ``reply(step)`` (a value, or an exception raised
or returned, which is thrown into the operation), pauses advance a fake clock, and
``Note``, ``Out`` and ``Sleep`` steps are kept for the test to read. A ``Call`` answered
with ``Steps.NO_ANSWER`` costs its bound on the clock and then times out, as a frozen
controller would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resource_controller import errors
from resource_controller.client import calls

Reply = Callable[[Any], Any]


class Stream:
    """A follow the script opened: its chunks one per ``Read``; ``None`` (silence, the
    idle bound passing on the clock), an exception (a break) or ``b""`` (the end)."""

    def __init__(self, pieces: list[Any], base: str = "http://a") -> None:
        self.pieces = list(pieces)
        self.base = base
        self.closed = False


class Steps:
    NO_ANSWER = object()

    def __init__(self, reply: Reply, where: str = "http://a") -> None:
        self.reply = reply
        self.now = 0.0
        self.where = where
        self.steps: list[Any] = []
        self.notes: list[str] = []
        self.out: list[bytes] = []
        self.relayed: list[tuple[str, str]] = []

    def clock(self) -> float:
        return self.now

    def requests(self, method: str = "", path: str = "") -> list[calls.Call]:
        """The requests made, optionally only those of one route."""
        return [
            s
            for s in self.steps
            if isinstance(s, calls.Call)
            and (not method or s.method == method)
            and (not path or s.path == path)
        ]

    def opened(self) -> list[calls.Call]:
        return [s.call for s in self.steps if isinstance(s, calls.Open)]

    def run(self, op: Any) -> Any:
        value: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                step = op.send(value) if thrown is None else op.throw(thrown)
            except StopIteration as done:
                return done.value
            value = thrown = None
            self.steps.append(step)
            try:
                value = self._answer(step)
            except BaseException as e:  # errors and interrupts, as a driver throws them
                thrown = e

    def _answer(self, step: Any) -> Any:
        if isinstance(step, calls.Sleep):
            self.now += step.seconds
            return None
        if isinstance(step, calls.Note):
            self.notes.append(step.text)
            return None
        if isinstance(step, calls.Out):
            self.out.append(step.chunk)
            return None
        if isinstance(step, calls.Where):
            return self.where
        if isinstance(step, calls.Close):
            step.stream.closed = True
            return None
        if isinstance(step, calls.Read):
            piece = step.stream.pieces.pop(0) if step.stream.pieces else b""
            if piece is None:
                self.now += step.idle or 0.0
            if isinstance(piece, BaseException):
                raise piece
            return piece
        if isinstance(step, calls.JoinRelay):
            self.relayed.append((step.job_id, step.stdio))
            return None
        answer = self.reply(step)
        if answer is Steps.NO_ANSWER:
            assert isinstance(step, calls.Call)
            self.now += step.timeout or 5.0
            raise errors.TimedOut(f"{step.method} {step.path}: timed out")
        if isinstance(answer, errors.ApiError) and getattr(step, "refuse", None) is not None:
            raise step.refuse(answer)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(step, calls.Call):
            return step.answer(answer, f"{step.method} {step.path}")
        return answer
