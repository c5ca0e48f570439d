"""worker.yaml: keys, defaults, device forms, validation messages, environment (§2)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from resource_controller.worker import config as wc

BASE = "controller_url: http://ctl:8080\ndevices: [gpu0]\n"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "worker.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> wc.WorkerConfig:
    return wc.load_config(write(tmp_path, text), environ=env or {})


def load_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(wc.ConfigError) as info:
        load(tmp_path, text, env)
    return str(info.value)


# ---- defaults ------------------------------------------------------------------


def test_minimal_file_gets_every_default(tmp_path: Path) -> None:  # WRK-010, §2.1
    cfg = load(tmp_path, BASE)
    assert cfg.controller_url == "http://ctl:8080"
    assert cfg.host == socket.gethostname()
    assert cfg.token == ""
    assert [d.name for d in cfg.devices] == ["gpu0"]
    assert cfg.heartbeat_interval == 10
    assert cfg.poll_wait == 30
    assert cfg.hooks.timeout == 60
    assert cfg.hooks.release_linger == 30
    assert cfg.probe_dir == "/etc/rc/probe.d"
    assert cfg.probe_interval == 300
    assert cfg.probe_timeout == 5
    assert cfg.verify_dir == "/etc/rc/verify.d"
    assert cfg.verify_timeout == 30
    assert cfg.verify_pass_budget == 120
    assert cfg.sheet_dir == "/etc/rc"
    assert cfg.state_dir == wc.default_state_dir(cfg.host, environ={})
    assert cfg.require_manual_clear is False
    dev = cfg.devices[0]
    assert (dev.max_runtime, dev.timeout, dev.release_linger) == (0, 60, 30)
    assert dev.on_acquire is None and dev.on_release is None and dev.labels == {}
    assert cfg.device_id("gpu0") == f"{cfg.host}:gpu0"


def test_every_key_is_read(tmp_path: Path) -> None:  # §2.1
    cfg = load(
        tmp_path,
        """
controller_url: http://ctl
token: tok
host: box
heartbeat_interval: 5s
poll_wait: 1m
hooks: {timeout: 2m, release_linger: 10s}
probe_dir: /p
probe_interval: 1m30s
probe_timeout: 500ms
verify_dir: /v
verify_timeout: 1.5s
verify_pass_budget: 1h
sheet_dir: /s
state_dir: /st
require_manual_clear: true
devices:
  - gpu0
  - name: gpu1
    max_runtime: 6h
    on_acquire: /hooks/acq.sh
    on_release: /hooks/rel.sh
    timeout: 5s
    release_linger: 1m
    labels: {rack: r3}
""",
    )
    assert (cfg.token, cfg.host) == ("tok", "box")
    assert (cfg.heartbeat_interval, cfg.poll_wait) == (5, 60)
    assert (cfg.hooks.timeout, cfg.hooks.release_linger) == (120, 10)
    assert (cfg.probe_dir, cfg.probe_interval, cfg.probe_timeout) == ("/p", 90, 0.5)
    assert (cfg.verify_dir, cfg.verify_timeout, cfg.verify_pass_budget) == ("/v", 1.5, 3600)
    assert (cfg.sheet_dir, cfg.state_dir, cfg.require_manual_clear) == ("/s", "/st", True)
    gpu0, gpu1 = cfg.devices
    assert (gpu0.timeout, gpu0.release_linger) == (120, 10)  # host values (WRK-016)
    assert gpu1.max_runtime_seconds == 21600
    assert (gpu1.on_acquire, gpu1.on_release) == ("/hooks/acq.sh", "/hooks/rel.sh")
    assert (gpu1.timeout, gpu1.release_linger) == (5, 60)
    assert gpu1.labels == {"rack": "r3"}


def test_zero_and_negative_durations_take_defaults(tmp_path: Path) -> None:  # WRK-010
    cfg = load(
        tmp_path,
        BASE
        + """heartbeat_interval: "0"
poll_wait: -5s
hooks: {timeout: "0", release_linger: -1s}
probe_interval: 0s
verify_timeout: "-0"
probe_dir: ""
""",
    )
    assert cfg.heartbeat_interval == 10
    assert cfg.poll_wait == 30
    assert (cfg.hooks.timeout, cfg.hooks.release_linger) == (60, 30)
    assert cfg.probe_interval == 300
    assert cfg.verify_timeout == 30
    assert cfg.probe_dir == "/etc/rc/probe.d"  # an empty path is unset


def test_device_hook_values_resolve_own_then_host_then_builtin(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """controller_url: http://ctl
hooks: {timeout: 0s, release_linger: 45s}
devices:
  - {name: a, timeout: 0s, release_linger: -3s}
  - {name: b, timeout: 7s}
