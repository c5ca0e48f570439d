"""How ``rc run`` ends on its fast path (``exits.leave_now``): without the interpreter's
teardown only when nothing else would run at exit, and never losing output or its code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PRELUDE = "import sys\nfrom resource_controller.cli import exits\n"
#: Buffered streams, as ``rc`` has them unless told otherwise: what a bare ``os._exit``
#: would lose.
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _run(body: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + body],
        capture_output=True,
        timeout=30,
        check=False,
        env=BUFFERED,
    )


@pytest.mark.parametrize("code", [0, 3])
def test_buffered_output_and_the_code_survive_a_fast_exit(code: int) -> None:
    # A large write goes out at once; the small one after it and stderr's line stay in
    # the buffers, which a bare os._exit would drop.
    out = _run(
        "sys.stdout.write('x' * 300_000)\nsys.stdout.write('end')\nsys.stderr.write('said')\n"
        f"exits.leave_now({code})"
    )
    assert out.returncode == code
    assert out.stdout == b"x" * 300_000 + b"end"
    assert out.stderr == b"said"


def test_an_exit_handler_still_runs(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    out = _run(
        "import atexit, pathlib\n"
        f"atexit.register(pathlib.Path({str(mark)!r}).write_text, 'yes')\n"
        "exits.leave_now(4)"
    )
    assert out.returncode == 4
    assert mark.read_text() == "yes"


def test_a_running_thread_is_waited_for(tmp_path: Path) -> None:
    mark = tmp_path / "done"
    out = _run(
        "import threading, time, pathlib\n"
        "def late():\n"
        "    time.sleep(0.2)\n"
        f"    pathlib.Path({str(mark)!r}).write_text('yes')\n"
        "threading.Thread(target=late).start()\n"
        "exits.leave_now(0)"
    )
    assert out.returncode == 0
    assert mark.read_text() == "yes"


def test_a_closed_stdout_turns_success_into_failure() -> None:
    # Nobody reads stdout: the buffered bytes meet the closed pipe at the final flush.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + "sys.stdout.write('x' * 100)\nexits.leave_now(0)"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=BUFFERED,
        )
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert b"broken pipe" in err and b"Traceback" not in err
