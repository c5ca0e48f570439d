"""``RC_TEST_CRASH_AT``: its grammar, its inertness when unset, and that each name is real."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from resource_controller import crashpoints

SRC = Path(crashpoints.__file__).parent


def test_a_name_alone_means_the_first_hit() -> None:
    assert crashpoints.parse("submit.before_commit") == ("submit.before_commit", 1)
    assert crashpoints.parse(" finish.after_commit:3 ") == ("finish.after_commit", 3)
    assert crashpoints.parse("") is None
    assert crashpoints.parse(None) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submit", "unknown crash point 'submit'"),
        ("nowhere.after_commit:2", "unknown crash point 'nowhere.after_commit'"),
        ("submit.before_commit:0", "whole number >= 1"),
        ("submit.before_commit:x", "whole number >= 1"),
        ("submit.before_commit:", "whole number >= 1"),
        ("submit.before_commit:-1", "whole number >= 1"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(text: str, message: str) -> None:
    with pytest.raises(crashpoints.CrashPointError, match=re.escape(message)) as info:
        crashpoints.parse(text)
    assert str(info.value).startswith("RC_TEST_CRASH_AT: ")


def test_every_point_is_reached_from_the_store() -> None:
    """A listed point no write path reaches would make its crash test pass vacuously."""
    text = "\n".join(p.read_text() for p in (SRC / "store").glob("*.py"))
    # Every name a transaction is opened with (``core.tx("finish")``).
    calls = re.findall(r"\.tx\(([^()]*)\)", text)
    named = {name for call in calls for name in re.findall(r'"([a-z_]+)"', call)}
    hits = set(re.findall(r'crashpoints\.hit\("([a-z_]+)", "(\.[a-z_]+)"\)', text))
    reached = {f"{n}{phase}" for n in named for phase in (".before_commit", ".after_commit")}
    reached |= {f"{n}{phase}" for n, phase in hits}
    assert reached == set(crashpoints.POINTS)


def test_disarmed_hits_do_nothing() -> None:
    crashpoints.arm("")
    for point in crashpoints.POINTS:
        name, _, phase = point.partition(".")
        crashpoints.hit(name, "." + phase)


def test_an_armed_point_exits_at_its_nth_hit_and_not_before(tmp_path: Path) -> None:
    script = (
        "import sys; from resource_controller import crashpoints as c\n"
        "c.arm('finish.after_commit:3')\n"
        "for i in range(5):\n"
        "    c.hit('finish', '.before_commit'); c.hit('submit', '.after_commit')\n"
        "    c.hit('finish', '.after_commit'); print(i, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == crashpoints.CRASH_STATUS
    assert done.stdout.split() == ["0", "1"]
    assert "RC_TEST_CRASH_AT: crashing at finish.after_commit" in done.stderr


@pytest.mark.e2e
def test_rc_serve_refuses_a_bad_crash_point_at_start(tmp_path: Path) -> None:
    rc = str(Path(sys.executable).parent / "rc")
    done = subprocess.run(
        [rc, "serve", "--addr", "127.0.0.1:0", "--data", str(tmp_path / "data")],
        env={"RC_TOKENS": "a:admin", "RC_TEST_CRASH_AT": "submit.maybe", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "rc: RC_TEST_CRASH_AT: unknown crash point 'submit.maybe'" in done.stderr
