"""Every command has a help page that says what it does and names every option (CLI §1).

The walk covers every command ``rc help`` lists, lazily loaded ones included, so a
new command or a new option without help text fails here. Shell completion is
click's own; the last tests check that the script it prints really completes in bash.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from resource_controller.cli import group as main

from .conftest import Rc

RC = Path(sys.executable).parent / "rc"


def _all_commands() -> list[str]:
    ctx = click.Context(main.rc)
    return main.rc.list_commands(ctx)


def _command(name: str) -> click.Command:
    command = main.rc.get_command(click.Context(main.rc), name)
    assert command is not None, name
    return command


def test_the_walk_sees_every_command() -> None:
    names = set(_all_commands())
    assert set(main.COMMANDS) <= names
    assert {"help", "version", "run", "hold", "serve", "worker"} <= names


@pytest.mark.parametrize("name", sorted(main.COMMANDS))
def test_the_static_table_matches_the_command_it_loads(name: str) -> None:
    # rc help lists summaries from main.COMMANDS without importing the commands; the
    # entry must name a command of that name, and its summary is that command's own.
    command = _command(name)
    assert command.name == name
    summary = main.COMMANDS[name][1]
    assert summary.strip() and "\n" not in summary and len(summary) <= 70, summary
    assert command.get_short_help_str(limit=200) == summary


def test_the_overview_imports_no_command_module() -> None:
    code = (
        "import sys\n"
        "from resource_controller.cli import main\n"
        "try:\n"
        "    main.rc.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "mods = {t.partition(':')[0] for t, _ in main.COMMANDS.values()}\n"
        "print(sorted(m for m in mods if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Commands:" in out.stdout
    assert out.stderr.strip() == "[]"


@pytest.mark.parametrize("name", _all_commands())
def test_each_command_has_a_complete_help_page(run_rc: Rc, name: str) -> None:
    result = run_rc("help", name)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    page = result.stdout
    assert page.startswith(f"Usage: rc {name}"), page
    command = _command(name)
    assert (command.help or "").strip(), f"rc {name} has no description"
    assert command.help is not None and command.help.split("\n", 1)[0].strip()[:30] in " ".join(
        page.split()
    )
    for param in command.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"rc {name} {param.opts[0]} has no help text"
            for opt in param.opts + param.secondary_opts:
                assert opt in page, f"rc help {name} does not mention {opt}"
    assert "-h, --help" in page
    # rc help NAME, rc NAME --help and rc NAME -h are one page.
    assert run_rc(name, "--help").stdout == page
    assert run_rc(name, "-h").stdout == page


def test_the_overview_lists_every_command_with_a_summary(run_rc: Rc) -> None:
    out = run_rc("help").stdout
    listed = out.split("Commands:", 1)[1]
    for name in _all_commands():
        line = next((ln for ln in listed.splitlines() if ln.startswith(f"  {name} ")), "")
        assert line[len(name) + 2 :].strip(), f"rc help lists no summary for {name}"
    for word in ("RC_CONTROLLER", "RC_TOKEN", "RC_SUBMITTER", "130", "_RC_COMPLETE"):
        assert word in out, word


def _completion_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RC_", "_RC_", "COMP_"))}
    env["PATH"] = f"{RC.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("bash", "complete -o nosort -F _rc_completion rc"), ("zsh", "compdef"), ("fish", "complete")],
)
def test_completion_scripts_are_printed(shell: str, marker: str) -> None:
    env = dict(_completion_env(), _RC_COMPLETE=f"{shell}_source")
    done = subprocess.run([str(RC)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout and "_RC_COMPLETE" in done.stdout, done.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("rc ru", {"run"}),
        ("rc de", {"describe", "devices"}),
        ("rc run --sel", {"--select"}),
        ("rc logs --fo", {"--follow"}),
    ],
)
def test_bash_completion_completes_commands_and_options(words: str, expected: set[str]) -> None:
    # Source the printed script in a real bash and call its completion function the way
    # bash does on TAB: COMP_WORDS and COMP_CWORD in, COMPREPLY out.
    script = (
        'eval "$(_RC_COMPLETE=bash_source rc)"\n'
        f"COMP_WORDS=({words}); COMP_CWORD={len(words.split()) - 1}\n"
        "_rc_completion rc\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        env=_completion_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == expected, done.stdout + done.stderr
