"""Signals, process groups and `/proc`: the worker's only contact with other processes.

Everything the worker spawns leads its own process group, so "the job" is a
group ID, not a PID: a training script's data loaders and a shell's background
children live and die with it. This module answers the two questions supervision asks
of a group (is anything in it still alive, and how to make it stop), and the one the
straggler pass and the recovery proof ask of the whole table (who still carries an
``RC_JOB_ID``). Deciding *when* to ask is the callers' business.

"Alive" deliberately ignores zombies: an exited-but-unreaped member is not
holding a GPU, and counting it once made ordinary successful jobs report themselves
killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

#: Where the kernel publishes the boot ID. Tests point it elsewhere
#: (end-to-end tests through ``RC_TEST_BOOT_ID_PATH``, see ``testhooks``).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: Fallback source of a boot identity: the ``btime`` line.
PROC_STAT_PATH = "/proc/stat"
#: Root of the process table scanned for group members.
PROC_ROOT = "/proc"

#: Straggler reap: how long to wait for a SIGKILLed group to empty, and how often to
#: look. *(test hook)*
STRAGGLER_BOUND = 2.0
STRAGGLER_POLL = 0.02
#: How long members already inside exit() get to finish it before counting as
#: stragglers (see ``settle_group``). *(test hook)*
EXIT_SETTLE = 0.5

#: ``PF_EXITING`` in the ``flags`` field of ``/proc/<pid>/stat``: the process is inside
#: exit() and will never run user code again.
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
    """The word used in ``signal: <name>`` reasons (§0); ``signal <n>`` for the rest."""
    return _SIGNAL_WORDS.get(signum, f"signal {signum}")


def os_error_text(operation: str, path: str, exc: OSError) -> str:
    """Render an OS error as ``<operation> <path>: <lowercase description>`` (§0).

    Tests and operators match on the lowercase description (``no such file or
    directory``), so it comes from ``strerror`` when there is one.
    """
    description = exc.strerror or str(exc) or type(exc).__name__
    return f"{operation} {path}: {description.lower()}"


# ---- /proc ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` supervision needs."""

    state: str
    ppid: int
    pgrp: int
    session: int
    #: Kernel ``PF_*`` flags; 0 when the line was too short to carry them.
    flags: int = 0

    @property
    def exiting(self) -> bool:
        """Inside exit(): its files may already be closed, its zombie state not yet set."""
        return bool(self.flags & PF_EXITING)


def parse_stat(line: str) -> ProcStat | None:
    """Parse one ``/proc/<pid>/stat`` line; ``None`` when it is not one.

    The command name sits in parentheses and may itself contain spaces and ``)``, so
    the fields are located after the *last* ``)``.
    """
    end = line.rfind(")")
    if end < 0:
        return None
    fields = line[end + 1 :].split()
    if len(fields) < 4:
        return None
    try:
        flags = int(fields[6]) if len(fields) > 6 else 0
        return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), flags)
    except ValueError:
        return None