""",
    )
    a, b = cfg.devices
    assert (a.timeout, a.release_linger) == (60, 45)  # WRK-016
    assert (b.timeout, b.release_linger) == (7, 45)


def test_default_state_dir_is_per_host_for_root(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    text = BASE + "host: box-a\n"
    cfg = wc.load_config(write(tmp_path, text), environ={"HOME": "/home/u"}, euid=0)
    assert cfg.state_dir == "/var/lib/rc-worker/box-a"
    assert wc.default_state_dir("box-b", euid=0, environ={}) == "/var/lib/rc-worker/box-b"


def test_default_state_dir_for_anyone_else(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    text = BASE + "host: box-a\n"
    env = {"HOME": "/home/u"}
    cfg = wc.load_config(write(tmp_path, text), environ=env, euid=1000)
    assert cfg.state_dir == "/home/u/.local/state/rc-worker/box-a"
    env["XDG_STATE_HOME"] = "/xdg/state"
    cfg = wc.load_config(write(tmp_path, text), environ=env, euid=1000)
    assert cfg.state_dir == "/xdg/state/rc-worker/box-a"
    # The XDG rules ignore a relative value; an empty one is unset.
    for ignored in ("relative/state", ""):
        env["XDG_STATE_HOME"] = ignored
        got = wc.default_state_dir("box-a", euid=1000, environ=env)
        assert got == "/home/u/.local/state/rc-worker/box-a"
    # Without $HOME, the password database's home directory.
    assert wc.default_state_dir("h", euid=1, environ={}).endswith("/.local/state/rc-worker/h")


def test_default_state_dir_is_one_directory_per_host() -> None:  # EXT-OUTBOX-1
    env = {"HOME": "/home/u"}
    assert wc.default_state_dir("a/../b", euid=0, environ=env) == "/var/lib/rc-worker/a_.._b"
    assert wc.default_state_dir("..", euid=0, environ=env) == "/var/lib/rc-worker/_.."
    assert wc.default_state_dir("a", euid=0, environ=env) != wc.default_state_dir(
        "b", euid=0, environ=env
    )


def test_an_explicit_state_dir_wins(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    cfg = wc.load_config(write(tmp_path, BASE + "state_dir: /st\n"), environ={}, euid=1000)
    assert cfg.state_dir == "/st"
    cfg = wc.make_config("u", ["g"], host="h", state_dir="/data/worker")
    assert cfg.state_dir == "/data/worker"


def test_apply_defaults_is_idempotent(tmp_path: Path) -> None:  # WRK-010
    cfg = load(tmp_path, BASE + "poll_wait: -1s\nhooks: {timeout: 0s}\n")
    assert wc.apply_defaults(cfg) == cfg
    assert wc.apply_defaults(wc.apply_defaults(cfg)) == cfg


def test_max_runtime_is_truncated_to_whole_seconds(tmp_path: Path) -> None:  # WRK-019
    cfg = load(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtime: 90.5s}]\n")
    assert cfg.devices[0].max_runtime_seconds == 90
    cfg = load(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtime: 1s}]\n")
    assert cfg.devices[0].max_runtime_seconds == 1


def test_negative_max_runtime_means_no_ceiling(tmp_path: Path) -> None:
    cfg = load(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtime: -1h}]\n")
    assert cfg.devices[0].max_runtime_seconds == 0


# ---- labels --------------------------------------------------------------------


def test_label_scalars_are_taken_as_literal_text(tmp_path: Path) -> None:  # WRK-015
    cfg = load(
        tmp_path,
        """controller_url: x
devices:
  - name: g
    labels:
      count: 3
      flag: true
      ver: 1.50
      quoted: "x y"
      yesish: yes
      hexy: 0x10
      empty:
