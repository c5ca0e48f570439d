"""Usage sheets (§19): ``<sheet_dir>/host.md`` and ``host.d/<device>.md``, read fresh at
every registration and push. Missing is empty (it clears); unreadable is left out, so
the controller keeps its copy. The 64 KiB cap: a larger sheet would fail the whole request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from resource_controller.worker import procs

log = logging.getLogger(__name__)

SHEET_CAP = 65_536
TRUNCATION_MARKER = "\n...(truncated: sheet exceeds 64KB)\n"
HOST_SHEET = "host.md"
DEVICE_SHEETS = "host.d"


def cap(raw: bytes, where: str = "sheet") -> str:
    """``raw`` as text within ``SHEET_CAP`` bytes, marker included, cut at a character."""
    text = raw.decode("utf-8", "replace")
    encoded = text.encode("utf-8")
    if len(encoded) <= SHEET_CAP:
        return text
    cut = SHEET_CAP - len(TRUNCATION_MARKER.encode("utf-8"))
    while cut > 0 and (encoded[cut] & 0xC0) == 0x80:
        cut -= 1  # never split a character
    log.warning(
        "usage sheet %s is %d bytes; sending the first part within the %d-byte cap",
        where,
        len(raw),
        SHEET_CAP,
        extra={"action": "sheet_truncated"},
    )
    return encoded[:cut].decode("utf-8") + TRUNCATION_MARKER


def read_sheet(path: str) -> str | None:
    """The sheet at ``path``: ``""`` when the file does not exist, ``None`` when unknown."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        log.warning(
            "usage sheet unreadable, the controller keeps its copy: %s",
            procs.os_error_text("open", path, exc),
            extra={"action": "sheet_unreadable"},
        )
        return None
    return cap(raw, path)


@dataclass(frozen=True)
class Sheets:
    """The ``sheet`` and ``device_sheets`` fields of a request; ``None``: left out."""

    sheet: str | None
    device_sheets: dict[str, str] | None


def read_sheets(sheet_dir: str, device_names: Iterable[str]) -> Sheets:
    """Read ``host.md`` and every configured device's ``host.d/<name>.md`` now."""
    host = read_sheet(os.path.join(sheet_dir, HOST_SHEET))
    devices: dict[str, str] = {}
    for name in device_names:
        text = read_sheet(os.path.join(sheet_dir, DEVICE_SHEETS, name + ".md"))
        if text is not None:
            devices[name] = text
    return Sheets(host, devices or None)
