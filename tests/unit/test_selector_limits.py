"""Selectors in linear time (EXT-LIMITS-3), counted in steps rather than seconds.

The parser and the number scanner report every character they examine to a
``Meter``. For adversarial families of growing length the count must grow in
proportion to the length: a backtracking pattern (the old number regex took time
quadratic in a digit run followed by a bad character) would show up as a ratio near 4
each time the length doubles.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resource_controller.core import selectors
from resource_controller.core.selectors import Meter, SelectorError, parse, quantity

# The number pattern selectors used before the scanner: the oracle for what is a
# literal (fine on short inputs; it is only slow on long ones).
_REFERENCE = re.compile(
    r"[+-]?(?:(?:\d(?:_?\d)*)?\.?\d(?:_?\d)*(?:[eE][+-]?\d(?:_?\d)*)?|\d(?:_?\d)*\.)",
    re.ASCII,
)

LENGTHS = (1_000, 2_000, 4_000, 8_000, 16_000)


def steps(run: Callable[[Meter], object]) -> int:
    meter = Meter()
    with contextlib.suppress(SelectorError):
        run(meter)
    return meter.steps


def _parse(text: str) -> Callable[[Meter], object]:
    return lambda m: parse(text, m)


def _quantity(text: str) -> Callable[[Meter], object]:
    return lambda m: quantity(text, m)


def _match(selector: str, labels: dict[str, str]) -> Callable[[Meter], object]:
    sel = parse(selector)
    return lambda m: sel.matches(labels, m)


FAMILIES: dict[str, Callable[[int], Callable[[Meter], object]]] = {
    # long digit runs followed by a bad character (the measured 3.4 s case)
    "digits then x, in a selector": lambda n: _parse("cpus>=" + "1" * n + "x"),
    "digits then x, as a quantity": lambda n: _quantity("1" * n + "x"),
    "digits, dot, digits then e": lambda n: _quantity("1" * n + "." + "1" * n + "e"),
    "underscored digits then _": lambda n: _quantity("1_" * n + "_"),
    "digits then x, matched as a label": lambda n: _match("cpus>=1", {"cpus": "1" * n + "x"}),
    "digits then x, matched as a term": lambda n: _match("cpus>=" + "1" * n + "x", {"cpus": "8"}),
    "spaces around digits": lambda n: _quantity(" " * n + "1" * n + " " * n + "G"),
    # many operators
    "equals signs": lambda n: _parse("a" + "=" * n + "b"),
    "not-equals": lambda n: _parse("a" + "!=" * n + "b"),
    "mixed operator characters": lambda n: _parse("<>!=" * n),
    "many terms": lambda n: _parse(",".join(["a>=1"] * n)),
    "many empty terms": lambda n: _parse("a=b" + "," * n),
    # long keys and values
    "long key": lambda n: _parse("k" * n + "=v"),
    "long key, no operator": lambda n: _parse("k" * n),
    "long key matched": lambda n: _match("k" * n + "=v", {"k" * n: "v"}),
    "long string values compared": lambda n: _match("k>=" + "a" * n, {"k": "a" * n}),
    # size units and ~
    "digits then a unit": lambda n: _quantity("1" * n + "GiB"),
    "digits then a bad unit": lambda n: _quantity("1" * n + "xiB"),
    "many tildes": lambda n: _parse("a" + "~" * n + "b"),
    "contains, long value": lambda n: _match("k~" + "a" * 50 + "b", {"k": "a" * n}),
    "contains, long needle": lambda n: _match("k~" + "a" * n + "b", {"k": "a" * n}),
    "blank": lambda n: _parse(" " * n),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_steps_grow_linearly(family: str) -> None:
    # EXT-LIMITS-3: steps(n) ≤ c·n for every length, and doubling the length at most
    # (a little over) doubles the work.
    make = FAMILIES[family]
    counts = [steps(make(n)) for n in LENGTHS]
    for n, count in zip(LENGTHS, counts, strict=True):
        assert 0 < count <= 12 * n, (family, n, count)
    for small, large in itertools.pairwise(counts):
        assert large <= 2.2 * small, (family, counts)


def test_the_meter_counts_every_character_of_a_plain_parse() -> None:
    # The count is of characters examined: a term is read once, plus its trimming.
    text = "vendor=nvidia"
    assert len(text) <= steps(_parse(text)) <= 3 * len(text)


@settings(max_examples=2000)
@given(st.text(alphabet="0123456789_.eE+-x", max_size=12))
def test_the_scanner_accepts_exactly_the_reference_literals(text: str) -> None:
    # The automaton accepts the very language of the pattern it replaced (SEL-006).
    ok, _ = selectors._is_literal(text, 0, len(text))
    assert ok is bool(_REFERENCE.fullmatch(text))


#: A size unit at the end of a value (core/selectors.py): K M G T, alone or with i, iB
#: or B; or B alone. Any case.
_UNIT = re.compile(r"(.*?)(?:[KMGT](?:iB|i|B)?|B)?", re.IGNORECASE | re.DOTALL)


@settings(max_examples=1000)
@given(st.text(alphabet="0123456789_.eE+- kKmMgGtTiIbBnfaINFA", max_size=12))
def test_quantity_agrees_with_the_reference(text: str) -> None:
    # SEL-006's literal with the size units: a quantity exactly when the part before
    # the unit is a reference literal (or one of the words).
    match = _UNIT.fullmatch(text)
    assert match is not None
    body = match.group(1).strip()
    lowered = body.lower()
    special = lowered in {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan"}
    got = quantity(text)
    if not special and not (body and _REFERENCE.fullmatch(body)):
        assert got is None
    elif special:
        assert got is not None
    elif got is not None:
        assert math.isfinite(float(body.replace("_", "")))


@pytest.mark.parametrize("text", ["ınf", "İnf", "ınfınıty", "-ınf"])
def test_non_ascii_spellings_of_inf_are_not_quantities(text: str) -> None:
    # SEL-006: the words are ASCII. The old case-insensitive pattern let a dotless ı
    # through to float(), which raised: one such label value from a worker failed every
    # match against it.
    assert quantity(text) is None
    assert not parse("x>=1").matches({"x": text})
    assert parse("x!=1").matches({"x": text})
