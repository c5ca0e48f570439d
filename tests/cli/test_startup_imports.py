"""What ``rc``'s start-up imports: help and version pages load no transport (issue 14).

Timings are measured by ``bench/startup.py``, never asserted; these tests pin the
causes instead: which heavy modules a page that makes no request must not load.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Loaded only by a command that talks to a controller (h11 brings typing and
#: dataclasses), or never (http.client brings email and ssl).
HEAVY = (
    "h11",
    "dataclasses",
    "http.client",
    "email",
    "ssl",
    "importlib.metadata",
    "resource_controller.client.transport",
)


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["run", "--help"], ["ps", "--help"], ["help", "logs"]]
)
def test_pages_that_make_no_request_load_no_transport(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from resource_controller.cli import main\n"
        "try:\n"
        f"    main.rc.main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout
    assert out.stderr.strip() == "[]"


def test_a_client_still_loads_its_transport_when_built() -> None:
    """... but not ``urllib.parse`` for plain URLs (``client.urls``: ~2.5 ms of ``rc run``)."""
    code = (
        "import sys\n"
        "from resource_controller.client import api, calls\n"
        "c = api.JsonClient(controller='http://127.0.0.1:9', token='t')\n"
        "path = calls.job_path('8c1f2a44-95b5-4c43-9c0b-2a4b0d6d8f10') + '/logs'\n"
        "c._http.bases.target(0, path, {'follow': '1'})\n"
        "calls.device_path('box:gpu0')\n"
        "print(type(c._http).__module__, 'urllib.parse' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "resource_controller.client.transport False"
