"""The bounds on what a request may carry (EXT-LIMITS-1), written once here, so nothing over one
reaches the store where it could break a later pass."""

from __future__ import annotations

import re
from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

#: Largest JSON request body, read no further: bounds a request's memory.
BODY_BYTES = MIB


@dataclass(frozen=True)
class IntRange:
    """An integer field's inclusive range."""

    low: int
    high: int
    reason: str

    def text(self) -> str:
        return f"{self.low}..{self.high}"


@dataclass(frozen=True)
class Size:
    """A size bound: ``size`` UTF-8 bytes in all and, for a collection, ``count`` items."""

    size: int
    reason: str
    count: int | None = None
    unit: str = ""  #: what ``count`` counts ("arguments", "entries")


#: Seconds a job may run or idle, or a device's ceiling: 0..2³¹−1, 68 years.
#: Why: a deadline now + runtime + margin must fit every database's 64-bit integer.
SECONDS = IntRange(0, 2**31 - 1, "68 years; a deadline computed from it fits any database")

#: A process exit status as the worker reports it (signals as negative numbers).
#: Why: the column is a plain integer; nothing outside 32 bits is a real exit status.
EXIT_CODE = IntRange(-(2**31), 2**31 - 1, "exit statuses are 32-bit; the column is an integer")

#: Devices one job may ask for on one host: keeps a ``device_ids`` list and a pass's work small.
DEVICE_COUNT = IntRange(1, 1024, "more devices than any one host carries")

#: Retries a job may ask for (EXT-RETRY-1): a job failing eleven times is failing, not unlucky.
RETRIES = IntRange(0, 10, "a job that fails eleven times needs a person, not a twelfth try")

#: Submit's strings and collections.
COMMAND = Size(256 * KIB, "an argv the kernel would run", count=4096, unit="arguments")
ENV = Size(256 * KIB, "an environment the kernel would accept", count=1024, unit="entries")
CWD = Size(4 * KIB, "a path the kernel would accept (PATH_MAX)")
SELECTOR = Size(4 * KIB, "a selector a person could write; parsing it stays cheap")
SUBMITTER = Size(KIB, "a label, not a document")
REASON = Size(KIB, "a label, not a document")
IDEMPOTENCY_KEY = Size(256, "a key, not a payload")

#: The jobs one job may wait for, and one job ID's length.
#: Why: the list is checked, stored and shown with the job; a job ID is a UUID (36).
AFTER = Size(64, "a job ID is a UUID", count=64, unit="job IDs")

#: Host and device names: what one URL path segment carries unescaped.
NAME_CHARS = 128
NAME_ALPHABET = "A-Z a-z 0-9 . _ -"
_NAME = re.compile(r"[A-Za-z0-9._-]*")


def name_ok(name: str) -> bool:
    """True when ``name`` is at most 128 characters of ``A-Z a-z 0-9 . _ -`` (empty included)."""
    return len(name) <= NAME_CHARS and _NAME.fullmatch(name) is not None


def utf8_len(text: str) -> int:
    """Bytes ``text`` takes on the wire (a lone surrogate counts as the escape JSON sends)."""
    return len(text.encode("utf-8", "surrogatepass"))
