"""Signals, process groups and ``/proc``: the worker's only contact with other processes.

A job is a process group, or a ``tty`` job's session (WRK-090, WRK-091). "Alive" ignores
zombies (WRK-092): counting one once made successful jobs report themselves killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

#: ``RC_TEST_BOOT_ID_PATH`` moves it (``process``); the ``btime`` line is the fallback.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PROC_STAT_PATH = "/proc/stat"
PROC_ROOT = "/proc"

#: Straggler reap (WRK-096 step 4): how long a SIGKILLed target gets to empty, polled how often.
STRAGGLER_BOUND = 2.0
STRAGGLER_POLL = 0.02
EXIT_SETTLE = 0.5
#: In ``/proc/<pid>/stat`` flags: inside exit(), never to run user code again.
PF_EXITING = 0x4

_SIGNAL_WORDS: dict[int, str] = {
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
    signal.SIGINT: "interrupt",
    signal.SIGHUP: "hangup",
    signal.SIGQUIT: "quit",
    signal.SIGABRT: "aborted",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGFPE: "floating point exception",
    signal.SIGILL: "illegal instruction",
    signal.SIGPIPE: "broken pipe",
    signal.SIGALRM: "alarm clock",
    signal.SIGUSR1: "user defined signal 1",
    signal.SIGUSR2: "user defined signal 2",
    signal.SIGSYS: "bad system call",
    signal.SIGTRAP: "trace/breakpoint trap",
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
}


def signal_word(signum: int) -> str:
    """The word of ``signal: <name>`` reasons (§0); ``signal <n>`` for the rest."""
    return _SIGNAL_WORDS.get(signum, f"signal {signum}")


def os_error_text(operation: str, path: str, exc: OSError) -> str:
    """``<operation> <path>: <lowercase description>`` (§0), from ``strerror`` when set."""
    description = exc.strerror or str(exc) or type(exc).__name__
    return f"{operation} {path}: {description.lower()}"


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` supervision needs."""

    state: str
    ppid: int
    pgrp: int
    session: int
    flags: int = 0

    @property
    def exiting(self) -> bool:
        return bool(self.flags & PF_EXITING)


def parse_stat(line: str) -> ProcStat | None:
    """One ``/proc/<pid>/stat`` line, its fields found after the *last* ``)`` (WRK-093)."""
    fields = line[line.rfind(")") + 1 :].split() if ")" in line else []
    if len(fields) < 4:
        return None
    try:
        flags = int(fields[6]) if len(fields) > 6 else 0
        return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), flags)
    except ValueError:
        return None


def _read_raw(path: str, dir_fd: int | None = None) -> bytes:
    """A whole ``/proc`` file in raw reads: no buffered file object to build each time."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        raw = b""
        while chunk := os.read(fd, 65_536):
            raw += chunk
        return raw
    finally:
        os.close(fd)


def read_stat(pid: int) -> ProcStat | None:
    try:
        raw = _read_raw(f"{PROC_ROOT}/{pid}/stat")
    except OSError:
        return None
    return parse_stat(raw.decode("utf-8", errors="replace"))


def _live(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state != "Z"


def proc_entries() -> list[str] | None:
    """The names in ``/proc`` (PIDs among them); ``None`` when it cannot be listed."""
    try:
        return os.listdir(PROC_ROOT)
    except OSError:
        return None


@dataclass(frozen=True)
class SessionOf:
    """Every process whose session ID is ``sid``: a ``tty`` job's target (WTTY-006)."""

    sid: int


#: What supervision signals and watches: a process group ID, or a whole session.
Target = int | SessionOf


def _members(target: Target) -> tuple[list[ProcStat], set[int]] | None:
    """Live members of ``target`` and every group in it; ``None``: ``/proc`` unlistable."""
    entries = proc_entries()
    if entries is None:
        return None
    session = isinstance(target, SessionOf)
    ident = target.sid if isinstance(target, SessionOf) else target
    live: list[ProcStat] = []
    groups: set[int] = set()
    for entry in entries:
        st = read_stat(int(entry)) if entry.isdigit() else None
        if st is None or (st.session if session else st.pgrp) != ident:
            continue
        groups.add(st.pgrp)
        if st.state != "Z":
            live.append(st)
    return live, groups


