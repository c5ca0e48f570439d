"""``rc serve``'s policy flags refuse what they cannot honour, naming the flag, before
anything starts (EXT-FAIR-1, EXT-KEEP-1); ``rc up`` takes none of them."""

from __future__ import annotations

import pytest

from cli.conftest import Rc
from resource_controller.controller import serve


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--priority-aging", "soon"), "--priority-aging"),
        (("--priority-aging", "-1m"), "--priority-aging"),
        (("--priority-aging", "500ms"), "--priority-aging"),
        (("--log-retention", "7"), "--log-retention"),
        (("--log-retention", "-1h"), "--log-retention"),
        (("--log-retention", "0.5s"), "--log-retention"),
        (("--max-log-bytes", "12KB"), "--max-log-bytes"),
        (("--max-log-bytes", "lots"), "--max-log-bytes"),
        (("--max-log-bytes", "-5"), "--max-log-bytes"),
        (("--max-log-bytes", "1000"), "--max-log-bytes"),
        # EXT-SHARE-1: a limit is a number of devices, at least 1.
        (("--max-devices-per-submitter", "-1"), "--max-devices-per-submitter"),
        (("--max-devices-per-submitter", "0"), "--max-devices-per-submitter"),
        (("--max-devices-per-submitter", "four"), "--max-devices-per-submitter"),
        (("--max-devices-per-submitter", "2.5"), "--max-devices-per-submitter"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(
    run_rc: Rc, args: tuple[str, ...], flag: str, tmp_path: object
) -> None:
    result = run_rc("serve", "--data", f"{tmp_path}/data", *args, env={"RC_TOKENS": "a:admin"})
    assert result.exit_code == 1
    assert flag in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_rc_up_refuses_the_serve_policy_flags(run_rc: Rc, tmp_path: object) -> None:
    # rc up passes no rc serve flag through; these are refused, never ignored.
    for flag, value in (
        ("--priority-aging", "1m"),
        ("--log-retention", "1h"),
        ("--max-log-bytes", "1MiB"),
        ("--max-devices-per-submitter", "2"),
        ("--limits", "limits.yaml"),
    ):
        result = run_rc("up", "--data", f"{tmp_path}/up", flag, value)
        assert result.exit_code == 1
        assert flag in result.stderr, result.stderr


def test_policy_converts_to_whole_seconds_and_bytes() -> None:
    assert serve.policy(90.0, 86400.0, 65536, 4) == {
        "priority_aging": 90,
        "log_retention": 86400,
        "max_log_bytes": 65536,
        "max_devices_per_submitter": 4,
        "preemption": 1,
        "preempt_min_runtime": 60,
        "preempt_grace": 30,
    }
    # EXT-PREEMPT-3: on or off, nothing else.
    assert serve.policy(0, 0, 0, None, "off", 0, 5)["preemption"] == 0
    with pytest.raises(ValueError, match="--preemption must be on or off"):
        serve.policy(0, 0, 0, None, "maybe")
    assert serve.policy(0.0, 0.0, 0) == {
        "priority_aging": 0,
        "log_retention": 0,
        "max_log_bytes": 0,
        "max_devices_per_submitter": 0,  # no flag: no limit (EXT-SHARE-1)
        "preemption": 1,
        "preempt_min_runtime": 60,
        "preempt_grace": 30,
    }
