"""``RC_TEST_TIMINGS``: one grammar for both processes (``core.testtimings``)."""

from __future__ import annotations

import pytest

from resource_controller.core.testtimings import TestTimingsError, parse

KNOWN = ("grace", "sweep_interval")


def test_blank_overrides_nothing() -> None:
    assert parse(None, KNOWN) == {}
    assert parse("  ", KNOWN) == {}


def test_pairs_with_spaces_and_one_trailing_comma() -> None:
    assert parse(" grace = 1.5 , sweep_interval=0.25,", KNOWN) == {
        "grace": 1.5,
        "sweep_interval": 0.25,
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("grace", "malformed entry 'grace'"),
        ("grace=1,,sweep_interval=2", "malformed entry ''"),
        (",", "malformed entry ''"),
        ("=3", "malformed entry '=3'"),
        ("nope=1", "unknown timing 'nope' (known: grace, sweep_interval)"),
        ("grace=1,grace=2", "grace given twice"),
        ("grace=soon", "grace='soon' is not a number"),
        ("grace=-1", "grace must be a finite non-negative number"),
        ("grace=inf", "grace must be a finite non-negative number"),
        ("sweep_interval=0", "sweep_interval must be a finite positive number"),
    ],
)
def test_refusals_name_the_variable_and_the_entry(text: str, says: str) -> None:
    with pytest.raises(TestTimingsError) as caught:
        parse(text, KNOWN, positive=("sweep_interval",))
    assert str(caught.value).startswith("RC_TEST_TIMINGS: ")
    assert says in str(caught.value)


def test_zero_is_fine_where_positive_is_not_asked() -> None:
    assert parse("grace=0", KNOWN, positive=("sweep_interval",)) == {"grace": 0.0}
