"""Long polls parked for work, which a terminal report's commit may answer directly; one lock orders
claims and leaving, so a left poll is never claimed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

#: A claimed poll's answer: (jobs, kills), or None: nothing handed out, the poll looks itself.
Answer = tuple[list[Any], list[str]] | None


class Parked:
    """One waiting poll."""

    __slots__ = ("_loop", "answer", "claimed", "worker_id")

    def __init__(self, worker_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.worker_id = worker_id
        self._loop = loop
        self.answer: asyncio.Future[Answer] = loop.create_future()
        self.claimed = False

    def give(self, answer: Answer) -> None:
        """Answer the poll; from any thread."""
        self._loop.call_soon_threadsafe(self._set, answer)

    def _set(self, answer: Answer) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)


class ParkedPolls:
    """The polls waiting for work, by worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_worker: dict[str, list[Parked]] = {}

    def park(self, worker_id: str) -> Parked:
        """A poll of ``worker_id`` starts waiting (on the event loop)."""
        parked = Parked(worker_id, asyncio.get_running_loop())
        with self._lock:
            self._by_worker.setdefault(worker_id, []).append(parked)
        return parked

    def leave(self, parked: Parked) -> bool:
        """The poll stops waiting; False when it was claimed first and must await its answer."""
        with self._lock:
            if parked.claimed:
                return False
            waiting = self._by_worker.get(parked.worker_id, [])
            if parked in waiting:
                waiting.remove(parked)
            if not waiting:
                self._by_worker.pop(parked.worker_id, None)
            return True

    def claim(self, worker_id: str) -> Parked | None:
        """Promise the newest waiting poll of ``worker_id`` an answer (any thread)."""
        with self._lock:
            waiting = self._by_worker.get(worker_id)
            if not waiting:
                return None
            parked = waiting.pop()
            if not waiting:
                del self._by_worker[worker_id]
            parked.claimed = True
            return parked

    def __len__(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._by_worker.values())
