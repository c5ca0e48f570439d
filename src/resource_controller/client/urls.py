"""URL pieces for the client, as ``urllib.parse`` makes them, without its import.

Importing ``urllib.parse`` (it brings ``ipaddress`` and ``warnings``) costs ``rc run``
about 2.5 ms of a ~40 ms command, and what ``rc`` puts in a URL is nearly always
plain: a UUID job ID, ``host:gpu0``, ``follow=1``, ``http://host:8080``. Each
function here answers those directly and hands anything else to ``urllib.parse``, so
every answer is ``urllib.parse``'s own (``tests/client/test_urls.py`` holds them equal).
"""

from __future__ import annotations

from collections.abc import Iterable

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from resource_controller.client.records import NamedTuple

#: What ``urllib.parse.quote`` never escapes, whatever ``safe`` says.
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
#: What a base URL's host, port and path are made of when the direct split applies.
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
_PATH_CHARS = _UNRESERVED | frozenset("/")


class Split(NamedTuple):
    """The parts of a base URL that the transport uses (``urllib.parse.SplitResult``'s)."""

    scheme: str
    hostname: str | None
    port: int | None
    path: str


def quote(text: str, safe: str) -> str:
    """``urllib.parse.quote(text, safe=safe)`` (which keeps only the ASCII of ``safe``)."""
    if _UNRESERVED.union(c for c in safe if c.isascii()).issuperset(text):
        return text
    import urllib.parse

    return urllib.parse.quote(text, safe=safe)


def urlencode(pairs: Iterable[tuple[str, str]]) -> str:
    """``urllib.parse.urlencode(pairs)``."""
    pairs = list(pairs)
    if all(_plain(k) and _plain(v) for k, v in pairs):
        return "&".join(f"{k}={v}" for k, v in pairs)
    import urllib.parse

    return urllib.parse.urlencode(pairs)


def _plain(value: object) -> bool:
    return isinstance(value, str) and _UNRESERVED.issuperset(value)


def split(url: str) -> Split:
    """``urllib.parse.urlsplit(url)``'s scheme, hostname, port and path.

    Raises ``ValueError`` where reading ``.port`` would (out of range)."""
    direct = _split_plain(url)
    if direct is not None:
        return direct
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return Split(parts.scheme, parts.hostname, parts.port, parts.path)


def _split_plain(url: str) -> Split | None:
    """``http(s)://host[:port][/path]`` with a lower-case name, a port of at most five
    digits and a plain path; ``None`` for anything else."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        return None
    netloc, slash, path = rest.partition("/")
    host, colon, digits = netloc.partition(":")
    if not host or not _HOST_CHARS.issuperset(host):
        return None
    if colon and not (0 < len(digits) <= 5 and digits.isascii() and digits.isdigit()):
        return None
    if not _PATH_CHARS.issuperset(path):
        return None
    port = int(digits) if colon else None
    if port is not None and port > 65535:
        raise ValueError("Port out of range 0-65535")
    return Split(scheme, host, port, slash + path)
