"""Duration text (worker.md §0), compact durations (CLI-060) and ages (CLI-061)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resource_controller.core.durations import (
    DurationError,
    age,
    compact,
    parse_duration,
    render_duration,
    round_half_away,
)

# ---- rendering (worker.md §0 "Duration text") -------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "500ms"),
        (0.0015, "1.5ms"),
        (0.00025, "250µs"),
        (0.000000001, "1ns"),
        (0.0000015, "1.5µs"),
        (0.999, "999ms"),
        (30, "30s"),
        (60, "1m0s"),
        (90, "1m30s"),
        (120, "2m0s"),
        (3600, "1h0m0s"),
        (6 * 3600, "6h0m0s"),
        (4 * 3600, "4h0m0s"),
        (1.5, "1.5s"),
        (3661, "1h1m1s"),
        (3600 + 0.25, "1h0m0.25s"),
        (100 * 3600, "100h0m0s"),  # no days
        (-90, "-1m30s"),
        (-0.5, "-500ms"),
    ],
)
def test_render(seconds: float, text: str) -> None:
    assert render_duration(seconds) == text


def test_micro_sign_is_u00b5() -> None:
    # worker.md §0: `µs` is U+00B5, not the Greek mu.
    assert render_duration(0.00025).endswith("\u00b5s")


# ---- parsing (worker.md §0 "Duration input") ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("500ms", 0.5),
        ("0", 0),
        ("1m30s", 90),
        ("2h0m0s", 7200),
        ("100ns", 100e-9),
        ("250us", 250e-6),
        ("250\u00b5s", 250e-6),  # micro sign
        ("250\u03bcs", 250e-6),  # Greek mu
        ("+30s", 30),
        ("-1m", -60),
        ("1h1m1s", 3661),
        ("0s", 0),
        ("1m1m", 120),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "30", "1", "s", "1d", "1.5", "abc", "1h 30m", " 30s", "30s ", "-", "+", "1x", "h1", "1S"],
)
def test_parse_errors(text: str) -> None:
    # worker.md §0: only <decimal><unit> terms (and the bare 0); no days, no bare numbers.
    with pytest.raises(DurationError):
        parse_duration(text)


@given(st.integers(min_value=-(10**7), max_value=10**7))
def test_whole_seconds_round_trip(seconds: int) -> None:
    assert parse_duration(render_duration(seconds)) == seconds


@given(st.integers(min_value=1, max_value=999_999_999))
def test_sub_second_round_trip(ns: int) -> None:
    assert parse_duration(render_duration(ns / 1e9)) == pytest.approx(ns / 1e9, rel=1e-9)


# ---- CLI-060 compact -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (15, "15s"),
        (59, "59s"),
        (60, "1m0s"),
        (125, "2m5s"),
        (3599, "59m59s"),
        (3600, "1h0m0s"),
        (25 * 3600 + 61, "25h1m1s"),  # hours never become days
        (-125, "-2m5s"),
        (-15, "-15s"),
    ],
)
def test_compact(seconds: int, text: str) -> None:
    assert compact(seconds) == text


@pytest.mark.parametrize(
    ("value", "rounded"),
    [(2.5, 3), (123.6, 124), (123.4, 123), (0.5, 1), (0.49, 0), (-2.5, -3), (-0.4, 0), (0, 0)],
)
def test_round_half_away_from_zero(value: float, rounded: int) -> None:
    # CLI-060: `2m3.6s` -> `2m4s`, `2.5s` -> `3s`.
    assert round_half_away(value) == rounded


def test_compact_of_a_rounded_difference() -> None:
    # CLI-060 examples.
    assert compact(round_half_away(123.6)) == "2m4s"
    assert compact(round_half_away(2.5)) == "3s"


# ---- CLI-061 age -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s ago"),
        (3, "3s ago"),
        (59, "59s ago"),
        (60, "1m ago"),
        (240, "4m ago"),
        (3599, "59m ago"),
        (3600, "1h ago"),
        (86399, "23h ago"),
        (86400, "1d ago"),
        (9 * 86400, "9d ago"),
        (30 * 86400 - 1, "29d ago"),
        (30 * 86400, "1mo ago"),
        (3 * 2592000, "3mo ago"),
        (-5, "5s in the future (clock skew?)"),
        (-7200, "2h in the future (clock skew?)"),
    ],
)
def test_age(seconds: int, text: str) -> None:
    assert age(seconds) == text


def test_future_age_never_says_ago() -> None:
    # CLI-061
    assert "ago" not in age(-1)


def test_unreported_age() -> None:
    # CLI-061: never "0s ago" for an age the controller did not send.
    assert age(None) == "age unknown (controller may be out of date)"