def _group_gone(target: Target) -> bool:
    """Signal 0 says so without a ``/proc`` scan; zombies answer it, so it never proves
    a group alive, and a session is only ever found by a scan."""
    if isinstance(target, SessionOf):
        return False
    try:
        os.killpg(target, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # something with that group exists; find out whether it is live
    return False


def group_alive(target: Target) -> bool:
    """A live member (WRK-092); blind counts as alive."""
    if _group_gone(target):
        return False
    found = _members(target)
    return found is None or bool(found[0])


JOB_ID_VAR = b"RC_JOB_ID="


def job_id_in_environ(raw: bytes) -> str:
    """The first non-empty ``RC_JOB_ID=`` of an environ (a hook's empty one names no job)."""
    for item in raw.split(b"\0"):
        if item.startswith(JOB_ID_VAR) and len(item) > len(JOB_ID_VAR):
            return item[len(JOB_ID_VAR) :].decode("utf-8", errors="surrogateescape")
    return ""


@dataclass(frozen=True)
class Carriers:
    """Live processes carrying an ``RC_JOB_ID``, by PID; ``blind``: "none" is not proven."""

    pids: dict[int, str]
    blind: bool


def scan_carriers(
    exclude: Collection[int] = (), job_id: str = "", entries: list[str] | None = None
) -> Carriers | None:
    """Every live process outside ``exclude`` carrying an ``RC_JOB_ID`` (exactly
    ``job_id`` when given: WRK-121, WRK-141); ``None`` when ``/proc`` cannot be listed.
    After every job and almost never a match: environments first, a stat only on a match."""
    entries = proc_entries() if entries is None else entries
    if entries is None:
        return None
    pids: dict[int, str] = {}
    blind = False
    try:
        root = os.open(PROC_ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Carriers(pids, True)  # listed a moment ago, unreadable now: nothing seen
    try:
        for entry in entries:
            if not entry.isdigit() or int(entry) in exclude:
                continue
            try:
                raw = _read_raw(entry + "/environ", root)
            except (FileNotFoundError, ProcessLookupError):
                continue
            except OSError:
                blind = blind or _live(int(entry))
                continue
            if JOB_ID_VAR not in raw:
                continue
            found = job_id_in_environ(raw)  # the whole value, never a prefix
            if found and found == (job_id or found) and _live(int(entry)):
                pids[int(entry)] = found
    finally:
        os.close(root)
    return Carriers(dict(sorted(pids.items())), blind)


def alone(pid: int) -> bool | None:
    """Whether no live process but ``pid`` shows in ``/proc``; ``None`` when unreadable."""
    entries = proc_entries()
    if entries is None:
        return None
    return not any(e.isdigit() and int(e) != pid and _live(int(e)) for e in entries)


def self_and_ancestors(pid: int | None = None) -> frozenset[int]:
    """``pid`` and its ancestors: a worker started inside a job inherits its ``RC_JOB_ID``."""
    current = os.getpid() if pid is None else pid
    chain = {current}
    while current > 1:
        st = read_stat(current)
        if st is None or st.ppid in chain or st.ppid <= 0:
            break
        current = st.ppid
        chain.add(current)
    return frozenset(chain)


def signal_pid(pid: int, signum: int) -> bool:
    """Signal one process; ``False`` when gone, not ours, or init."""
    if pid <= 1:
        return False
    try:
        os.kill(pid, signum)
    except OSError:
        return False
    return True


def signal_group(target: Target, signum: int) -> bool:
    """Signal a group, or every group of a session; ``True`` when it reached a member."""
    if isinstance(target, SessionOf):
        found = _members(target)
        groups = {target.sid} if found is None else found[1]
        return any([signal_group(pgid, signum) for pgid in sorted(groups)])
    if target <= 1:
        return False
    try:
        os.killpg(target, signum)
    except OSError:
        return False
    return True


async def settle_group(target: Target) -> None:
    """Let members inside exit() finish (at most ``EXIT_SETTLE``): checked too soon, the
    job's own last writer would be a straggler and a clean run killed."""
    if _group_gone(target):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXIT_SETTLE
    while loop.time() < deadline:
        found = _members(target)
        if found is None or not found[0] or not all(m.exiting for m in found[0]):
            return
        await asyncio.sleep(0.005)


async def reap_group(target: Target) -> bool:
    """SIGKILL what is left of ``target`` until it empties (WRK-096 step 4); whether it did."""
    signal_group(target, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STRAGGLER_BOUND
    while group_alive(target):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(STRAGGLER_POLL)
        signal_group(target, signal.SIGKILL)  # a member may have forked meanwhile
    return True


@dataclass(frozen=True)
class Teardown:
    """What the escalation had to do: SIGTERM reached a member; members outlived the
    leader; even SIGKILL did not empty the target in time."""

    term_delivered: bool
    stragglers: bool
    survivors: bool


async def escalate(
    target: Target,
    finished: Collection[asyncio.Future[Any]],
    leader: asyncio.Future[Any],
    *,
    grace: float,
) -> Teardown:
    """WRK-096: TERM, ``grace`` for ``finished``, KILL, wait for ``leader``, reap the rest."""
    delivered = signal_group(target, signal.SIGTERM)
    pending = [f for f in finished if not f.done()]
    if pending:
        _, still = await asyncio.wait(pending, timeout=grace)
        if still:
            signal_group(target, signal.SIGKILL)
            await asyncio.wait([leader])
    await settle_group(target)
    if not group_alive(target):
        return Teardown(delivered, False, False)
    return Teardown(delivered, True, not await reap_group(target))


def read_boot_id() -> str:
    """The boot identity read afresh; ``""`` when nothing says it."""
    with contextlib.suppress(OSError), open(BOOT_ID_PATH, encoding="utf-8") as f:
        if value := f.read().strip():
            return value
    with contextlib.suppress(OSError), open(PROC_STAT_PATH, encoding="utf-8") as f:
        for line in f:
            if line.startswith("btime "):
                return "btime-" + line[len("btime ") :].strip()
    return ""


#: Read once per process; ``boot_id.cache_clear()`` after ``BOOT_ID_PATH`` moved.
boot_id = functools.cache(read_boot_id)