def _read_raw(path: str) -> bytes:
    """A whole ``/proc`` file in raw reads: no buffered file object to build each time."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        raw = b""
        while chunk := os.read(fd, 65_536):
            raw += chunk
        return raw
    finally:
        os.close(fd)


def read_stat(pid: int) -> ProcStat | None:
    """Stat of one process, or ``None`` when it is gone or unreadable."""
    try:
        raw = _read_raw(f"{PROC_ROOT}/{pid}/stat")
    except OSError:
        return None
    return parse_stat(raw.decode("utf-8", errors="replace"))


def read_environ(pid: int | str) -> bytes:
    """The NUL-separated environment of one process; ``OSError`` as the read raised it."""
    return _read_raw(f"{PROC_ROOT}/{pid}/environ")


def proc_entries() -> list[str] | None:
    """The names in ``/proc`` (PIDs among them); ``None`` when it cannot be listed."""
    try:
        return os.listdir(PROC_ROOT)
    except OSError:
        return None


def _live_members(pgid: int) -> list[ProcStat] | None:
    """Non-zombie members of group ``pgid``; ``None`` when ``/proc`` cannot be listed."""
    try:
        entries = os.listdir(PROC_ROOT)
    except OSError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        st = read_stat(int(entry))
        if st is not None and st.pgrp == pgid and st.state != "Z":
            members.append(st)
    return members


@dataclass(frozen=True)
class SessionOf:
    """Every process whose session ID is ``sid``: an interactive job's target.

    A shell under a terminal moves its pipelines into process groups of their own (job
    control), so for a ``tty`` job "the job" is the session the shell leads, not one
    group. Processes that called ``setsid`` themselves leave it (and are left to the
    ``RC_JOB_ID`` sweep).
    """

    sid: int


#: What supervision signals and watches: a process group ID, or a whole session.
Target = int | SessionOf


def _session_members(sid: int) -> tuple[list[ProcStat], set[int]] | None:
    """Non-zombie members of session ``sid`` and every group in it, zombie-only ones too."""
    try:
        entries = os.listdir(PROC_ROOT)
    except OSError:
        return None
    live: list[ProcStat] = []
    groups: set[int] = set()
    for entry in entries:
        if not entry.isdigit():
            continue
        st = read_stat(int(entry))
        if st is None or st.session != sid:
            continue
        groups.add(st.pgrp)
        if st.state != "Z":
            live.append(st)
    return live, groups


def _live_of(target: Target) -> list[ProcStat] | None:
    if isinstance(target, SessionOf):
        found = _session_members(target.sid)
        return None if found is None else found[0]
    return _live_members(target)


def target_alive(target: Target) -> bool:
    """``group_alive`` for a group; for a session, any non-zombie member."""
    if isinstance(target, SessionOf):
        members = _live_of(target)
        return members is None or bool(members)
    return group_alive(target)


def signal_target(target: Target, signum: int) -> bool:
    """Signal a group, or every distinct group of a session (zombie-only groups too)."""
    if not isinstance(target, SessionOf):
        return signal_group(target, signum)
    found = _session_members(target.sid)
    groups = {target.sid} if found is None else found[1]
    delivered = False
    for pgid in sorted(groups):
        delivered = signal_group(pgid, signum) or delivered
    return delivered


def _group_has_live_member(pgid: int) -> bool:
    members = _live_members(pgid)
    # Blind is not empty: a group we cannot see is treated as alive.
    return members is None or bool(members)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie.

    The cheap existence check (signal 0) comes first; only if something answers is
    ``/proc`` scanned, because an unreaped zombie answers signal 0 too.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # something with that group exists; find out whether it is live
    return _group_has_live_member(pgid)


# ---- environments: who carries which RC_JOB_ID ---------------------------------------

JOB_ID_VAR = b"RC_JOB_ID="


def job_id_in_environ(raw: bytes) -> str:
    """The value of the first non-empty ``RC_JOB_ID=`` entry of a NUL-separated environ.

    ``""`` when there is none. Hooks run with an empty ``RC_JOB_ID=``, which
    names no job, so a later non-empty entry still counts.
    """
    for item in raw.split(b"\0"):
        if item.startswith(JOB_ID_VAR) and len(item) > len(JOB_ID_VAR):
            return item[len(JOB_ID_VAR) :].decode("utf-8", errors="surrogateescape")
    return ""


@dataclass(frozen=True)
class JobIdScan:
    """One pass over ``/proc`` reading every live process's ``RC_JOB_ID``."""

    #: ``/proc`` itself could be listed; when false nothing else here means anything.
    readable: bool
    #: Live (non-zombie) processes carrying a non-empty ``RC_JOB_ID``, with its value.
    carriers: dict[int, str]
    #: Some live process's environment could not be read (permission): the scan may
    #: have missed a carrier, so "none found" is not "none exist".
    blind: bool
    #: Every live process seen, carriers or not (for the isolation check).
    live: frozenset[int] = frozenset()


def scan_job_ids(exclude: Collection[int] = ()) -> JobIdScan:
    """Read the ``RC_JOB_ID`` of every live process not in ``exclude``.

    Non-numeric entries, processes whose stat cannot be read and zombies are skipped;
    a process that vanishes mid-scan (not found, no such process) is neither a carrier
    nor blindness; any other error reading an environment (permission) is blindness.
    """
    try:
        entries = os.listdir(PROC_ROOT)
    except OSError:
        return JobIdScan(readable=False, carriers={}, blind=False)
    carriers: dict[int, str] = {}
    live: set[int] = set()
    blind = False
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in exclude:
            continue
        st = read_stat(pid)
        if st is None or st.state == "Z":
            continue
        live.add(pid)
        try:
            with open(f"{PROC_ROOT}/{pid}/environ", "rb") as f:
                raw = f.read()
        except (FileNotFoundError, ProcessLookupError):
            live.discard(pid)  # gone between the stat and the environ
            continue
        except OSError:
            blind = True
            continue
        job_id = job_id_in_environ(raw)
        if job_id:
            carriers[pid] = job_id
    return JobIdScan(readable=True, carriers=carriers, blind=blind, live=frozenset(live))


