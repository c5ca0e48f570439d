"""CPU time per process over a measured window, from ``/proc``, so that a throughput
figure comes with where the machine's cycles went: on a machine shared by the
database, the controllers, the workers, their jobs and the load generator, a second
controller can only be faster if the first one left a core idle.

``Meter`` takes a snapshot of named process groups and of the whole machine
(``/proc/stat``) before and after; ``Meter.report`` gives CPU seconds per group, per
job, and the machine's busy share of its cores over the window.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def times(pid: int) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of children it has waited for) of ``pid``; zeros
    once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    # The command name may hold spaces and parentheses: the fields follow the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICK, (cutime + cstime) / TICK


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def machine() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, over every core."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(x) for x in first[:8]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


@dataclass
class Group:
    """A named set of processes: ``pids()`` lists them at each snapshot. ``what`` is
    ``own`` (their own CPU), ``reaped`` (that of the children they have waited for: a
    worker's jobs) or ``all`` (both: a postmaster's exited backends count too)."""

    name: str
    pids: Callable[[], Iterable[int]]
    what: str = "own"


def _sample(groups: list[Group]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for g in groups:
        per: dict[int, float] = {}
        for pid in g.pids():
            own, reaped = times(pid)
            per[pid] = (own if g.what != "reaped" else 0.0) + (reaped if g.what != "own" else 0.0)
        out[g.name] = per
    return out


@dataclass
class Meter:
    """CPU seconds spent by each group between ``start`` and ``stop``."""

    groups: list[Group]
    _before: dict[str, dict[int, float]] = field(default_factory=dict)
    _after: dict[str, dict[int, float]] = field(default_factory=dict)
    _machine: tuple[float, float] = (0.0, 0.0)
    _self: float = 0.0
    seconds: float = 0.0

    def start(self) -> None:
        self._before = _sample(self.groups)
        self._machine = machine()
        t = os.times()
        self._self = t.user + t.system
        self._t0 = time.monotonic()

    def stop(self) -> None:
        self.seconds = time.monotonic() - self._t0
        self._after = _sample(self.groups)
        busy0, total0 = self._machine
        busy1, total1 = machine()
        self._machine = (busy1 - busy0, total1 - total0)
        t = os.times()
        self._self = t.user + t.system - self._self

    def report(self, jobs: int) -> dict[str, float]:
        """CPU seconds per group (a process that started in the window counts from 0),
        the load generator's (this process), the machine's busy share of all its cores,
        and each figure per job in milliseconds."""
        out: dict[str, float] = {"window_s": self.seconds}
        for g in self.groups:
            before, after = self._before.get(g.name, {}), self._after.get(g.name, {})
            spent = sum(max(0.0, v - before.get(pid, 0.0)) for pid, v in after.items())
            out[f"cpu_s.{g.name}"] = spent
            out[f"ms_per_job.{g.name}"] = 1000 * spent / jobs
        out["cpu_s.client"] = self._self
        out["ms_per_job.client"] = 1000 * self._self / jobs
        busy, total = self._machine
        out["cpu_s.machine"] = busy
        out["ms_per_job.machine"] = 1000 * busy / jobs
        out["machine_busy"] = busy / total if total else 0.0
        return out
