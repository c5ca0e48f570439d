"""``rc run``'s click-free parser builds click's request, and leaves click every error.

Each command line of the matrix is parsed both ways in-process: by ``fastrun.parse``
and by the click command (its run machine replaced by a recorder, so nothing is
sent). A line the fast parser accepts must give the very same ``RunRequest``; a line
it does not accept (an unknown form, or any that click refuses) must come back None,
so that ``rc`` hands it to click, which says the error in its own words.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from resource_controller.cli import fastrun
from resource_controller.cli import run as run_machine
from resource_controller.cli.group import rc as rc_group
from resource_controller.client import config

RC = Path(sys.executable).parent / "rc"

#: Lines the fast parser takes: click must build the same request from each.
ACCEPTED = [
    ["--", "true"],
    ["true"],
    ["-d", "box:gpu0", "--", "true"],
    ["-dbox:gpu0", "--", "true"],
    ["-d=box:gpu0", "--", "true"],
    ["--device=box:gpu0", "--", "true"],
    ["--device", "box:gpu0", "true", "arg"],
    ["true", "-d", "box:gpu1"],
    ["true", "--", "-x", "--", "y"],
    ["-d", "x", "-d", "y", "--", "z"],
    ["-d", "--", "--", "x"],
    ["--device", "-x", "--", "y"],
    ["--", "-d", "x"],
    ["true", "-", "x"],
    ["-d", "a:0,a:1", "--", "x"],
    ["-d", "a:1, a:0", "--count", "2", "--", "x"],
    ["--select", "vram>=40G", "--", "python", "t.py"],
    ["--select=", "--", "x"],
    ["--count", "0x2", "--select", "gpu", "--", "x"],
    ["--count=3", "--", "x"],
    ["--count", "2", "--", "y"],
    ["--", "--help"],
    ["--priority", "-3", "--", "x"],
    ["--priority=+5", "--", "x"],
    ["--priority", "0o7", "--", "x"],
    ["--max-runtime", "1h30m", "--idle-timeout", "90s", "--timeout", "10m", "--", "x"],
    ["--max-runtime", "1.9s", "--", "x"],
    ["--max-runtime", "596523h14m7s", "--idle-timeout", "596523h14m7s", "--", "x"],
    ["--max-runtime=0", "--idle-timeout", "0s", "--", "x"],
    ["--timeout", "0.25s", "--", "x"],
    ["--env", "A=1", "--env", "B=2=3", "--", "x"],
    ["--env=A=", "--", "x"],
    ["--no-wait", "--", "x"],
    ["--no-wait", "--no-wait", "-d", "b:0", "--", "x"],
    ["--here", "--", "x"],
    ["--no-here", "--", "x"],
    ["--no-here", "--here", "--", "x"],
    ["--here", "--no-here", "--", "x"],
    ["--here", "--env", "PATH=/mine", "--", "x"],
    ["--cwd", "sub/dir", "--", "x"],
    ["--cwd=/abs/../dir", "--", "x"],
    ["--here", "--cwd", "rel", "--", "x"],
    ["--cwd", "", "--here", "--", "x"],
]

#: Lines left to click: forms the fast parser does not take, and every refusal.
LEFT_TO_CLICK = [
    [],
    ["--"],
    ["--tty"],
    ["--tty", "-d", "x"],
    ["-i", "--", "cat"],
    ["--interactive", "--", "cat"],
    ["--explain", "--select", "x"],
    ["--explain"],
    ["--as", "bob", "--", "x"],
    ["--as=", "--", "x"],
    ["-h"],
    ["--help"],
    ["--no-wait=true", "--", "x"],
    ["--no-wait=false", "--", "x"],
    ["--here=false", "--", "x"],
    ["--no-here=yes", "--", "x"],
    ["-x"],
    ["--bogus", "--", "x"],
    ["--dev", "x", "--", "y"],
    ["-id", "x", "--", "y"],
    ["ls", "-la"],
    ["-d"],
    ["--device"],
    ["--select"],
    ["--count", "x", "--", "y"],
    ["--count", "0", "--", "y"],
    ["--count", "2", "-d", "a:0", "--", "y"],
    ["--count", "3", "-d", "a:0,a:1", "--", "y"],
    ["--priority", "1.5", "--", "y"],
    ["--max-runtime", "0.5s", "--", "y"],
    ["--idle-timeout", "500ms", "--", "y"],
    ["--max-runtime", "99999999999h", "--", "y"],
    ["--idle-timeout", "596523h14m8s", "--", "y"],
    ["--max-runtime", "-1s", "--", "y"],
    ["--timeout", "forever", "--", "y"],
    ["--timeout", "-5s", "--", "y"],
    ["-d", "a", "--select", "b", "--", "x"],
    ["-d", "a:0,b:0", "--", "x"],
    ["-d", "a:0,,a:1", "--", "x"],
    ["-d", "a:0,a:0", "--", "x"],
    ["--env", "NOEQUALS", "--", "x"],
    ["--env", "=v", "--", "x"],
    ["--env"],
    # EXT-SHARE-2: --after and --after-any are click's alone.
    ["--after", "1b2c3d4e", "--", "x"],
    ["--after=1b2c3d4e,5f6a7b8c", "--", "x"],
    ["-d", "a:0", "--after", "1b2c3d4e", "--after-any", "--", "x"],
    ["--after-any", "--", "x"],
    ["--after", "", "--", "x"],
    ["--after", "a,,b", "--", "x"],
    ["--after", "1b2c3d4e", "--no-wait", "--", "x"],
]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RC_CONTROLLER", "http://127.0.0.1:9")
    monkeypatch.setenv("RC_TOKEN", "t")
    monkeypatch.setenv("RC_SUBMITTER", "tester")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("VIRTUAL_ENV", "/venv")


def click_request(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[object, str]:
    """What click's ``rc run ARGV`` would send (or None) and its stderr."""
    seen: list[run_machine.RunRequest] = []

    def record(_client: object, req: run_machine.RunRequest) -> int:
        seen.append(req)
        return 0

    monkeypatch.setattr(run_machine, "run", record)
    config.reset()
    result = CliRunner().invoke(rc_group, ["run", *argv], catch_exceptions=False)
    config.reset()
    return (seen[0] if seen else None), result.stderr


