"""Selectors: grammar, errors, normal form, quantities and matching (store.md §18)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resource_controller.core import selectors
from resource_controller.core.selectors import SelectorError, Term, normalise, parse, quantity

G = 2**30


def matches(selector: str, labels: dict[str, str]) -> bool:
    return parse(selector).matches(labels)


# ---- SEL-001 grammar ------------------------------------------------------------------


def test_terms_keep_order_and_every_operator_parses() -> None:
    # SEL-001: a conjunction of key op value terms, in the order written.
    sel = parse("a=1,b!=2,c>=3,d<=4")
    assert sel.terms == (
        Term("a", "=", "1"),
        Term("b", "!=", "2"),
        Term("c", ">=", "3"),
        Term("d", "<=", "4"),
    )


def test_inner_spaces_are_kept_and_outer_spaces_dropped() -> None:
    # SEL-001: whitespace around keys and values is ignored; inner spaces are part of them.
    assert parse("  gpu model =  A 100 ").terms == (Term("gpu model", "=", "A 100"),)


def test_duplicate_keys_are_allowed_and_each_term_must_hold() -> None:
    # SEL-001: duplicate keys allowed; a conjunction.
    sel = parse("vram>=40G,vram<=80G")
    assert sel.matches({"vram": "80G"})
    assert sel.matches({"vram": "40G"})
    assert not sel.matches({"vram": "81G"})
    assert not sel.matches({"vram": "24G"})


def test_keys_and_values_are_case_sensitive() -> None:
    # SEL-001
    assert matches("vendor=nvidia", {"vendor": "nvidia"})
    assert not matches("vendor=nvidia", {"vendor": "NVIDIA"})
    assert not matches("Vendor=nvidia", {"vendor": "nvidia"})


def test_all_terms_must_hold() -> None:
    # SEL-001: conjunction.
    assert matches("vendor=nvidia,model=h100", {"vendor": "nvidia", "model": "h100"})
    assert not matches("vendor=nvidia,model=h100", {"vendor": "nvidia", "model": "a100"})


# ---- SEL-002 operator recognition -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "term"),
    [
        ("a!=b", Term("a", "!=", "b")),
        ("a>=b", Term("a", ">=", "b")),
        ("a<=b", Term("a", "<=", "b")),
        ("a=b", Term("a", "=", "b")),
        ("a = b", Term("a", "=", "b")),
    ],
)
def test_operator_is_recognised(text: str, term: Term) -> None:
    # SEL-002
    assert parse(text).terms == (term,)


@pytest.mark.parametrize(
    "text",
    [
        "a=b=c",  # SEL-002: value contains "="
        "a>=b>=c",
        "a==b",
        "a=>b",
        "a!=b=c",
        "a<=b>=c",  # ">=" is tried first, so the key "a<=b" holds an operator character
        "a=b!c",
        "a=b<c",
    ],
)
def test_embedded_operator_characters_are_errors(text: str) -> None:
    # SEL-002, SEL-003: key or value containing = ! < > is an error naming the term.
    with pytest.raises(SelectorError) as exc:
        parse(text)
    assert text in str(exc.value)


@pytest.mark.parametrize("text", ["a>b", "a<b", "vendor", "nvidia gpu"])
def test_no_operator_is_an_error(text: str) -> None:
    # SEL-002: ">" and "<" alone are not operators; SEL-003 "no operator".
    with pytest.raises(SelectorError) as exc:
        parse(text)
    assert text in str(exc.value)
    assert "no operator" in str(exc.value)


# ---- SEL-003 parse errors ---------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\t  \n"])
def test_blank_selector_has_its_own_error(text: str) -> None:
    # SEL-003: a blank selector is its own, distinct error (not an "empty term").
    with pytest.raises(SelectorError) as blank:
        parse(text)
    with pytest.raises(SelectorError) as empty_term:
        parse("a=b,,c=d")
    assert str(blank.value) != str(empty_term.value)
    assert "empty selector" in str(blank.value)


@pytest.mark.parametrize("text", ["a=b,,c=d", ",a=b", "a=b,", ",", "a=b, ,c=d"])
def test_empty_term_is_an_error_naming_the_selector(text: str) -> None:
    # SEL-003
    with pytest.raises(SelectorError) as exc:
        parse(text)
    assert "empty term" in str(exc.value)
    assert text in str(exc.value)


@pytest.mark.parametrize("text", ["=nvidia", "vendor=", " = ", "vram>=", "<=40G", "x!= "])
def test_missing_key_or_value_is_an_error(text: str) -> None:
    # SEL-003
    with pytest.raises(SelectorError) as exc:
        parse(text)
    assert text.strip() in str(exc.value)


def test_the_error_names_the_offending_term_among_good_ones() -> None:
    # SEL-003: each error names the offending term.
    with pytest.raises(SelectorError) as exc:
        parse("vendor=nvidia,vram,model=h100")
    assert "'vram'" in str(exc.value)


# ---- SEL-004 normal form ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        (" vendor = nvidia , vram >= 40G ", "vendor=nvidia,vram>=40G"),
        ("b=1,a=2", "b=1,a=2"),  # original order
        ("a != b", "a!=b"),
        ("gpu model <= A 100", "gpu model<=A 100"),
        ("x=1,x=1", "x=1,x=1"),  # duplicates are kept
    ],
)
def test_normal_form(text: str, normal: str) -> None:
    # SEL-004
    assert normalise(text) == normal
    assert str(parse(text)) == normal


# ---- SEL-005 absent key -------------------------------------------------------------------


@pytest.mark.parametrize("selector", ["vendor=amd", "vendor!=amd", "vram>=1", "vram<=1"])
def test_absent_key_never_matches(selector: str) -> None:
    # SEL-005: including "!=".
    assert not matches(selector, {"model": "h100"})
    assert not matches(selector, {})


# ---- SEL-006 quantities -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("595.78", 595.78),
        ("40G", 40 * G),
        ("40g", 40 * G),
        ("81920M", 81920 * 2**20),
        ("1.5T", 1.5 * 2**40),
        ("2K", 2048.0),
        ("2k", 2048.0),
        ("-3", -3.0),
        (" 40", 40.0),
        ("40 ", 40.0),
        ("40 G", 40 * G),  # the rest is trimmed before parsing
        ("+7", 7.0),
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("2.5e-1", 0.25),
        ("1_000", 1000.0),
        ("1_000.5_5", 1000.55),
        ("inf", math.inf),
        ("-Infinity", -math.inf),
        ("+INF", math.inf),
        ("1e300K", 1e300 * 1024),
    ],
)
def test_quantities(text: str, value: float) -> None:
    # SEL-006
    assert quantity(text) == pytest.approx(value)


def test_nan_is_a_quantity_but_only_unsigned() -> None:
    # SEL-006: "nan" (unsigned), case-insensitive.
    q = quantity("NaN")
    assert q is not None and math.isnan(q)
    assert quantity("-nan") is None
    assert quantity("+nan") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[N/A]M",
        "580.173.02",
        "40GB",
        "40Gi",
        "40G ",  # a trailing space after the suffix
        "G",
        "lots",
        "1__000",
        "_1",
        "1_",
        "1e400",  # overflows a double
        "-1e400",
        "1 000",
        "0x10",
        "4O",
    ],
)
def test_not_quantities(text: str) -> None:
    # SEL-006
    assert quantity(text) is None


@pytest.mark.parametrize("text", ["\u0664\u0660G", "\uff14\uff10"])
def test_non_ascii_digits_are_not_quantities(text: str) -> None:
    # SEL-006: "ASCII decimal digits".
    assert quantity(text) is None


# ---- SEL-007 comparison -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "have", "expected"),
    [
        # both quantities: numeric
        ("v=1K", "1024", True),
        ("v!=1K", "1024", False),
        ("v>=1.5", "2", True),
        ("v<=1.5", "2", False),
        ("v>=9", "10", True),  # numeric, though "10" < "9" as strings
        # neither a quantity: string
        ("v=abc", "abc", True),
        ("v!=abc", "abd", True),
        ("v>=abc", "abd", True),
        ("v<=abc", "abd", False),
        # exactly one side a quantity
        ("v=40G", "forty", False),
        ("v!=40G", "forty", True),
        ("v>=40G", "forty", False),
        ("v<=40G", "forty", False),
        ("v>=forty", "40G", False),
        ("v<=forty", "40G", False),
        # NaN compares false except !=
        ("v=nan", "nan", False),
        ("v!=nan", "nan", True),
        ("v>=nan", "nan", False),
        ("v<=nan", "1", False),
    ],
)
def test_comparison_table(selector: str, have: str, expected: bool) -> None:
    # SEL-007
    assert matches(selector, {"v": have}) is expected


def test_string_order_is_code_point_order() -> None:
    # SEL-007: byte order of UTF-8, which Python's str order reproduces.
    assert matches("name>=Z", {"name": "a"})  # 'a' (0x61) sorts after 'Z' (0x5a)
    assert matches("name>=z", {"name": "\u00e9"})  # é after z in UTF-8 bytes
    assert not matches("name<=z", {"name": "\u00e9"})


# ---- SEL-008 consequences ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "have", "expected"),
    [
        ("vram>=40G", "80G", True),
        ("vram>=40G", "40G", True),
        ("vram>=40G", "81920M", True),
        ("vram>=40G", "24G", False),
        ("vram>=40G", "[N/A]M", False),
        ("vram<=40G", "[N/A]M", False),
        ("vram>=lots", "80G", False),
        ("model>=a100", "h100", True),
        ("model>=a100", "a10", False),
        ("vram=40G", "40960M", True),
        ("vram=[N/A]M", "[N/A]M", True),
        ("vram!=[N/A]M", "80G", True),
        ("vram!=[N/A]M", "[N/A]M", False),
        ("driver>=500", "580.173.02", False),
        ("driver>=500", "595.78", True),
    ],
)
def test_sel_008_examples(selector: str, have: str, expected: bool) -> None:
    # SEL-008
    key = re.split("[!<>=]", selector)[0]
    assert matches(selector, {key: have}) is expected


def test_sel_008_not_equal_does_not_match_a_device_without_the_key() -> None:
    # SEL-008 / SEL-005
    assert not matches("vendor!=amd", {"model": "h100"})
    assert matches("vendor!=amd", {"vendor": "nvidia"})


# ---- properties -------------------------------------------------------------------------------

_plain = st.text(
    alphabet=st.characters(exclude_characters=",=!<>", exclude_categories=["Cs"]),
    min_size=1,
    max_size=8,
).filter(lambda s: s.strip() != "")
_space = st.text(alphabet=" \t", max_size=2)


@st.composite
def selector_texts(draw: st.DrawFn) -> str:
    terms = []
    for _ in range(draw(st.integers(1, 4))):
        key, value = draw(_plain), draw(_plain)
        op = draw(st.sampled_from(selectors._OPS))
        terms.append(draw(_space) + key + draw(_space) + op + draw(_space) + value + draw(_space))
    return ",".join(terms)


@given(selector_texts())
def test_normalise_is_idempotent_and_round_trips(text: str) -> None:
    # SEL-004: the stored normal form parses back to the same selector.
    sel = parse(text)
    normal = normalise(text)
    assert normalise(normal) == normal
    assert parse(normal) == sel
    assert " " + sel.terms[0].op not in normal  # no spaces around operators


@given(st.text(alphabet="ab =!<>,\t", max_size=12))
def test_anything_that_parses_normalises_idempotently(text: str) -> None:
    # SEL-003/004 over arbitrary text: either a SelectorError or a stable normal form.
    try:
        sel = parse(text)
    except SelectorError:
        return
    assert parse(str(sel)) == sel
    assert normalise(str(sel)) == str(sel)


@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["", "K", "M", "G", "T"]))
def test_rendered_floats_are_quantities(x: float, suffix: str) -> None:
    # SEL-006: anything Python renders as a finite float is a quantity, suffix applied.
    mult = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    assert quantity(repr(x) + suffix) == pytest.approx(x * mult)
