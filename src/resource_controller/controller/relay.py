"""The interactive relay (controller-api.md §11): each direction an unbuffered hand-off, so flow
control pushes back on the sender; an output half ending ends the session."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from resource_controller import errors

#: The largest chunk handed over in one piece (TTY-031's frame line limit).
FRAME_MAX = 1_048_576
#: Every write to a GET half's socket must finish within this.
WRITE_DEADLINE = 10.0
#: A POST half blocked this long while it is alone in its session gives up.
HANDOFF_GUARD = 60.0
#: A session with worker halves and no client half this long is over.
CLIENT_ABSENT = 10.0


class Half(enum.Enum):
    CLIENT_OUT = "client-out"
    WORKER_OUT = "worker-out"
    CLIENT_IN = "client-in"
    WORKER_IN = "worker-in"

    @property
    def is_output(self) -> bool:
        return self in (Half.CLIENT_OUT, Half.WORKER_OUT)

    @property
    def is_client(self) -> bool:
        return self in (Half.CLIENT_OUT, Half.CLIENT_IN)


class Pipe:
    """One direction: at most one chunk in flight, handed from a writer to a reader; every
    change sets the current event and installs a fresh one (one event loop, no locks)."""

    def __init__(self) -> None:
        self._slot: bytes | None = None
        self._offered = 0
        self._taken = 0
        self._closed = False
        self._eof = False
        self._changed = asyncio.Event()

    @property
    def closed(self) -> bool:
        """Closed or at end of stream: nothing more will pass."""
        return self._closed or self._eof

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    def offer(self, data: bytes) -> int:
        """Put one chunk in the slot (the writer's previous one was taken); its ticket."""
        if self.closed:
            return 0
        assert self._slot is None, "one writer per direction, one chunk at a time"
        self._slot = data
        self._offered += 1
        self._notify()
        return self._offered

    async def taken(self, ticket: int) -> bool:
        """Wait until chunk ``ticket`` was taken; ``False`` if closed first. Safe to cancel."""
        if ticket == 0:
            return False
        await self._until(lambda: self._taken >= ticket or self._closed)
        return self._taken >= ticket

    async def send(
        self, data: bytes, guard: float | None = None, alone: Callable[[], bool] | None = None
    ) -> bool:
        """Hand ``data`` over; ``False`` once closed, or blocked ``guard`` seconds while
        ``alone()``."""
        for start in range(0, len(data), FRAME_MAX):
            ticket = self.offer(data[start : start + FRAME_MAX])
            while True:
                try:
                    async with asyncio.timeout(guard):
                        taken = await self.taken(ticket)
                    break
                except TimeoutError:
                    if alone is None or alone():
                        self.close()
                        return False
            if not taken:
                return False
        return True

    async def recv(self) -> bytes | None:
        """The next chunk; ``None`` at end of stream or once closed."""
        await self._until(lambda: self._slot is not None or self.closed)
        if self._slot is None or self._closed:
            return None
        data, self._slot = self._slot, None
        self._taken = self._offered
        self._notify()
        return data

    def end(self) -> None:
        """The writer finished: the reader sees end of stream (nothing is pending then)."""
        self._eof = True
        self._notify()

    def close(self) -> None:
        """Drop the direction: a pending chunk is discarded, both sides wake."""
        self._closed = True
        self._slot = None
        self._notify()


@dataclass(eq=False)
class Session:
    """One job's relay: its two directions and the halves attached to it."""

    job_id: str
    output: Pipe = field(default_factory=Pipe)
    input: Pipe = field(default_factory=Pipe)
    halves: set[Half] = field(default_factory=set)
    #: Set once the session is discarded: over for every half.
    over: asyncio.Event = field(default_factory=asyncio.Event)
    #: Armed while worker halves wait with no client half (``CLIENT_ABSENT``).
    absent_timer: asyncio.TimerHandle | None = None

    @property
    def discarded(self) -> bool:
        return self.over.is_set()

    def waits_for_client(self) -> bool:
        return (
            bool(self.halves) and not any(h.is_client for h in self.halves) and not self.discarded
        )

    def alone(self, half: Half) -> bool:
        """The hand-off guard's condition."""
        return self.halves == {half}

    def pipe_of(self, half: Half) -> Pipe:
        return self.output if half.is_output else self.input


class Relay:
    """Every live session, by job ID; the only owner of session life and death."""

    def __init__(
        self,
        *,
        write_deadline: float = WRITE_DEADLINE,
        handoff_guard: float = HANDOFF_GUARD,
        client_absent: float = CLIENT_ABSENT,
    ) -> None:
        self.sessions: dict[str, Session] = {}
        #: Set at shutdown: POST halves stop waiting for their bodies.
        self.stopping = asyncio.Event()
        self.write_deadline = write_deadline
        self.handoff_guard = handoff_guard
        self.client_absent = client_absent

    def attach(self, job_id: str, half: Half) -> Session:
        """Join (or create) the job's session as ``half``; ``409 conflict`` if it is taken."""
        session = self.sessions.get(job_id)
        if session is None:
            session = self.sessions[job_id] = Session(job_id)
        if half in session.halves:
            raise errors.Conflict(
                f"the {half.value} half of job {job_id}'s session is already connected"
            )
        if not half.is_output and session.input.closed:
            # Input halves dialling again get a fresh input direction once the old one is let go.
            other = Half.WORKER_IN if half is Half.CLIENT_IN else Half.CLIENT_IN
            if other not in session.halves:
                session.input = Pipe()
        session.halves.add(half)
        self._watch_for_client(session)
        return session

    def _watch_for_client(self, session: Session) -> None:
        """Arm the absent-client timer while only worker halves are attached; else disarm."""
        waits, timer = session.waits_for_client(), session.absent_timer
        if waits and timer is None:
            loop = asyncio.get_running_loop()
            session.absent_timer = loop.call_later(self.client_absent, self._absent, session)
        elif not waits and timer is not None:
            timer.cancel()
            session.absent_timer = None

    def _absent(self, session: Session) -> None:
        session.absent_timer = None
        if session.waits_for_client():
            session.output.close()  # nobody will read what the worker offered
            self._discard(session)

    def half_ended(self, session: Session, half: Half, pipe: Pipe) -> None:
        """``half`` is over: a writer's end is end of stream, a reader's closes the direction."""
        if half in (Half.WORKER_OUT, Half.CLIENT_IN):
            pipe.end()
        else:
            pipe.close()
        if half.is_output:
            self._discard(session)
        session.halves.discard(half)
        if not session.halves:
            session.output.close()
            session.input.close()
            self._forget(session)
        self._watch_for_client(session)

    def _discard(self, session: Session) -> None:
        """TTY-020: the session is over; its input closes and every half is told. The output
        is its halves' to end: its writer ended it, or its reader is gone."""
        session.over.set()
        session.input.close()
        self._forget(session)

    def close_all(self) -> None:
        """Shutdown: every direction closes and every POST half stops reading."""
        self.stopping.set()
        for session in list(self.sessions.values()):
            session.over.set()
            session.output.close()
            session.input.close()
            if session.absent_timer is not None:
                session.absent_timer.cancel()
        self.sessions.clear()

    def _forget(self, session: Session) -> None:
        if self.sessions.get(session.job_id) is session:
            del self.sessions[session.job_id]
