"""What ``rc``'s start-up imports: help and version pages load no transport (issue 14).

Timings are measured by ``bench/startup.py``, never asserted; these tests pin the
causes instead: which heavy modules a page that makes no request must not load.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Loaded only by a command that talks to a controller: http.client brings email, ssl.
HEAVY = (
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
    code = (
        "import sys\n"
        "from resource_controller.client import api\n"
        "c = api.Client(controller='http://127.0.0.1:9', token='t')\n"
        "print(type(c._http).__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "resource_controller.client.transport"
