"""A small real filesystem to fill up or turn read-only under a running process.

``SmallDisk`` mounts a tmpfs of a few MiB at a directory (root in a container may;
``available()`` says whether this machine allows it, and the tests skip otherwise).
``fill()`` writes a filler file until the filesystem refuses with ENOSPC, so every
later write that needs a new block fails as it would on a full disk; ``free()``
removes the filler. ``read_only()`` bind-mounts the directory over itself read-only:
new files and opens for writing fail with EROFS, while descriptors the process opened
before keep writing (they belong to the mount underneath), which is how a remount
read-only under a live process looks too when the kernel allows it at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from pathlib import Path

MIB = 1024 * 1024
FILLER = ".filler"


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=10)


def available() -> str:
    """``""`` when a tmpfs can be mounted here, else why not (for a skip message)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    with tempfile.TemporaryDirectory(prefix="rc-disk-probe-") as d:
        r = _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", d)
        if r.returncode != 0:
            return f"cannot mount a tmpfs: {r.stderr.strip()}"
        subprocess.run(["umount", d], capture_output=True, timeout=10)
    return ""


class SmallDisk:
    """A tmpfs of ``size`` bytes at ``path``, unmounted by ``close``."""

    def __init__(self, path: Path, size: int = 4 * MIB) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        r = _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
        if r.returncode != 0:
            raise RuntimeError(f"mount tmpfs at {path}: {r.stderr.strip()}")
        self._ro = False

    def fill(self) -> int:
        """Write a filler until the disk is full; the bytes written."""
        written = 0
        chunk = b"\0" * 65536
        fd = os.open(self.path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                try:
                    n = os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]  # fill the last partial block too
                    continue
                written += n
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        """Remove the filler: the disk has room again."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / FILLER).unlink()

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def read_only(self) -> None:
        """New files and new write opens under ``path`` fail with EROFS from now on."""
        for args in (
            ("--bind", str(self.path), str(self.path)),
            ("-o", "remount,bind,ro", str(self.path)),
        ):
            r = _mount(*args)
            if r.returncode != 0:
                raise RuntimeError(f"mount {' '.join(args)}: {r.stderr.strip()}")
        self._ro = True

    def read_write(self) -> None:
        """Undo ``read_only``."""
        if self._ro:
            subprocess.run(["umount", str(self.path)], capture_output=True, timeout=10, check=True)
            self._ro = False

    def close(self) -> None:
        """Unmount everything mounted here (lazily: a process may still hold a file)."""
        self.read_write()
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=10)
