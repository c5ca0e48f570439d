"""Parsing, validation and help: nothing here reaches a controller (CLI §1-2, CLI-101)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from cli.conftest import Rc
from resource_controller.client import config


@pytest.fixture(autouse=True)
def dead_controller(monkeypatch: pytest.MonkeyPatch) -> str:
    """A controller address that refuses: any request shows up as 'connection refused'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("RC_CONTROLLER", url)
    monkeypatch.setenv("RC_TOKEN", "ctok")
    return url


def one_error(result: object, exit_code: int = 1) -> str:
    """The result failed with exactly one ``rc:`` line on stderr and nothing on stdout."""
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)  # type: ignore[attr-defined]
    err: str = result.stderr  # type: ignore[attr-defined]
    assert err.startswith("rc: ") and err.count("\n") == 1, err
    assert result.stdout == ""  # type: ignore[attr-defined]
    assert "Usage:" not in err  # CLI-003: no usage text on error
    return err


def requested(result: object) -> bool:
    return "connection refused" in result.stderr  # type: ignore[attr-defined]


# ---- CLI-101: rc run validation order ---------------------------------------------------------


def test_run_needs_a_command(run_rc: Rc) -> None:
    err = one_error(run_rc("run", "-d", "box:gpu0"))
    assert "command" in err


def test_device_and_select_are_exclusive(run_rc: Rc) -> None:
    err = one_error(run_rc("run", "-d", "box:gpu0", "--select", "a=b", "--", "true"))
    assert "--device" in err and "--select" in err


def test_command_check_comes_first(run_rc: Rc) -> None:
    err = one_error(run_rc("run", "-d", "x", "--select", "a=b"))
    assert "command" in err


def test_explain_needs_select(run_rc: Rc) -> None:
    err = one_error(run_rc("run", "--explain"))
    assert err.startswith("rc: --explain needs --select SELECTOR") and not requested_text(err)


@pytest.mark.parametrize("device", ["box:gpu0", "box:gpu0,box:gpu1"])
def test_explain_of_a_device_says_what_explain_takes(run_rc: Rc, device: str) -> None:
    # CLI-101 (3): the explain route previews a selector (API-064); a pinned device has
    # nothing to match, and the message says where to look instead.
    err = one_error(run_rc("run", "--explain", "-d", device))
    assert "needs" not in err and not requested_text(err)
    assert "--select" in err and "-d/--device" in err and "rc describe DEVICE" in err


def requested_text(err: str) -> bool:
    return "connection refused" in err


def test_explain_with_both_names_both(run_rc: Rc) -> None:
    err = one_error(run_rc("run", "--explain", "-d", "x", "--select", "a=b"))
    assert "--device" in err and "--select" in err


@pytest.mark.parametrize(
    ("flag", "value"), [("--max-runtime", "500ms"), ("--idle-timeout", "0.5s")]
)
def test_sub_second_ceilings_are_refused_before_submit(run_rc: Rc, flag: str, value: str) -> None:
    err = one_error(run_rc("run", flag, value, "--", "true"))
    assert flag in err and "second" in err


@pytest.mark.parametrize("flag", ["--max-runtime", "--idle-timeout"])
@pytest.mark.parametrize("value", ["99999999999h", "596523h14m8s"])
def test_ceilings_over_the_limit_name_the_flag(run_rc: Rc, flag: str, value: str) -> None:
    err = one_error(run_rc("run", flag, value, "--", "true"))  # EXT-LIMITS-1
    assert err == f"rc: {flag} must be at most 596523h14m7s (2147483647 seconds, about 68 years)\n"
    assert "_seconds" not in err


@pytest.mark.parametrize("flag", ["--max-runtime", "--idle-timeout"])
def test_the_longest_ceiling_reaches_the_submit(run_rc: Rc, flag: str) -> None:
    result = run_rc("run", flag, "596523h14m7s", "--", "true")
    assert result.exit_code == 1 and requested(result), result.stderr


def test_the_ceiling_limit_is_the_controllers() -> None:
    from resource_controller.client import submit
    from resource_controller.core import durations, limits

    assert limits.SECONDS.high == submit.MAX_CEILING
    assert durations.render_duration(limits.SECONDS.high) == submit.MAX_CEILING_TEXT
    assert limits.AFTER.count == submit.AFTER_MAX


