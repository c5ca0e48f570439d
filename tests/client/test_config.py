"""User config file, connection settings and submitter identity (CLI-010..031, EXT-UP-3)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from resource_controller.client import config, config_write


class Warnings(list[str]):
    def __call__(self, message: str) -> None:
        self.append(message)


def settings(env: dict[str, str]) -> tuple[config.ClientSettings, Warnings]:
    warnings = Warnings()
    return config.ClientSettings(env, warn=warnings), warnings


# ---- CLI-020: where the file is -------------------------------------------------------


def test_rc_config_wins_and_is_trimmed(tmp_path: Path) -> None:
    env = {"RC_CONFIG": f"  {tmp_path}/x.yaml\n", "XDG_CONFIG_HOME": "/xdg", "HOME": "/home/a"}
    assert config.config_path(env) == tmp_path / "x.yaml"


def test_xdg_config_home_before_home() -> None:
    env = {"XDG_CONFIG_HOME": "/xdg", "HOME": "/home/a"}
    assert config.config_path(env, "linux") == Path("/xdg/rc/config.yaml")


def test_home_dot_config_when_xdg_unset_or_empty() -> None:
    assert config.config_path({"HOME": "/home/a"}, "linux") == Path(
        "/home/a/.config/rc/config.yaml"
    )
    env = {"HOME": "/home/a", "XDG_CONFIG_HOME": "", "RC_CONFIG": "   "}
    assert config.config_path(env, "linux") == Path("/home/a/.config/rc/config.yaml")


def test_macos_application_support() -> None:
    path = config.config_path({"HOME": "/Users/a"}, "darwin")
    assert path == Path("/Users/a/Library/Application Support/rc/config.yaml")


def test_relative_xdg_is_an_error() -> None:
    with pytest.raises(config.ClientConfigError, match="relative"):
        config.config_path({"XDG_CONFIG_HOME": "rel/dir", "HOME": "/home/a"})


def test_neither_variable_is_an_error() -> None:
    with pytest.raises(config.ClientConfigError):
        config.config_path({})


# ---- CLI-010/011/022/023: precedence and laziness -------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_without_env_or_file(tmp_path: Path) -> None:
    s, warnings = settings({"HOME": str(tmp_path)})
    assert s.controller() == "http://localhost:8080"
    assert s.token() == ""
    assert warnings == []  # a missing file is normal and silent (CLI-024)


def test_file_supplies_what_env_does_not(tmp_path: Path) -> None:
    write(tmp_path / ".config/rc/config.yaml", "controller: http://ctl:1/\ntoken: ' t1 '\n")
    s, _ = settings({"HOME": str(tmp_path)})
    assert s.controller() == "http://ctl:1"  # trailing slash stripped (CLI-201)
    assert s.token() == "t1"  # values are trimmed (CLI-021)


def test_env_beats_file_and_is_verbatim(tmp_path: Path) -> None:
    write(tmp_path / ".config/rc/config.yaml", "controller: http://file\ntoken: filetok\n")
    env = {"HOME": str(tmp_path), "RC_CONTROLLER": "http://env:2//", "RC_TOKEN": " tok "}
    s, _ = settings(env)
    assert s.controller() == "http://env:2"
    assert s.token() == " tok "  # RC_TOKEN is verbatim (CLI-011)


def test_file_not_read_when_environment_supplies_everything(tmp_path: Path) -> None:
    write(tmp_path / ".config/rc/config.yaml", "controller: [broken\n")
    env = {"HOME": str(tmp_path), "RC_CONTROLLER": "http://e", "RC_TOKEN": "t"}
    s, warnings = settings(env)
    s.controller(), s.token(), s.submitter("me")
    assert warnings == []  # CLI-023: never opened, so never complained about


def test_file_read_at_most_once(tmp_path: Path) -> None:
    path = write(tmp_path / ".config/rc/config.yaml", "token: first\n")
    s, _ = settings({"HOME": str(tmp_path)})
    assert s.token() == "first"
    path.write_text("token: second\n")
    assert s.token() == "first"


def test_empty_values_count_as_absent(tmp_path: Path) -> None:
    write(tmp_path / ".config/rc/config.yaml", "controller: '   '\ntoken:\nsubmitter: ''\n")
    s, warnings = settings({"HOME": str(tmp_path)})
    assert s.controller() == "http://localhost:8080"
    assert s.token() == ""
    assert warnings == []


def test_scalars_keep_their_written_text(tmp_path: Path) -> None:
    write(tmp_path / ".config/rc/config.yaml", "token: 0123\nsubmitter: true\n")
    s, _ = settings({"HOME": str(tmp_path)})
    assert s.token() == "0123"
    assert s.file.submitter == "true"


# ---- CLI-024: a broken file warns once and counts as empty ----------------------------


@pytest.mark.parametrize(
    "text",
    ["controller: [unclosed\n", "- a\n- b\n", "token: {nested: map}\n", "\tbad: indent\n"],
)
def test_broken_file_warns_once_and_carries_on(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / ".config/rc/config.yaml", text)
    s, warnings = settings({"HOME": str(tmp_path)})
    assert s.controller() == "http://localhost:8080"
    assert s.token() == ""
    assert len(warnings) == 1
    assert str(path) in warnings[0]


def test_unreadable_file_warns(tmp_path: Path) -> None:
    (tmp_path / ".config/rc/config.yaml").mkdir(parents=True)  # a directory: cannot be read
    s, warnings = settings({"HOME": str(tmp_path)})
    assert s.token() == ""
    assert len(warnings) == 1 and "config.yaml" in warnings[0]


def test_unlocatable_file_warns(tmp_path: Path) -> None:
    s, warnings = settings({"XDG_CONFIG_HOME": "relative"})
    assert s.token() == ""
    assert s.controller() == "http://localhost:8080"
    assert len(warnings) == 1


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('submiter: "alice"\ntoken: "t"\n', "submiter"),  # the fast form
        ("submiter: alice\ntoken: t\n", "submiter"),  # YAML
        ('run: {hre: true}\ntoken: "t"\n', "run.hre"),
        ("run:\n  here: true\n  hre: false\ntoken: t\n", "run.hre"),
        ('tokn: "x"\ncontroller: "http://c:1"\n', "tokn"),
        ("tokn: [x]\ntoken: t\n", "tokn"),
        ('colour: {blue: true}\ntoken: "t"\n', "colour"),
        ("? [a, b]\n: 1\ntoken: t\n", "a key that is not text"),
    ],
)
def test_an_unknown_key_is_refused_by_its_dotted_name(
    tmp_path: Path, text: str, named: str
) -> None:
    # A key either does what it says or is refused: never skipped without a word. The
    # refusal is CLI-024's: one warning naming the key and the file, then no values.
    path = write(tmp_path / "c.yaml", text)
    s, warnings = settings({"RC_CONFIG": str(path)})
    assert (s.token(), s.controller(), s.run_here()) == ("", config.DEFAULT_CONTROLLER, False)
    assert len(warnings) == 1
    assert named in warnings[0] and str(path) in warnings[0]
    assert "run.here" in warnings[0]  # and what rc does read


def test_every_unknown_key_is_named() -> None:
    with pytest.raises(config.ClientConfigError) as exc:
        config.parse_config('a: "1"\nrun: {b: true}\ntoken: "t"\n', "/c.yaml")
    assert "unknown keys a, run.b" in exc.value.message


def test_a_missing_file_named_by_rc_config_is_an_error(tmp_path: Path) -> None:
    # A misspelt RC_CONFIG must not look like an empty configuration: the path is named.
    missing = tmp_path / "no-such.yaml"
    s, warnings = settings({"RC_CONFIG": str(missing), "HOME": str(tmp_path)})
    assert s.token() == ""
    assert len(warnings) == 1
    assert "RC_CONFIG" in warnings[0] and str(missing) in warnings[0]
    assert "does not exist" in warnings[0]


def test_an_empty_file_named_by_rc_config_is_no_settings(tmp_path: Path) -> None:
    s, warnings = settings({"RC_CONFIG": os.devnull})
    assert (s.token(), s.controller(), warnings) == ("", config.DEFAULT_CONTROLLER, [])


# ---- CLI-011: an unauthorized answer to no token says where rc looked --------------------


def test_missing_token_names_where_rc_looked(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    default = tmp_path / ".config/rc/config.yaml"
    said = settings(home)[0].missing_token()
    assert "RC_TOKEN is not set" in said and f"{default} does not exist" in said
    write(default, 'controller: "http://c:1"\n')
    said = settings(home)[0].missing_token()
    assert f"{default} has no token" in said and "RC_TOKEN" in said
    write(default, 'tokn: "x"\n')
    s, warnings = settings(home)
    said = s.missing_token()
    assert "RC_TOKEN is not set" in said and "unknown key tokn" in said and str(default) in said
    assert len(warnings) == 1  # the file was read once, and warned about once
    missing = tmp_path / "typo.yaml"
    said = settings({**home, "RC_CONFIG": str(missing)})[0].missing_token()
    assert f"RC_CONFIG names {missing}, which does not exist" in said
    assert settings({**home, "RC_TOKEN": "t"})[0].missing_token() == ""


def test_default_warning_goes_to_stderr_with_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "c.yaml", "controller: [x\n")
    s = config.ClientSettings({"RC_CONFIG": str(tmp_path / "c.yaml")})
    s.token()
    s.controller()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rc: warning: ")


# ---- CLI-030/031: submitter -------------------------------------------------------------


def test_submitter_precedence(tmp_path: Path) -> None:
    write(tmp_path / ".config/rc/config.yaml", "submitter: from-file\n")
    home = {"HOME": str(tmp_path)}
    assert settings({**home, "RC_SUBMITTER": " env-id "})[0].submitter(" flag ") == " flag "
    assert settings({**home, "RC_SUBMITTER": " env-id "})[0].submitter() == "env-id"
    assert settings({**home, "RC_SUBMITTER": "  \t"})[0].submitter() == "from-file"
    assert settings(home)[0].submitter() == "from-file"


def test_derived_submitter(tmp_path: Path) -> None:
    host = os.uname().nodename
    s, _ = settings({"HOME": str(tmp_path), "USER": "alice"})
    assert s.submitter() == f"alice@{host}"
    s, _ = settings({"HOME": str(tmp_path), "USER": "alice", "CLAUDE_SESSION_ID": "3f9c2a"})
    assert s.submitter() == f"alice@{host}/3f9c2a"
    s, _ = settings({"HOME": str(tmp_path)})
    assert s.submitter() == f"@{host}"  # never empty (CLI-031)


# ---- the fast reader agrees with YAML ----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        'controller: "http://a:1"\ntoken: "t\\u00e9 x"\n',
        '# written by rc up\ncontroller: "http://a:1"  # comment\n\ntoken: "x"\n',
        'submitter: "a\\"b\\\\c"\nextra: "kept"\n',
    ],
)
def test_simple_form_matches_yaml(text: str) -> None:
    import yaml

    fast = config.parse_simple(text)
    assert fast is not None
    assert fast == yaml.safe_load(text)


@pytest.mark.parametrize("text", ["controller: http://x\n", 'a: "x"\na: "y"\n', "k: 'q'\n"])
def test_other_forms_go_to_yaml(text: str) -> None:
    assert config.parse_simple(text) is None


# ---- EXT-UP-3: writing the client side -----------------------------------------------------


def test_write_creates_file_0600_and_reads_back(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    path = config_write.update_client_config(
        "http://127.0.0.1:8080", "ctok-1", force=False, env=env
    ).path
    assert path == tmp_path / ".config/rc/config.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    s, warnings = settings(env)
    assert (s.controller(), s.token(), warnings) == ("http://127.0.0.1:8080", "ctok-1", [])
    assert config.parse_simple(path.read_text()) is not None  # the fast form


def test_write_keeps_existing_values_without_force(tmp_path: Path) -> None:
    env = {"RC_CONFIG": str(tmp_path / "c.yaml")}
    write(tmp_path / "c.yaml", "controller: http://shared:9\nsubmitter: me\n")
    config_write.update_client_config("http://127.0.0.1:8080", "new", force=False, env=env)
    s, warnings = settings(env)
    assert s.controller() == "http://shared:9"  # kept
    assert s.token() == "new"  # was absent: filled in
    assert s.file.submitter == "me"
    assert warnings == []


def test_write_refuses_a_file_with_an_unknown_key_and_force_drops_it(tmp_path: Path) -> None:
    # rc up must not leave behind a file every rc command then refuses (EXT-HERE-5).
    env = {"RC_CONFIG": str(tmp_path / "c.yaml")}
    text = "submitter: me\nsubmiter: typo\nrun:\n  here: false\n  hre: true\n"
    write(tmp_path / "c.yaml", text)
    with pytest.raises(config.ClientConfigError) as exc:
        config_write.update_client_config("http://a", "t", force=False, env=env)
    assert "submiter, run.hre" in exc.value.message and "--force" in exc.value.message
    assert (tmp_path / "c.yaml").read_text() == text
    config_write.update_client_config("http://a", "t", force=True, env=env)
    s, warnings = settings(env)
    assert (s.token(), s.file.submitter, s.run_here(), warnings) == ("t", "me", False, [])


def test_write_with_force_overwrites(tmp_path: Path) -> None:
    env = {"RC_CONFIG": str(tmp_path / "c.yaml")}
    write(tmp_path / "c.yaml", 'controller: "http://shared:9"\ntoken: "old"\n')
    config_write.update_client_config("http://127.0.0.1:8080", "new", force=True, env=env)
    s, _ = settings(env)
    assert (s.controller(), s.token()) == ("http://127.0.0.1:8080", "new")


def test_write_refuses_to_clobber_a_broken_file_without_force(tmp_path: Path) -> None:
    env = {"RC_CONFIG": str(tmp_path / "c.yaml")}
    write(tmp_path / "c.yaml", "controller: [broken\n")
    with pytest.raises(config.ClientConfigError):
        config_write.update_client_config("http://a", "t", force=False, env=env)
    assert (tmp_path / "c.yaml").read_text() == "controller: [broken\n"
    config_write.update_client_config("http://a", "t", force=True, env=env)
    assert settings(env)[0].token() == "t"


def test_write_resets_process_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RC_CONFIG", str(tmp_path / "c.yaml"))
    first = config.settings()
    assert first.token() == ""
    config_write.update_client_config("http://a", "tok", force=False)
    assert config.settings() is not first
    assert config.settings().token() == "tok"


# ---- EXT-HERE-3: run: {here: true} ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "here"),
    [
        ("run: {here: true}\n", True),
        ('controller: "http://x"\nrun: {here: false}\n', False),
        ("run:\n  here: yes\n", True),
        ("run:\n", False),
        ('token: "t"\n', False),
    ],
)
def test_run_here_is_read(tmp_path: Path, text: str, here: bool) -> None:
    env = {"RC_CONFIG": str(write(tmp_path / "c.yaml", text))}
    s, warnings = settings(env)
    assert (s.run_here(), warnings) == (here, [])


def test_the_written_run_here_form_needs_no_yaml() -> None:
    assert config.parse_simple('run: {here: true}\ntoken: "t"\n') == {
        "run": {"here": True},
        "token": "t",
    }


@pytest.mark.parametrize("text", ["run: 3\n", 'run:\n  here: "yes"\n', "run: [here]\n"])
def test_a_bad_run_section_is_a_broken_file(tmp_path: Path, text: str) -> None:
    env = {"RC_CONFIG": str(write(tmp_path / "c.yaml", text + 'token: "t"\n'))}
    s, warnings = settings(env)
    assert (s.run_here(), s.token()) == (False, "")
    assert len(warnings) == 1 and "run" in warnings[0]


def test_up_writes_run_here_and_says_what_it_kept(tmp_path: Path) -> None:
    env = {"RC_CONFIG": str(tmp_path / "c.yaml")}
    done = config_write.update_client_config("http://127.0.0.1:8080", "tok", force=False, env=env)
    assert (done.written, dict(done.kept)) == (("controller", "token", "run.here"), {})
    assert config.parse_simple((tmp_path / "c.yaml").read_text()) is not None  # fast form
    assert settings(env)[0].run_here() is True

    write(tmp_path / "c.yaml", 'controller: "http://shared:9"\nrun: {here: false}\n')
    done = config_write.update_client_config("http://127.0.0.1:8080", "tok", force=False, env=env)
    assert done.written == ("token",)
    assert dict(done.kept) == {"controller": "http://shared:9", "run.here": False}
    done = config_write.update_client_config("http://127.0.0.1:8080", "tok", force=True, env=env)
    assert done.written == ("controller", "token") and dict(done.kept) == {"run.here": False}
    s, _ = settings(env)
    assert (s.controller(), s.run_here()) == ("http://127.0.0.1:8080", False)


@pytest.mark.parametrize(
    "given",
    ["/a/b.yaml", "//a/b", "///a//b/", "./x.yaml", "a/./b/../c", "x", "/", "//", "~/c.yaml", "a//"],
)
def test_the_location_text_is_what_pathlib_prints(given: str) -> None:
    # rc run reads the file by config_location, without pathlib: same text, same file.
    env = {"RC_CONFIG": given}
    assert config.config_location(env) == str(config.config_path(env)) == str(Path(given))


@pytest.mark.parametrize(
    ("env", "platform"),
    [
        ({"XDG_CONFIG_HOME": "/xdg//", "HOME": "/h"}, "linux"),
        ({"HOME": "/home/a/"}, "linux"),
        ({"HOME": "/Users/a"}, "darwin"),
        ({"HOME": "rel"}, "linux"),
    ],
)
def test_the_default_location_text_is_what_pathlib_prints(
    env: dict[str, str], platform: str
) -> None:
    assert config.config_location(env, platform) == str(config.config_path(env, platform))
