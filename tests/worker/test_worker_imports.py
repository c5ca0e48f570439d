"""What the worker imports: no HTTP library, nothing of the controller's frameworks.

The worker runs on every device host, so every MiB it loads is paid fleet-wide. These
tests pin the causes, in a fresh interpreter: which modules loading the worker (and
running ``rc worker``'s plain-http path up to its first request) must not bring in.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Never loaded: the worker's HTTP is ``h1``'s, on h11.
FORBIDDEN = (
    "httpx",
    "httpcore",
    "anyio",
    "urllib.request",
    "http.client",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "click",
    "resource_controller.controller",
    "resource_controller.store",
    "resource_controller.client",
)


def _loaded(code: str) -> list[str]:
    """The forbidden modules (or their submodules) loaded after running ``code``."""
    probe = code + (
        "\nimport json, sys\n"
        f"bad = {FORBIDDEN!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if any(m == b or m.startswith(b + '.') for b in bad))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_worker_loads_no_http_library_nor_controller_framework() -> None:
    assert _loaded("import resource_controller.worker.process") == []


def test_a_plain_http_request_loads_no_http_library() -> None:
    """Opening the channel and sending one request (refused) stays on ``h1``."""
    code = (
        "import asyncio, os, socket\n"
        "os.environ.pop('http_proxy', None); os.environ.pop('HTTP_PROXY', None)\n"
        "os.environ.pop('all_proxy', None); os.environ.pop('ALL_PROXY', None)\n"
        "from resource_controller.clock import SystemClock\n"
        "from resource_controller.worker import channel, reconnect\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "async def main():\n"
        "    ch = channel.Channel(f'http://127.0.0.1:{port}', 't', SystemClock(),\n"
        "                         reconnect.Reconnect())\n"
        "    async with ch.open():\n"
        "        assert await ch.heartbeat([], []) != ''\n"
        "asyncio.run(main())\n"
    )
    assert _loaded(code) == []
