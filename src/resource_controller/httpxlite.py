"""httpx without its command-line tool, for the processes that import it on a rare path.

httpx imports its own command-line tool at import time whenever click, rich and
pygments happen to be installed (about 80 modules, 4.5 MiB resident), and no part of
``rc`` uses it. A ``None`` entry makes that optional import fail just as httpx expects
when they are absent, so it keeps its stub. An httpx already imported by the host
process is left as it is.
"""

from __future__ import annotations

import sys

if "httpx" not in sys.modules:
    sys.modules["httpx._main"] = None  # type: ignore[assignment]

import httpx

__all__ = ["httpx"]