def self_and_ancestors(pid: int | None = None) -> frozenset[int]:
    """``pid`` (default: this process) and every ancestor up to init.

    The walk follows parent PIDs through ``/proc/<pid>/stat`` and ends at the first
    entry it cannot read. A worker started from inside a job inherits that job's
    ``RC_JOB_ID``, and so does its parent: neither may be swept.
    """
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
    """Send ``signum`` to one process; ``False`` when it is gone or not ours to signal."""
    if pid <= 1:
        return False  # never init, never "every process"
    try:
        os.kill(pid, signum)
    except OSError:
        return False
    return True


# ---- signals -------------------------------------------------------------------------


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to every member of group ``pgid``; ``True`` if it was delivered.

    "Delivered" means the call succeeded for at least one member;
    an empty or foreign group is simply not delivered to.
    """
    if pgid <= 1:
        return False  # never signal our own group or every process by accident
    try:
        os.killpg(pgid, signum)
    except OSError:
        return False
    return True


async def settle_group(pgid: Target) -> None:
    """Let members that are already exiting finish, for at most ``EXIT_SETTLE``.

    A process closes its files (so the job's pipe reaches end of file) a moment before
    it becomes a zombie. Checking for stragglers in that moment would catch the job's
    own last writer mid-exit and label a clean run killed, the very mislabel WRK-092
    exists to prevent. Only members flagged as exiting are waited for; anything else
    ends the settling at once.
    """
    if not isinstance(pgid, SessionOf):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return  # the group is gone entirely: nothing to settle, no /proc scan
        except PermissionError:
            pass
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXIT_SETTLE
    while loop.time() < deadline:
        members = _live_of(pgid)
        if not members or not all(m.exiting for m in members):
            return
        await asyncio.sleep(0.005)


async def reap_group(pgid: Target) -> bool:
    """SIGKILL whatever is left in group (or session) ``pgid`` and wait for it to empty.

    Polls every ``STRAGGLER_POLL`` for at most ``STRAGGLER_BOUND`` seconds and returns
    whether the group emptied.
    """
    signal_target(pgid, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STRAGGLER_BOUND
    while target_alive(pgid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(STRAGGLER_POLL)
        signal_target(pgid, signal.SIGKILL)  # a member may have forked meanwhile
    return True


@dataclass(frozen=True)
class Teardown:
    """What the escalation had to do, which decides how the result is labelled."""

    #: SIGTERM reached at least one member.
    term_delivered: bool
    #: The group was still alive after the leader was gone, so it was SIGKILLed again.
    stragglers: bool
    #: Even that did not empty the group within the bound.
    survivors: bool


async def escalate(
    pgid: Target,
    finished: Collection[asyncio.Future[Any]],
    leader: asyncio.Future[Any],
    *,
    grace: float,
) -> Teardown:
    """TERM, wait up to ``grace``, KILL, then reap stragglers.

    ``finished`` are the futures whose completion means the process is done (leader
    exited and its output drained); ``leader`` completes when the leader has exited and
    been reaped. Neither is cancelled here: the caller owns them.
    """
    delivered = signal_target(pgid, signal.SIGTERM)
    pending: Collection[asyncio.Future[Any]] = [f for f in finished if not f.done()]
    if pending:
        _, still = await asyncio.wait(pending, timeout=grace)
        if still:
            signal_target(pgid, signal.SIGKILL)
            await asyncio.wait([leader])
    stragglers = False
    survivors = False
    await settle_group(pgid)
    if target_alive(pgid):
        stragglers = True
        survivors = not await reap_group(pgid)
    return Teardown(delivered, stragglers, survivors)


def kill_group_now(pgid: Target) -> None:
    """Best-effort SIGKILL, for teardown paths that cannot wait (task cancellation)."""
    if isinstance(pgid, SessionOf):
        signal_target(pgid, signal.SIGKILL)
        return
    with contextlib.suppress(OSError):
        if pgid > 1:
            os.killpg(pgid, signal.SIGKILL)


# ---- boot identity -------------------------------------------------------------------

_boot_id: str | None = None


def read_boot_id() -> str:
    """Read the boot identity afresh; ``""`` when nothing says it."""
    try:
        with open(BOOT_ID_PATH, encoding="utf-8") as f:
            value = f.read().strip()
        if value:
            return value
    except OSError:
        pass
    try:
        with open(PROC_STAT_PATH, encoding="utf-8") as f:
            for line in f:
                if line.startswith("btime "):
                    return "btime-" + line[len("btime ") :].strip()
    except OSError:
        pass
    return ""


def boot_id() -> str:
    """The boot identity, read once per process and cached."""
    global _boot_id
    if _boot_id is None:
        _boot_id = read_boot_id()
    return _boot_id


def forget_boot_id() -> None:
    """Drop the cached boot identity (``BOOT_ID_PATH`` was pointed elsewhere)."""
    global _boot_id
    _boot_id = None