""",
    )
    assert cfg.devices[0].labels == {
        "count": "3",
        "flag": "true",
        "ver": "1.50",
        "quoted": "x y",
        "yesish": "yes",
        "hexy": "0x10",
        "empty": "",
    }


def test_label_value_that_is_a_mapping_is_a_parse_error(tmp_path: Path) -> None:
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{name: g, labels: {a: {b: c}}}]\n")
    assert msg.startswith("parse worker config: ")
    assert "labels" in msg


# ---- §2.3 errors ---------------------------------------------------------------


def test_unreadable_file(tmp_path: Path) -> None:  # WRK-018
    path = str(tmp_path / "missing.yaml")
    with pytest.raises(wc.ConfigError) as info:
        wc.load_config(path, environ={})
    assert str(info.value) == f"read worker config: open {path}: no such file or directory"


def test_yaml_syntax_error(tmp_path: Path) -> None:  # WRK-018
    msg = load_error(tmp_path, "controller_url: [unclosed\n")
    assert msg.startswith("parse worker config: ")


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    assert load_error(tmp_path, "- a\n- b\n").startswith("parse worker config: ")


@pytest.mark.parametrize("value", ["30", "0", "1.5", "true"])
def test_bare_yaml_scalar_duration_is_a_parse_error(tmp_path: Path, value: str) -> None:
    msg = load_error(tmp_path, BASE + f"poll_wait: {value}\n")  # §0 duration input
    assert msg.startswith("parse worker config: poll_wait: ")


def test_duration_string_without_unit_is_a_parse_error(tmp_path: Path) -> None:
    msg = load_error(tmp_path, BASE + 'heartbeat_interval: "30"\n')
    assert msg == "parse worker config: heartbeat_interval: invalid duration '30'"


def test_device_duration_must_be_a_string(tmp_path: Path) -> None:
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtime: 60}]\n")
    assert msg.startswith("parse worker config: devices[0].max_runtime: ")


def test_unknown_top_level_key_is_named(tmp_path: Path) -> None:  # WRK-013
    msg = load_error(tmp_path, BASE + "poll_wiat: 30s\n")
    assert msg == "parse worker config: unknown key 'poll_wiat'"


def test_unknown_device_key_is_named(tmp_path: Path) -> None:  # WRK-013
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtim: 1h}]\n")
    assert msg == "parse worker config: unknown key 'devices[0].max_runtim'"


def test_unknown_hooks_key_is_named(tmp_path: Path) -> None:  # WRK-013
    msg = load_error(tmp_path, BASE + "hooks: {timeuot: 1m}\n")
    assert msg == "parse worker config: unknown key 'hooks.timeuot'"


def test_controller_url_required(tmp_path: Path) -> None:  # WRK-018
    path = write(tmp_path, "devices: [gpu0]\n")
    with pytest.raises(wc.ConfigError, match="^controller_url required in " + path + "$"):
        wc.load_config(path, environ={})


@pytest.mark.parametrize("devices", ["", "devices: []\n", "devices:\n"])
def test_at_least_one_device(tmp_path: Path, devices: str) -> None:  # WRK-018
    path = write(tmp_path, "controller_url: x\n" + devices)
    with pytest.raises(wc.ConfigError) as info:
        wc.load_config(path, environ={})
    assert str(info.value) == f"at least one device required in {path}"


def test_mapping_device_without_name(tmp_path: Path) -> None:  # WRK-018
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{max_runtime: 1h}]\n")
    assert "device entry needs a name" in msg


@pytest.mark.parametrize("entry", ['""', '{name: ""}'])
def test_empty_device_name(tmp_path: Path, entry: str) -> None:  # WRK-018
    path = write(tmp_path, f"controller_url: x\ndevices: [{entry}]\n")
    with pytest.raises(wc.ConfigError) as info:
        wc.load_config(path, environ={})
    assert str(info.value) == f"device entry needs a name in {path}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hooks: 3\n", "parse worker config: hooks: must be a mapping (got int 3)"),
        ("token: 3\n", "parse worker config: token: input should be a valid string (got int 3)"),
    ],
)
def test_type_errors_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert load_error(tmp_path, BASE + text) == expected


def test_labels_must_be_a_mapping(tmp_path: Path) -> None:
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{name: g, labels: [a]}]\n")
    assert msg == "parse worker config: devices[0].labels: must be a mapping (got list ['a'])"


def test_device_entry_of_another_type_is_a_parse_error(tmp_path: Path) -> None:
    msg = load_error(tmp_path, "controller_url: x\ndevices: [3]\n")
    assert msg.startswith("parse worker config: devices[0]: ")


def test_duplicate_device_names_are_named(tmp_path: Path) -> None:  # WRK-013
    msg = load_error(tmp_path, "controller_url: x\ndevices: [gpu0, {name: gpu0}]\n")
    assert "duplicate device name 'gpu0'" in msg


@pytest.mark.parametrize("key", ["on_acquire", "on_release"])
@pytest.mark.parametrize("value", ['""', '"   "'])
def test_blank_hook_path(tmp_path: Path, key: str, value: str) -> None:  # WRK-017
    msg = load_error(tmp_path, f"controller_url: x\ndevices: [{{name: gpu0, {key}: {value}}}]\n")
    assert msg == f'device "gpu0": {key} must not be blank'


def test_hook_path_is_used_verbatim(tmp_path: Path) -> None:  # WRK-017
    cfg = load(tmp_path, 'controller_url: x\ndevices: [{name: g, on_acquire: " /x.sh "}]\n')
    assert cfg.devices[0].on_acquire == " /x.sh "


def test_sub_second_max_runtime_is_rejected(tmp_path: Path) -> None:  # WRK-019
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{name: gpu0, max_runtime: 500ms}]\n")
    assert msg.startswith('device "gpu0": max_runtime 500ms is below the one-second granularity')


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        *[(t, True) for t in ("true", "True", "TRUE", "yes", "on")],
        *[(t, False) for t in ("false", "False", "FALSE", "no", "off")],
    ],
)
def test_require_manual_clear_yaml_booleans(tmp_path: Path, text: str, expected: bool) -> None:
    cfg = load(tmp_path, BASE + f"require_manual_clear: {text}\n")  # WRK-012
    assert cfg.require_manual_clear is expected


@pytest.mark.parametrize("text", ["maybe", '"true"', "1"])
def test_require_manual_clear_other_values_are_parse_errors(tmp_path: Path, text: str) -> None:
    msg = load_error(tmp_path, BASE + f"require_manual_clear: {text}\n")  # WRK-012
    assert msg.startswith("parse worker config: require_manual_clear: ")


# ---- environment overrides -----------------------------------------------------


def test_rc_token_used_only_without_a_file_token(tmp_path: Path) -> None:  # WRK-020
    assert load(tmp_path, BASE, {"RC_TOKEN": "  envtok \n"}).token == "envtok"
    assert load(tmp_path, BASE + 'token: ""\n', {"RC_TOKEN": "envtok"}).token == "envtok"
    assert load(tmp_path, BASE + "token: filetok\n", {"RC_TOKEN": "envtok"}).token == "filetok"
    assert load(tmp_path, BASE, {"RC_TOKEN": "   "}).token == ""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        *[(v, True) for v in ("1", "t", "T", " true ", "TRUE", "True")],
        *[(v, False) for v in ("", "  ", "0", "f", "F", "false", "FALSE", "False")],
    ],
)
def test_rc_require_manual_clear(tmp_path: Path, value: str, expected: bool) -> None:  # WRK-021
    cfg = load(tmp_path, BASE, {"RC_REQUIRE_MANUAL_CLEAR": value})
    assert cfg.require_manual_clear is expected


@pytest.mark.parametrize("value", ["yes", "no", "off", "garbage"])
def test_rc_require_manual_clear_unknown_turns_on_with_warning(
    tmp_path: Path, value: str, caplog: pytest.LogCaptureFixture
) -> None:  # WRK-021
    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.inactive"):
        cfg = load(tmp_path, BASE, {"RC_REQUIRE_MANUAL_CLEAR": value})
    assert cfg.require_manual_clear is True
    assert value in caplog.text


def test_rc_require_manual_clear_never_switches_off_the_file(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE + "require_manual_clear: true\n", {"RC_REQUIRE_MANUAL_CLEAR": "0"})
    assert cfg.require_manual_clear is True  # WRK-021: ORed


def test_no_other_environment_variable_configures_the_worker(tmp_path: Path) -> None:  # WRK-022
    own = {"RC_TOKEN": "envtok", "RC_REQUIRE_MANUAL_CLEAR": "1", "HOME": str(tmp_path)}
    others = {
        "RC_CONTROLLER": "http://elsewhere:1",
        "RC_CONTROLLER_URL": "http://elsewhere:1",
        "RC_URL": "http://elsewhere:1",
        "RC_HOST": "elsewhere",
        "RC_DEVICES": "gpu7",
        "RC_POLL_WAIT": "1s",
        "RC_HEARTBEAT_INTERVAL": "1s",
        "RC_HOOKS_TIMEOUT": "1s",
        "RC_RELEASE_LINGER": "1s",
        "RC_STATE_DIR": str(tmp_path / "elsewhere"),
    }
    # Every other key of worker.yaml, spelled as a variable, too.
    for key in wc.WorkerConfig.model_fields:
        if key not in ("token", "require_manual_clear"):
            others.setdefault(f"RC_{key.upper()}", "1s")
    cfg = load(tmp_path, BASE, own)
    assert cfg.token == "envtok" and cfg.require_manual_clear is True
    assert load(tmp_path, BASE, {**own, **others}) == cfg


# ---- built in code -------------------------------------------------------------


def test_make_config_applies_defaults_and_checks() -> None:  # WRK-010
    cfg = wc.make_config("http://127.0.0.1:8080", ["slot0", "slot1"], token="t", poll_wait=0)
    assert cfg.host == socket.gethostname()
    assert cfg.poll_wait == 30
    assert [d.timeout for d in cfg.devices] == [60, 60]
    assert wc.apply_defaults(cfg) == cfg
    cfg = wc.make_config("u", [wc.DeviceConfig(name="g", labels={"a": "b"})], host="h")
    assert cfg.device_id("g") == "h:g"
    assert cfg.devices[0].labels == {"a": "b"}


def test_make_config_refuses_what_the_file_refuses() -> None:
    with pytest.raises(wc.ConfigError, match="controller_url required"):
        wc.make_config("", ["g"])
    with pytest.raises(wc.ConfigError, match="at least one device required"):
        wc.make_config("u", [])
    with pytest.raises(wc.ConfigError, match="duplicate device name"):
        wc.make_config("u", ["g", "g"])
    with pytest.raises(wc.ConfigError, match="below the one-second granularity"):
        wc.make_config("u", [wc.DeviceConfig(name="g", max_runtime=0.5)])
    with pytest.raises(wc.ConfigError, match="poll_wiat"):
        wc.make_config("u", ["g"], poll_wiat=1)


@pytest.mark.parametrize("name", ["gpu 0", "a/b", "g?x", "d" * 129])
def test_device_name_the_controller_would_refuse(tmp_path: Path, name: str) -> None:
    """EXT-LIMITS-2: at most 128 characters of A-Z a-z 0-9 . _ - ; refused at start-up."""
    msg = load_error(tmp_path, f"controller_url: x\ndevices: [{{name: '{name}'}}]\n")
    assert f"device name {name!r}" in msg and "128" in msg


def test_max_runtime_above_the_controller_range(tmp_path: Path) -> None:  # EXT-LIMITS-1
    msg = load_error(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtime: 600000h}]\n")
    assert "2147483647" in msg
    cfg = load(tmp_path, "controller_url: x\ndevices: [{name: g, max_runtime: 596523h}]\n")
    assert cfg.devices[0].max_runtime_seconds == 596523 * 3600


# ---- accepted, not active yet ----------------------------------------------------


# ---- devices: auto (EXT-MIG-1) ----------------------------------------------------


def test_devices_auto(tmp_path: Path) -> None:  # EXT-MIG-1
    cfg = load(tmp_path, "controller_url: http://ctl:8080\ndevices: auto\n")
    assert cfg.devices_auto and cfg.devices == ()
    assert not load(tmp_path, BASE).devices_auto


@pytest.mark.parametrize("value", ["Auto", "all", "gpu0", "''"])
def test_devices_another_word_is_refused(tmp_path: Path, value: str) -> None:
    message = load_error(tmp_path, f"controller_url: http://ctl:8080\ndevices: {value}\n")
    assert message.startswith('parse worker config: devices: a list of devices or "auto"')


def test_devices_auto_in_code() -> None:  # EXT-MIG-1, rc up
    cfg = wc.make_config("http://ctl:8080", [], devices_auto=True)
    assert cfg.devices_auto and cfg.devices == ()
    with pytest.raises(wc.ConfigError, match="takes no device list"):
        wc.make_config("http://ctl:8080", ["gpu0"], devices_auto=True)
