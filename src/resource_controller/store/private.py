"""The data directory is for the controller's user alone: it holds every job's output and env."""

from __future__ import annotations

import os
from pathlib import Path

#: Directories: owner only.
DIR_MODE = 0o700
#: Files: owner read and write.
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) if missing, and make it the owner's alone (an
    existing one too: an older version may have left it world-readable)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if (os.stat(path).st_mode & 0o777) != DIR_MODE:
        os.chmod(path, DIR_MODE)


def private_file(path: Path) -> None:
    """Create ``path`` empty if missing as 0600, or tighten an existing one to 0600."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        if (os.fstat(fd).st_mode & 0o777) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
