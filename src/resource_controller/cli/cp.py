"""``rc cp``: a copy is a short pinned pipe-mode job running the box's ``tar``.

It never queues (a held device is refused before the submit). Archives stream
through an OS pipe, never assembled. What a box sends is untrusted (CLI-168).
A signal must abort from ordinary code, not the loop's machinery, where it would be
dropped or hang exit on a thread pool's lock (CLI-170).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import signal
import stat
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, NamedTuple, TypeVar

import click

from resource_controller import errors
from resource_controller.cli import common, render, signals
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.cli.tty import JobWatch, SessionError, open_halves, write_all
from resource_controller.client import api, machine
from resource_controller.core.states import JobState
from resource_controller.h1 import aio

#: How long the copy job may take to end after the transfer.
COPY_WAIT = 30 * 60.0
BLOCK = 65_536
UPLOAD_SCRIPT = 'mkdir -p "$0" && exec tar -xf - -C "$0"'
DOWNLOAD_SCRIPT = 'exec tar -cf - -C "$0" -- "$1"'
ABORTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

T = TypeVar("T")


class Remote(NamedTuple):
    """``host:name:path``: a device and a path on its host."""

    device: str
    path: str


def parse_side(arg: str) -> Remote | None:
    """One argument: remote, or ``None`` for a local path."""
    head, colon, tail = arg.rpartition(":")
    if not colon:
        return None
    host, sep, name = head.partition(":")
    if sep and host and name and ":" not in name:
        if not tail:
            raise common.Failure(
                f"{arg!r} names a device but no path (e.g. {head}:/workspace/file)"
            )
        return Remote(head, tail)
    if not sep and tail.startswith("/"):
        raise common.Failure(
            f"{arg!r} is not a device path: remote paths are host:name:path"
            f" (e.g. dgx:{head or 'gpu0'}:{tail})"
        )
    return None


def _strip_dir(path: str) -> str:
    return path.rstrip("/") or "/"


def upload_target(source: str, remote_path: str) -> tuple[str, str]:
    """(directory on the box, entry name) for an upload."""
    base = os.path.basename(os.path.normpath(os.path.abspath(source)))
    if remote_path.endswith("/") or posixpath.basename(remote_path) in ("", ".", ".."):
        return _strip_dir(remote_path), base
    parent, name = posixpath.split(remote_path)
    return (_strip_dir(parent) if parent else "."), name


def download_source(remote_path: str) -> tuple[str, str]:
    """(directory on the box, entry name) for a download."""
    path = remote_path[:-1] if remote_path.endswith("/") and remote_path != "/" else remote_path
    parent, name = posixpath.split(path)
    if not name:
        raise common.Failure(f"{remote_path!r} names no file to fetch")
    return (_strip_dir(parent) if parent else "."), name


def _add(tar: tarfile.TarFile, path: str, arcname: str) -> None:
    """One entry, and a directory's contents after it in lexical order."""
    st = os.lstat(path)
    mode = st.st_mode
    info = tarfile.TarInfo(arcname)
    info.mode = mode & 0o777
    info.mtime = int(st.st_mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISREG(mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        with open(path, "rb") as f:
            tar.addfile(info, f)
    elif stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for child in sorted(os.listdir(path)):
            _add(tar, os.path.join(path, child), f"{arcname}/{child}")
    elif stat.S_ISLNK(mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)  # verbatim, never followed
        tar.addfile(info)
    elif stat.S_ISSOCK(mode):
        raise common.Failure(f"cannot copy {path}: it is a socket")
    else:
        kinds = {stat.S_ISFIFO: tarfile.FIFOTYPE, stat.S_ISCHR: tarfile.CHRTYPE}
        info.type = next((t for test, t in kinds.items() if test(mode)), tarfile.BLKTYPE)
        if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
        tar.addfile(info)  # special files carry no content


def write_archive(out: IO[bytes], source: str, name: str) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, source, name)


class UnsafeEntry(Exception):
    """An entry that would land outside the destination; the message names it."""


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def extract(source: IO[bytes], dest: str, rename: str | None) -> None:
    """Extract a tar stream into ``dest`` under the rules of CLI-168."""
    os.makedirs(dest, mode=0o755, exist_ok=True)
    root = os.path.realpath(dest)
    with tarfile.open(fileobj=source, mode="r|") as tar:
        for member in tar:
            name = member.name
            if rename is not None:
                first, sep, rest = name.partition("/")
                name = rename + sep + rest if first else name
            if name.startswith("/"):
                raise UnsafeEntry(f"entry {member.name!r} has an absolute name")
            clean = posixpath.normpath(name)
            if clean == ".." or clean.startswith("../"):
                raise UnsafeEntry(f"entry {member.name!r} escapes the destination")
            target = os.path.join(root, clean)
            if member.isdir():
                os.makedirs(target, mode=0o755, exist_ok=True)
                os.chmod(target, member.mode & 0o777)
            elif member.issym():
                link_dir = posixpath.dirname(clean)
                pointed = posixpath.normpath(posixpath.join(root, link_dir, member.linkname))
                if not _inside(root, pointed):
                    raise UnsafeEntry(
                        f"symlink {member.name!r} points outside the destination"
                        f" ({member.linkname!r})"
                    )
                _parent_inside(root, target, member.name)
                if os.path.lexists(target):
                    os.unlink(target)
                os.symlink(member.linkname, target)
            elif member.isreg():
                _parent_inside(root, target, member.name)
                data = tar.extractfile(member)
                assert data is not None
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    while block := data.read(BLOCK):
                        f.write(block)
                os.chmod(target, member.mode & 0o777)  # explicitly: no umask in between
            # hard links, devices, FIFOs and anything else: skipped


def _parent_inside(root: str, target: str, entry: str) -> None:
    parent = os.path.dirname(target)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if not _inside(root, os.path.realpath(parent)):
        raise UnsafeEntry(f"entry {entry!r} escapes the destination through a symlink")


async def _open_relay(base: str, token: str, job_id: str) -> tuple[aio.Exchange, aio.Exchange]:
    try:
        return await open_halves(base, token, job_id, "the copy's {} half")
    except SessionError as e:
        raise common.Failure(str(e)) from None


async def _send(
    base: str, token: str, job_id: str, produce: Callable[[IO[bytes]], None], local: str
) -> None:
    """Upload; the input half is ALWAYS closed afterwards, or the far-side tar never ends."""
    sent_error: str = ""
    async with _halves(base, token, job_id) as (out, inp, watch):
        read_fd, write_fd = os.pipe()
        producer = asyncio.create_task(asyncio.to_thread(_pump, produce, write_fd, "wb"))
        drain = asyncio.create_task(_discard(out))
        try:
            while block := await asyncio.to_thread(os.read, read_fd, BLOCK):
                try:
                    await inp.write(block)
                except errors.TransportError as e:
                    if not watch.ended:  # else the job's own end explains it
                        sent_error = f"sending {local}: {e}"
                    break
        finally:
            os.close(read_fd)  # a producer still writing gets EPIPE and ends
            with contextlib.suppress(errors.TransportError):
                await inp.finish()  # EOF ends the far-side tar
            failure = await producer
            with contextlib.suppress(errors.TransportError):
                await drain
    if watch.ended:
        return  # the job ended without the session: its outcome says why
    if failure is not None and not sent_error:
        if isinstance(failure, common.Failure):
            raise failure
        raise common.Failure(f"reading {local}: {failure}")
    if sent_error:
        raise common.Failure(sent_error)


def _pump(work: Callable[[IO[bytes]], None], fd: int, mode: str) -> BaseException | None:
    """``work`` on one end of the pipe (a thread); what failed it, if anything."""
    try:
        with os.fdopen(fd, mode) as f:
            work(f)
    except BrokenPipeError:
        return None  # the sender stopped; it says why
    except (OSError, tarfile.TarError, common.Failure, UnsafeEntry) as e:
        return e
    return None


async def _discard(out: aio.Exchange) -> None:
    while await out.read():
        pass


@contextlib.asynccontextmanager
async def _halves(
    base: str, token: str, job_id: str
) -> AsyncIterator[tuple[aio.Exchange, aio.Exchange, JobWatch]]:
    """The copy's relay halves, closed on the way out, and the watch that closes them once
    the job is over without them."""
    out, inp = await _open_relay(base, token, job_id)

    def end() -> None:
        out.close()
        inp.close()

    watch = JobWatch(base, token, job_id, end)
    watching = asyncio.create_task(watch.run(), name=f"cp-job-{job_id}")
    try:
        yield out, inp, watch
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        end()


async def _abortable(transfer: Awaitable[T]) -> T:
    """The first signal cancels ``transfer`` and, after its clean-up, raises ``Interrupted``."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(transfer)
    caught = 0

    def unhook() -> None:
        for sig in ABORTING:
            loop.remove_signal_handler(sig)

    def abort(signum: int) -> None:
        nonlocal caught
        if not caught:
            caught = signum
            unhook()
            signals.restore_defaults()
            task.cancel()

    try:
        for sig in ABORTING:
            loop.add_signal_handler(sig, abort, sig)
    except ValueError:  # not the main thread: signals stay where they are
        return await task
    try:
        return await task
    except asyncio.CancelledError:
        if caught:
            raise signals.Interrupted(caught) from None
        raise
    finally:
        if not caught:
            unhook()
            signals.install()  # what follows the transfer interrupts as before


async def _receive(
    base: str, token: str, job_id: str, consume: Callable[[IO[bytes]], None]
) -> BaseException | None:
    """Download: the input half closed at once, the output half extracted."""
    broke = ""
    async with _halves(base, token, job_id) as (out, inp, watch):
        with contextlib.suppress(errors.TransportError):
            await inp.finish()
        read_fd, write_fd = os.pipe()
        consumer = asyncio.create_task(asyncio.to_thread(_pump, consume, read_fd, "rb"))
        try:
            while block := await out.read():
                try:
                    await asyncio.to_thread(write_all, write_fd, block)
                except BrokenPipeError:
                    break  # the extraction stopped; it says why
        except errors.TransportError as e:
            # Ended by the watch: the job ended without the session, its outcome says why.
            broke = "" if watch.ended else f"the copy's output broke: {e}"
        finally:
            os.close(write_fd)  # end of the archive for the reader
    failure = await consumer
    if broke:
        raise common.Failure(broke)
    return failure


def _check_free(client: api.JsonClient, device: str) -> None:
    """CLI-162: the lease check, before anything is submitted."""
    views = client.state().get("devices") or []
    view = next((v for v in views if (v.get("device") or {}).get("id") == device), None)
    if view is None:
        raise common.Failure(f"no such device {device}")
    holder = view.get("holder") or ""
    if holder and holder != client.submitter:
        what = " (a hold)" if view.get("kind") == "hold" else ""
        raise errors.DeviceHeldByAnother(
            f"{device} is held by {holder}{what}; rc cp copies only onto a free device"
        )
    if holder:
        raise common.Failure(
            f"you already hold {device} (job {view.get('job_id', '')}): release it first,"
            " or copy from inside that session"
        )


def _submit(client: api.JsonClient, device: str, *command: str) -> str:
    """CLI-163: once the device is seen free, a pinned pipe job that refuses to queue."""
    _check_free(client, device)
    try:
        job = client.submit(["/bin/sh", "-c", *command], device=device, stdio="pipe", no_wait=True)
    except errors.NoDeviceError as e:
        raise errors.DeviceHeldByAnother(
            f"{device} was taken between the check and the copy request"
        ) from e
    return str(job.get("id", ""))


def _finish(client: api.JsonClient, job_id: str) -> None:
    """CLI-169: wait for the copy job; a non-success fails with its reason."""
    try:
        job = client.wait_until_terminal(job_id, bound=COPY_WAIT)
    except errors.ClientError as e:
        raise common.Failure(str(e)) from e
    state = job.get("state")
    if state == JobState.SUCCEEDED:
        return
    reason = ""
    try:
        with client.follow_logs(job_id, follow=False) as stream:
            reason = b"".join(stream).decode(errors="replace").strip()
    except errors.ClientError:
        reason = ""  # the controller refuses log reads of pipe jobs
    code = job.get("exit_code")
    exited = f"the far side exited {code}" if isinstance(code, int) and code else ""
    reason = reason or job.get("kill_reason") or exited or machine.NO_DETAIL
    raise common.Failure(f"copy job {job_id} {state}: {reason}")


def copy(client: api.JsonClient, src: str, dst: str) -> None:
    remote_src, remote_dst = parse_side(src), parse_side(dst)
    if remote_src is not None and remote_dst is not None:
        raise common.Failure(
            f"rc cp copies between here and one box: {src!r} and {dst!r} are both remote"
        )
    if remote_src is None and remote_dst is None:
        raise common.Failure("one side of rc cp must be a device path, host:name:path")
    base, token = client.relay_target()
    if remote_dst is not None:
        try:
            os.lstat(src)
        except OSError as e:
            raise common.Failure(f"cannot read {src}: {e.strerror or e}") from None
        directory, name = upload_target(src, remote_dst.path)
        job_id = _submit(client, remote_dst.device, UPLOAD_SCRIPT, directory)
        render.say(f"copying {src} to {remote_dst.device}:{remote_dst.path} (job {job_id})")
        asyncio.run(
            _abortable(_send(base, token, job_id, lambda f: write_archive(f, src, name), src))
        )
        _finish(client, job_id)
        return
    assert remote_src is not None
    directory, name = download_source(remote_src.path)
    into_dir = dst.endswith("/") or os.path.isdir(dst)
    dest = dst if into_dir else (os.path.dirname(dst) or ".")
    rename = None if into_dir else os.path.basename(dst)
    where = f"{remote_src.device}:{remote_src.path}"
    job_id = _submit(client, remote_src.device, DOWNLOAD_SCRIPT, directory, name)
    render.say(f"fetching {where} to {dst} (job {job_id})")
    failure = asyncio.run(
        _abortable(_receive(base, token, job_id, lambda f: extract(f, dest, rename)))
    )
    if isinstance(failure, UnsafeEntry):
        raise common.Failure(f"{where}: {failure}")
    _finish(client, job_id)  # a far-side failure explains a broken archive best
    if failure is not None:
        raise common.Failure(f"{where}: cannot extract: {failure}")


@click.command("cp", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("src")
@click.argument("dst")
@common.as_option()
def cp(src: str, dst: str, as_: str) -> None:
    """Copy a file or tree to or from a device: SRC and DST, one of them host:name:path.

    The copy is a short job on the device, so the device must be free (it never
    queues, not even behind your own hold). Modes, the executable bit included, and
    symlinks (as links) are kept.
    """
    client = api.JsonClient(submitter=as_ or None)
    copy(client, src, dst)
