"""``rc serve --limits FILE`` (EXT-SHARE-1): what the file may say, and how a bad one is
named by its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from resource_controller.controller import sharelimits
from resource_controller.core.share import SubmitterLimits


def test_names_and_a_default() -> None:
    text = 'limits:\n  alice: 4\n  "*": 2\n  bob@box/s1: 0\n'
    assert sharelimits.parse(text) == SubmitterLimits(2, {"alice": 4, "bob@box/s1": 0})


def test_nothing_under_limits_is_no_limit() -> None:
    assert sharelimits.parse("limits:\n") == SubmitterLimits()
    assert sharelimits.parse("limits: {}\n") == SubmitterLimits()


def test_the_flag_is_the_default_when_the_file_has_none() -> None:
    assert sharelimits.parse("limits:\n  alice: 4\n", flag_default=1) == SubmitterLimits(
        1, {"alice": 4}
    )


def test_a_default_from_both_the_file_and_the_flag_is_refused() -> None:
    with pytest.raises(sharelimits.LimitsError, match=r"\*.*--max-devices-per-submitter"):
        sharelimits.parse('limits:\n  "*": 2\n', "f.yaml", flag_default=3)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("limits:\n  alice: -1\n", 2, "alice: a limit is a whole number of devices"),
        ("limits:\n  alice: four\n", 2, "got 'four'"),
        ("limits:\n  alice: 2.5\n", 2, "got '2.5'"),
        ("limits:\n  alice: true\n", 2, "got 'true'"),
        ('limits:\n  alice: "4"\n', 2, "got '4'"),
        ("limits:\n  alice: 99999999999\n", 2, "0..2147483647"),
        ("limits:\n  alice: [1]\n", 2, "got a sequence"),
        (
            "limits:\n  alice: 4\n  bob: 1\n  alice: 2\n",
            4,
            "'alice' is given twice (first on line 2)",
        ),
        ("limits:\n  1: 3\n", 2, "a name must be a non-empty string"),
        ("alice: 4\n", 1, "unknown key 'alice'"),
        ("limits:\n  a: 1\nlimit:\n  b: 2\n", 3, "unknown key 'limit'"),
        ("limits: [alice]\n", 1, "expected name: devices pairs"),
        ("", 1, "the file is empty"),
        ("limits:\n  alice: [\n", 3, "not YAML"),
        ("- alice\n", 1, 'expected a mapping "limits:"'),
    ],
)
def test_a_bad_file_is_named_by_its_line(text: str, line: int, words: str) -> None:
    with pytest.raises(sharelimits.LimitsError) as info:
        sharelimits.parse(text, "/etc/rc/limits.yaml")
    assert str(info.value).startswith(f"/etc/rc/limits.yaml line {line}: "), info.value
    assert words in str(info.value)


def test_load_reads_the_file_and_names_one_it_cannot(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("limits:\n  alice: 3\n")
    assert sharelimits.load(path) == SubmitterLimits(None, {"alice": 3})
    with pytest.raises(sharelimits.LimitsError, match="cannot read it"):
        sharelimits.load(tmp_path / "missing.yaml")


def test_describe() -> None:
    assert sharelimits.describe(SubmitterLimits(2, {"b": 1, "a": 4})) == (
        "a 4, b 1; everyone else 2"
    )
    assert sharelimits.describe(SubmitterLimits(None, {})) == "no names; everyone else no limit"
