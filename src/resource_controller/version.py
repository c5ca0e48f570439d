"""The installed package's version, read without ``importlib.metadata`` when it can be:
that imports about 40 ms of modules to read one ``METADATA`` line. Anything unusual
falls back to it.
"""

from __future__ import annotations

import os
import sys

#: The distribution's name as ``pyproject.toml`` gives it.
DIST_NAME = "resource-controller"
#: The normalised prefix of its ``*.dist-info`` directory (PEP 503/427: ``-`` → ``_``).
_DIST_INFO_PREFIX = "resource_controller-"

UNKNOWN = "unknown (not installed as a package)"


def installed_version(default: str = UNKNOWN) -> str:
    """The installed version, the same answer ``importlib.metadata.version`` gives."""
    found = _from_dist_info(sys.path)
    if found is not None:
        return found
    from importlib import metadata

    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return default


def _from_dist_info(path: list[str]) -> str | None:
    """``Version:`` of the first ``resource_controller-*.dist-info`` on ``path``; ``None``:
    ask ``importlib.metadata``, for every layout not understood here."""
    for entry in path:
        where = entry or "."
        try:
            names = os.listdir(where)
        except NotADirectoryError:
            return None  # a zip or egg file on the path: the library searches inside it
        except OSError:
            continue  # a missing directory, as importlib.metadata skips it
        lower = [n for n in names if n.lower().startswith(_DIST_INFO_PREFIX)]
        if not lower:
            continue
        candidates = [n for n in lower if n.endswith(".dist-info")]
        if len(candidates) != 1 or len(lower) != 1:
            return None  # an .egg-info, or several installs in one directory
        return _version_header(os.path.join(where, candidates[0], "METADATA"))
    return None


def _version_header(metadata_file: str) -> str | None:
    """The ``Version:`` header of a core-metadata file (RFC 822 headers, blank line ends)."""
    try:
        with open(metadata_file, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    return None
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() == "version":
                    return value.strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    return None