@pytest.mark.parametrize("flag", ["--max-runtime", "--idle-timeout", "--timeout"])
@pytest.mark.parametrize("value", ["-1s", "-0.5h", "-1h30m"])
def test_negative_durations_are_usage_errors(run_rc: Rc, flag: str, value: str) -> None:
    # EXT-CLI-8: refused before any request, naming the flag.
    err = one_error(run_rc("run", f"{flag}={value}", "--", "true"))
    assert flag in err and "negative" in err and not requested_text(err)


@pytest.mark.parametrize("flag", ["--max-runtime", "--idle-timeout", "--timeout"])
def test_zero_duration_keeps_its_meaning(run_rc: Rc, flag: str) -> None:
    assert requested(run_rc("run", flag, "0", "--", "true"))
    assert requested(run_rc("run", flag, "-0s", "--", "true"))


def test_neither_device_nor_selector_submits(run_rc: Rc) -> None:
    result = run_rc("run", "--", "true")  # EXT-CLI-1: any device
    assert result.exit_code == 1 and requested(result)
    assert "POST" in result.stderr and "/v1/jobs" in result.stderr  # CLI-043 names the request


# ---- CLI-001/005/006: flag syntax -----------------------------------------------------------


@pytest.mark.parametrize("value", ["2d", "10", "1h 30m", "", "abc"])
def test_bad_duration_names_the_flag(run_rc: Rc, value: str) -> None:
    err = one_error(run_rc("run", "--timeout", value, "--", "true"))
    assert "--timeout" in err


@pytest.mark.parametrize("value", ["90s", "1h30m", "1.5h", "300ms", "0", "2µs", "+1m"])
def test_good_durations_reach_the_request(run_rc: Rc, value: str) -> None:
    assert requested(run_rc("run", f"--timeout={value}", "--", "true"))


@pytest.mark.parametrize("value", ["5", "-3", "0x0a", "0o7", "+2"])
def test_good_integers(run_rc: Rc, value: str) -> None:
    assert requested(run_rc("run", "--priority", value, "--", "true"))


@pytest.mark.parametrize("value", ["1.5", "ten", "0b1", "", "1e3"])
def test_bad_integers_name_the_flag(run_rc: Rc, value: str) -> None:
    err = one_error(run_rc("run", "--priority", value, "--", "true"))
    assert "--priority" in err


@pytest.mark.parametrize("value", ["true", "false", "1", "0", "TRUE", "f"])
def test_boolean_flags_take_explicit_values(run_rc: Rc, value: str) -> None:
    assert requested(run_rc("run", f"--no-wait={value}", "--", "true"))


def test_boolean_flag_rejects_other_values(run_rc: Rc) -> None:
    err = one_error(run_rc("run", "--no-wait=maybe", "--", "true"))
    assert "--no-wait" in err


def test_value_that_looks_like_a_boolean_flag_is_left_alone(run_rc: Rc) -> None:
    assert requested(run_rc("run", "--cwd", "--no-wait=maybe", "--", "true"))


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--bogus", "--", "true"],
        ["run", "-d", "x", "echo", "-n", "hi"],  # CLI-002: flag-like command words need --
        ["nosuch"],
        [],
        ["kill"],
        ["kill", "a", "b"],
        ["jobs", "stray"],  # CLI-004: rc jobs rejects positionals
        ["logs"],
        ["attach", "a", "b"],
        ["run", "--env", "NOEQUALS", "--", "true"],
        ["run", "--env", "=v", "--", "true"],
    ],
)
def test_usage_errors_are_one_line_exit_1(run_rc: Rc, args: list[str]) -> None:
    one_error(run_rc(*args))


def test_flags_anywhere_before_double_dash(run_rc: Rc) -> None:
    assert requested(run_rc("run", "python", "-d", "box:gpu0", "train.py", "--no-wait"))


def test_stray_positionals_ignored_by_ps_and_devices(run_rc: Rc) -> None:
    assert requested(run_rc("ps", "stray"))
    assert requested(run_rc("devices", "-o", "json", "stray"))