@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_an_accepted_line_builds_clicks_request(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = fastrun.parse(list(argv))
    slow, stderr = click_request(argv, monkeypatch)
    assert slow is not None, stderr
    assert fast == slow


@pytest.mark.parametrize("argv", LEFT_TO_CLICK, ids=lambda a: " ".join(a) or "(empty)")
def test_anything_else_is_left_to_click(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert fastrun.parse(list(argv)) is None


@pytest.mark.parametrize("here", ["true", "false"])
def test_the_config_files_run_here_applies_alike(
    here: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"run:\n  here: {here}\n")
    monkeypatch.setenv("RC_CONFIG", str(path))
    for argv in (["--", "x"], ["--no-here", "--", "x"], ["--cwd", "d", "--", "x"]):
        config.reset()
        fast = fastrun.parse(list(argv))
        slow, stderr = click_request(argv, monkeypatch)
        assert slow is not None, stderr
        assert fast == slow


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--count", "x", "--", "y"],
        ["run", "-d", "a", "--select", "b", "--", "x"],
        ["run", "--max-runtime", "0.5s", "--", "y"],
        ["run", "--max-runtime", "99999999999h", "--", "y"],
        ["run", "ls", "-la"],
    ],
    ids=" ".join,
)
def test_a_refused_line_reads_as_click_says_it(argv: list[str]) -> None:
    env = {**os.environ, "RC_CONTROLLER": "http://127.0.0.1:9"}
    done = subprocess.run([str(RC), *argv], env=env, capture_output=True, text=True, timeout=60)
    config.reset()
    expected = CliRunner().invoke(rc_group, argv)
    assert (done.returncode, done.stderr) == (expected.exit_code, expected.stderr)
    assert done.returncode == 1 and done.stderr.startswith("rc: ")


def test_click_takes_after_into_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """EXT-SHARE-2: each job once, in order; refused before any request otherwise."""
    argv = ["--after", "aaaaaaa, bbbbbbb,aaaaaaa", "--after-any", "--", "x"]
    req, _ = click_request(argv, monkeypatch)
    assert isinstance(req, run_machine.RunRequest)
    assert req.after == ("aaaaaaa", "bbbbbbb") and req.after_any is True
    for bad, words in (
        (["--after-any", "--", "x"], "--after-any needs --after"),
        (["--after", "a,,b", "--", "x"], "--after has an empty job ID"),
        (["--after", "aaaaaaa", "--no-wait", "--", "x"], "cannot be used together"),
        (["--after", ",".join(f"j{i:06d}" for i in range(65)), "--", "x"], "at most 64"),
    ):
        req, err = click_request(bad, monkeypatch)
        assert req is None and words in err, err


def test_the_fast_path_loads_no_click() -> None:
    # Port 9 refuses: the run fails at its first request, after every import it needs.
    code = (
        "import sys\n"
        "sys.argv = ['rc', 'run', '-d', 'box:gpu0', '--', 'true']\n"
        "from resource_controller.cli import main\n"
        "try:\n"
        "    main.main()\n"
        "except SystemExit as e:\n"
        "    assert e.code == 1, e.code\n"
        # h11 (the one HTTP/1.1 core) brings typing, dataclasses and inspect along.
        "heavy = ('click', 'http', 'email', 'ssl', 'urllib')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    env = {**os.environ, "RC_CONTROLLER": "http://127.0.0.1:9", "RC_TOKEN": "t"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr
    assert "POST http://127.0.0.1:9/v1/jobs" in done.stderr
