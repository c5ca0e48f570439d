"""``rc run``'s one parser (CLI-001, CLI-002, CLI-005, CLI-006): what each line asks for,
what it refuses, and that ``rc`` and the click group read it alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from resource_controller.cli import basics
from resource_controller.cli import run as run_cli
from resource_controller.cli.group import rc as rc_group
from resource_controller.client import config

RC = Path(sys.executable).parent / "rc"


def parsed(*argv: str) -> tuple[dict[str, Any], list[str]]:
    return run_cli.parse(list(argv))


@pytest.mark.parametrize(
    ("argv", "values", "command"),
    [
        (["--", "true"], {}, ["true"]),
        (["true", "-d", "box:gpu1"], {"device": "box:gpu1"}, ["true"]),  # flags anywhere
        (["-dbox:gpu0", "--", "x"], {"device": "box:gpu0"}, ["x"]),
        (["-d=box:gpu0", "--", "x"], {"device": "=box:gpu0"}, ["x"]),  # as click reads it
        (["--device=a:0", "--", "x"], {"device": "a:0"}, ["x"]),
        (["-d", "x", "-d", "y", "--", "z"], {"device": "y"}, ["z"]),  # the last one wins
        (["-d", "--", "--", "x"], {"device": "--"}, ["x"]),  # a value is taken verbatim
        (["true", "--", "-x", "--", "y"], {}, ["true", "-x", "--", "y"]),
        (["true", "-", "x"], {}, ["true", "-", "x"]),
        (["--count", "0x2", "--priority=-3", "--", "x"], {"count": 2, "priority": -3}, ["x"]),
        (
            ["--max-runtime", "1h30m", "--timeout=0.25s", "x"],
            {"max_runtime": 5400.0, "timeout": 0.25},
            ["x"],
        ),
        (["--env", "A=1", "--env=B=2=3", "x"], {"env": ["A=1", "B=2=3"]}, ["x"]),
        (["--no-here", "--here", "x"], {"here": True}, ["x"]),
        (["--here=false", "x"], {"here": False}, ["x"]),
        (["--no-here=false", "x"], {"here": True}, ["x"]),
        (["--no-wait=true", "--no-wait=0", "x"], {"no_wait": False}, ["x"]),
        (["-id", "b:0", "--", "cat"], {"interactive": True, "device": "b:0"}, ["cat"]),
        (["--tty"], {"tty": True}, []),
        (
            ["--as", "bob", "--after", "a1b2c3", "--after-any", "x"],
            {"as_": "bob", "after": "a1b2c3", "after_any": True},
            ["x"],
        ),
    ],
)
def test_a_line_asks_for_what_click_would_read_in_it(
    argv: list[str], values: dict[str, Any], command: list[str]
) -> None:
    got, rest = parsed(*argv)
    assert rest == command
    assert {k: got[k] for k in values} == values
    assert got["here"] is None or "here" in values  # unset means the config decides


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--bogus", "--", "x"], "no such option: --bogus"),
        (["ls", "-la"], "no such option: -l"),  # CLI-002: a flag-like word needs --
        (["--dev", "x", "--", "y"], "no such option: --dev"),
        (["-d"], "option -d requires an argument"),
        (["--env"], "option --env requires an argument"),
        (["--count", "x", "--", "y"], "--count: invalid integer 'x'"),
        (["--priority", "1.5", "--", "y"], "--priority: invalid integer"),
        (["--timeout", "forever", "--", "y"], "invalid duration 'forever'"),
        (["--timeout", "-5s", "--", "y"], "negative"),
        (["--no-here=yes", "x"], "invalid boolean value 'yes' for --no-here"),
    ],
)
def test_a_line_it_cannot_read_is_refused_naming_the_problem(argv: list[str], words: str) -> None:
    with pytest.raises(basics.Failure, match=words):
        parsed(*argv)


@pytest.mark.parametrize("argv", [["-h"], ["x", "--help"]])
def test_help_anywhere_before_the_command_end_is_the_page(argv: list[str]) -> None:
    with pytest.raises(run_cli._Help):
        parsed(*argv)
    assert parsed("--", "--help")[1] == ["--help"]  # after --, the job's own


@pytest.mark.parametrize("here", ["true", "false"])
def test_the_config_files_run_here_decides_when_no_flag_does(
    here: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"run:\n  here: {here}\n")
    monkeypatch.setenv("RC_CONFIG", str(path))
    monkeypatch.setenv("VIRTUAL_ENV", "/venv")
    monkeypatch.chdir(tmp_path)
    config.reset()
    try:
        wanted = run_cli.build(*parsed("--", "x"))
        assert (wanted.cwd == str(tmp_path)) == (here == "true")
        assert (wanted.env.get("VIRTUAL_ENV") == "/venv") == (here == "true")
        assert run_cli.build(*parsed("--no-here", "--", "x")).env == {}
    finally:
        config.reset()


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--count", "x", "--", "y"],
        ["run", "-d", "a", "--select", "b", "--", "x"],
        ["run", "--max-runtime", "0.5s", "--", "y"],
        ["run", "--max-runtime", "99999999999h", "--", "y"],
        ["run", "ls", "-la"],
        ["run", "--after", "a,,b", "--", "x"],
    ],
    ids=" ".join,
)
def test_rc_and_the_click_group_refuse_a_line_alike(argv: list[str]) -> None:
    env = {**os.environ, "RC_CONTROLLER": "http://127.0.0.1:9"}
    done = subprocess.run([str(RC), *argv], env=env, capture_output=True, text=True, timeout=60)
    config.reset()
    expected = CliRunner().invoke(rc_group, argv)
    assert (done.returncode, done.stderr) == (expected.exit_code, expected.stderr)
    assert done.returncode == 1 and done.stderr.startswith("rc: ")
    assert done.stderr.count("\n") == 1  # CLI-003: one line, no usage text


def test_a_plain_run_loads_no_click() -> None:
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
        "heavy = ('click', 'http', 'email', 'ssl', 'urllib', 'pydantic', 'asyncio')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    env = {**os.environ, "RC_CONTROLLER": "http://127.0.0.1:9", "RC_TOKEN": "t"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr
    assert "POST http://127.0.0.1:9/v1/jobs" in done.stderr


def test_the_help_page_names_every_flag_and_the_exit_codes() -> None:
    page = run_cli.page()
    assert page.startswith("Usage: rc run [OPTIONS] [--] COMMAND [ARGS]...")
    for flags, *_ in run_cli.OPTIONS:
        for flag in flags:
            assert flag in page
    assert "--no-here" in page and "-h, --help" in page
    assert "130" in page and "75" in page and "rc logs ID" in page