# ---- CLI-140, EXT-CLI-3: output formats are checked before any request ------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "-o", "yaml"],
        ["ps", "-o", "yaml"],
        ["ps", "--output=x", "stray"],
        ["devices", "-o", "yaml"],
        ["devices", "--output=x"],
        ["devices", "-o", "stray"],  # EXT-CLI-3: -o takes a real value now
        ["devices", "--json", "-o", "yaml"],
        ["describe", "d", "-o", "txt"],
    ],
)
def test_unknown_output_format(run_rc: Rc, args: list[str]) -> None:
    err = one_error(run_rc(*args))
    assert "unknown output format" in err and "text" in err and "json" in err


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "-o", "JSON"],
        ["ps", "-o", "json"],
        ["ps", "-o", "Text", "stray"],
        ["devices", "-o", "text"],
        ["devices", "--output", "json"],
        ["devices", "-ojson"],
        ["devices", "--json"],
        ["devices", "-o"],  # EXT-CLI-3: a bare -o is the base switch, json
        ["devices", "-o", "--json"],
        ["devices", "-o", "--json=true"],
        ["devices", "-o", "--select", "a=b"],
        ["describe", "d", "-o", "Json"],
    ],
)
def test_known_output_formats_any_case(run_rc: Rc, args: list[str]) -> None:
    assert requested(run_rc(*args))


# ---- CLI-177: retire without --yes ----------------------------------------------------------------


def test_retire_needs_yes(run_rc: Rc) -> None:
    result = run_rc("retire", "box:gpu0")
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "box:gpu0" in lines[0] and "--yes" in lines[0]
    assert "not confirmed" in lines[1]
    assert not requested(result)


# ---- CLI §1: help ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [["--help"], ["-h"], ["help"], ["help", "run"], ["run", "-h"], ["logs", "--help"]]
)
def test_help_goes_to_stdout_exit_0(run_rc: Rc, args: list[str]) -> None:
    result = run_rc(*args)
    assert result.exit_code == 0, result.stderr
    assert "Usage: rc" in result.stdout and result.stderr == ""


def test_help_lists_commands_without_importing_them(run_rc: Rc) -> None:
    out = run_rc("--help").stdout
    for name in (
        "run",
        "kill",
        "release",
        "attach",
        "logs",
        "jobs",
        "ps",
        "devices",
        "serve",
        "up",
    ):
        assert f"  {name} " in out


def test_help_for_unknown_command(run_rc: Rc) -> None:
    one_error(run_rc("help", "nosuch"))


@pytest.mark.parametrize("args", [["--version"], ["version"]])
def test_version_prints_the_installed_version(run_rc: Rc, args: list[str]) -> None:
    from importlib import metadata

    result = run_rc(*args)  # EXT-CLI-8
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"rc {metadata.version('resource-controller')}\n"
    assert result.stderr == "" and not requested(result)


def test_version_is_listed_in_help(run_rc: Rc) -> None:
    out = run_rc("--help").stdout
    assert "--version" in out and "  version " in out


def test_version_does_not_import_the_server() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from resource_controller.cli import main\n"
        "try:\n    main.rc.main(['--version'])\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('fastapi', 'uvicorn', 'sqlalchemy', 'httpx', 'yaml')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]", out.stdout


# ---- EXT-CLI-8: rc jobs --state and an unreachable controller ------------------------------------


def test_unknown_state_lists_the_valid_ones(run_rc: Rc) -> None:
    err = one_error(run_rc("jobs", "--state", "bogus"))
    assert "bogus" in err and not requested_text(err)
    for state in ("queued", "assigned", "running", "succeeded", "failed", "killed", "lost"):
        assert state in err


def test_known_state_reaches_the_request(run_rc: Rc) -> None:
    assert requested(run_rc("jobs", "--state", "running"))


def test_refused_names_url_and_rc_controller(run_rc: Rc, dead_controller: str) -> None:
    err = one_error(run_rc("ps"))
    assert f"GET {dead_controller}/v1/state: connection refused" in err
    assert f"controller {dead_controller} from RC_CONTROLLER" in err
    assert "rc up" not in err  # it was configured: starting another one is no advice


def test_refused_names_the_config_file(
    run_rc: Rc, dead_controller: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "rc.yaml"
    cfg.write_text(f'controller: "{dead_controller}"\n')
    monkeypatch.delenv("RC_CONTROLLER")
    monkeypatch.setenv("RC_CONFIG", str(cfg))
    err = one_error(run_rc("devices"))
    assert f"controller {dead_controller} from the config file {cfg}" in err
    assert "rc up" not in err


def test_refused_default_suggests_rc_up(
    run_rc: Rc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RC_CONTROLLER")
    monkeypatch.setenv("RC_CONFIG", os.devnull)
    monkeypatch.setattr(config, "DEFAULT_CONTROLLER", f"http://127.0.0.1:{closed_port()}")
    err = one_error(run_rc("ps"))
    assert f"controller {config.DEFAULT_CONTROLLER} is the built-in default" in err
    assert "rc up" in err and "RC_CONTROLLER" in err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
