"""Label selectors: a conjunction of ``key op value`` terms. A missing key never matches, not even
``!=``: a missing fact cannot show the device differs. Linear in the text (no backtracking
pattern); a ``Meter`` counts characters examined so tests need no timing."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_OPS = ("!=", ">=", "<=", "=", "~")
#: The operator tried only when none of SEL-002's occurs in a term: substring.
CONTAINS = "~"
_FORBIDDEN = frozenset("=!<>")
#: SEL-006's suffixes; also their ``i``/``iB`` spellings.
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: The ``B`` spellings: decimal, as vendors mean ``GB``.
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
#: Size prefixes this module does not scale by: a selector value using one is refused.
_UNSUPPORTED_PREFIXES = frozenset("PEZY")
_DIGITS = frozenset("0123456789")  # ASCII digits only
_SPECIAL = frozenset(s + w for s in ("", "+", "-") for w in ("inf", "infinity")) | {
    "nan"
}  # case-insensitive, ASCII


class SelectorError(ValueError):
    """A selector did not parse; the message names the offending term."""


class Meter:
    """Counts the characters a parse or a match examines."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0


@dataclass(frozen=True)
class Term:
    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True)
class Selector:
    terms: tuple[Term, ...]

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.terms)

    def matches(self, labels: Mapping[str, str], meter: Meter | None = None) -> bool:
        """True when every term holds for these effective labels."""
        return all(_holds(t, labels, meter) for t in self.terms)


def _trim(text: str, start: int, end: int) -> tuple[int, int, int]:
    """``text[start:end]`` without surrounding whitespace, as bounds; plus steps taken."""
    i, j = start, end
    while i < j and text[i].isspace():
        i += 1
    while j > i and text[j - 1].isspace():
        j -= 1
    return i, j, (i - start) + (end - j) + 1


def parse(text: str, meter: Meter | None = None) -> Selector:
    """Parse a selector; raise ``SelectorError`` naming the bad part. One pass per term
    finds every operator's first occurrence; SEL-002's order then picks the split."""
    n = len(text)
    first, last, steps = _trim(text, 0, n)
    try:
        if first == last:
            raise SelectorError("empty selector")
        terms = []
        start = 0
        while True:
            ne = ge = le = eq = tl = -1
            forbidden = 0
            blank = True
            j = start
            while j < n:
                c = text[j]
                if c == ",":
                    break
                if c == CONTAINS and tl < 0:
                    tl = j
                elif c in _FORBIDDEN:
                    forbidden += 1
                    if c == "=":
                        if eq < 0:
                            eq = j
                        if j > start:
                            p = text[j - 1]
                            if p == "!" and ne < 0:
                                ne = j - 1
                            elif p == ">" and ge < 0:
                                ge = j - 1
                            elif p == "<" and le < 0:
                                le = j - 1
                if blank and not c.isspace():
                    blank = False
                j += 1
            steps += j - start + 1
            if blank:
                raise SelectorError(f"empty term in selector {text!r}")
            terms.append(_split_term(text, start, j, (ne, ge, le, eq, tl), forbidden, meter))
            if j >= n:
                break
            start = j + 1
    finally:
        _charge(meter, steps)
    return Selector(tuple(terms))


def _split_term(
    text: str,
    start: int,
    end: int,
    found: tuple[int, int, int, int, int],
    forbidden: int,
    meter: Meter | None,
) -> Term:
    """SEL-002 on ``text[start:end]``, given each operator's first index (-1: absent);
    ``~`` last, so that it splits only a term none of SEL-002's operators does."""
    for op, idx in zip(_OPS, found, strict=True):
        if idx < 0:
            continue
        k0, k1, ks = _trim(text, start, idx)
        v0, v1, vs = _trim(text, idx + len(op), end)
        _charge(meter, ks + vs)
        if k0 == k1 or v0 == v1:
            raise SelectorError(f"term {_shown(text, start, end)!r} needs a key and a value")
        # Every character of SEL-002's operators is an operator character; none of ~'s.
        if forbidden > (0 if op == CONTAINS else len(op)):
            raise SelectorError(f"term {_shown(text, start, end)!r} has a stray operator character")
        return Term(text[k0:k1], op, text[v0:v1])
    raise SelectorError(
        f"term {_shown(text, start, end)!r} has no operator (use =, !=, >=, <= or ~)"
    )


def _shown(text: str, start: int, end: int) -> str:
    i, j, _ = _trim(text, start, end)
    return text[i:j]


def _charge(meter: Meter | None, steps: int) -> None:
    if meter is not None:
        meter.steps += steps


def normalise(text: str) -> str:
    """The stored form: ``vendor=nvidia,vram>=40G``."""
    return str(parse(text))


# SEL-006's literal, as a deterministic automaton over character classes:
#   [+-]? ( D ( "." (D E?)? | E )? | "." D E? )     D = digit ("_"? digit)*
#   E = [eE] [+-]? D
# Classes: d digit, u "_", p ".", e "e"/"E", s "+"/"-". A state without a transition
# for the class rejects; the literal is accepted when the input ends in _ACCEPT.
_NEXT: dict[tuple[str, str], str] = {
    ("start", "s"): "sign",
    ("start", "d"): "int",
    ("start", "p"): "dot0",
    ("sign", "d"): "int",
    ("sign", "p"): "dot0",
    ("int", "d"): "int",
    ("int", "u"): "int_u",
    ("int", "p"): "dot",
    ("int", "e"): "exp",
    ("int_u", "d"): "int",
    ("dot", "d"): "frac",
    ("dot0", "d"): "frac",
    ("frac", "d"): "frac",
    ("frac", "u"): "frac_u",
    ("frac", "e"): "exp",
    ("frac_u", "d"): "frac",
    ("exp", "s"): "exp_s",
    ("exp", "d"): "expd",
    ("exp_s", "d"): "expd",
    ("expd", "d"): "expd",
    ("expd", "u"): "expd_u",
    ("expd_u", "d"): "expd",
}
_ACCEPT = frozenset({"int", "dot", "frac", "expd"})
_CLASS = {c: "d" for c in _DIGITS} | {"_": "u", ".": "p", "e": "e", "E": "e", "+": "s", "-": "s"}


def _is_literal(s: str, start: int, end: int) -> tuple[bool, int]:
    """Whether ``s[start:end]`` is a SEL-006 number literal; plus characters examined."""
    state = "start"
    i = start
    while i < end:
        nxt = _NEXT.get((state, _CLASS.get(s[i], "x")))
        i += 1
        if nxt is None:
            return False, i - start
        state = nxt
    return state in _ACCEPT, i - start + 1


def _unit(s: str) -> tuple[float, int]:
    """The multiplier of the size unit ending ``s`` and where its number ends (``(1, len(s))`` for
    none): ``K M G T`` alone or with ``i``/``iB`` binary (SEL-006), with ``B`` decimal; any case."""
    end = len(s)
    last = s[-1]
    if last in "bB":
        if end >= 3 and s[end - 2] in "iI" and s[end - 3].upper() in _BINARY:
            return _BINARY[s[end - 3].upper()], end - 3
        if end >= 2 and s[end - 2].upper() in _DECIMAL:
            return _DECIMAL[s[end - 2].upper()], end - 2
        return 1.0, end - 1
    if last in "iI":
        if end >= 2 and s[end - 2].upper() in _BINARY:
            return _BINARY[s[end - 2].upper()], end - 2
        return 1.0, end
    if last.upper() in _BINARY:
        return _BINARY[last.upper()], end - 1
    return 1.0, end


def quantity(s: str, meter: Meter | None = None) -> float | None:
    """A label value as a number (SEL-006, with ``_unit``'s sizes), or None."""
    if not s:
        return None
    mult, end = _unit(s)
    i, j, steps = _trim(s, 0, end)
    if i == j:
        _charge(meter, steps)
        return None
    if j - i <= 9 and s[i:j].isascii() and s[i:j].lower() in _SPECIAL:
        _charge(meter, steps + j - i)
        return float(s[i:j]) * mult
    ok, scanned = _is_literal(s, i, j)
    _charge(meter, steps + scanned)
    if not ok:
        return None
    try:
        v = float(s[i:j].replace("_", ""))
    except ValueError:
        return None
    if math.isinf(v):
        return None  # a literal that overflows a double is not a quantity
    return v * mult


def unsupported_unit(value: str) -> str | None:
    """The unit of ``value`` when it is a number with a size unit beyond ``T`` written with
    ``i`` or ``B`` (``2PB``, ``3Pi``), else None; a bare ``P`` is no unit (``1080P``)."""
    end = len(value)
    if end and value[end - 1] in "bB":
        end -= 1
    if end and value[end - 1] in "iI":
        end -= 1
    if end == len(value) or not end or value[end - 1].upper() not in _UNSUPPORTED_PREFIXES:
        return None
    i, j, _ = _trim(value, 0, end - 1)
    ok, _ = _is_literal(value, i, j)
    return value[end - 1 :] if ok and i < j else None


def validate(text: str, meter: Meter | None = None) -> Selector:
    """Parse a request's selector, refusing an unknown size unit by name; stored selectors are only
    parsed, so a new rule never strands a queued job."""
    selector = parse(text, meter)
    for term in selector.terms:
        unit = unsupported_unit(term.value) if term.op != CONTAINS else None
        if unit is not None:
            raise SelectorError(
                f"term {str(term)!r}: unknown size unit {unit!r}"
                " (use K, M, G or T; with B for powers of ten, i or iB for powers of two)"
            )
    return selector


def _holds(term: Term, labels: Mapping[str, str], meter: Meter | None = None) -> bool:
    have = labels.get(term.key)
    _charge(meter, len(term.key))  # hashing the key
    if have is None:
        return False
    if term.op == CONTAINS:
        _charge(meter, len(have) + len(term.value))  # folding both, one linear search
        return term.value.casefold() in have.casefold()
    hq, wq = quantity(have, meter), quantity(term.value, meter)
    if hq is not None and wq is not None:
        return {
            "=": hq == wq,
            "!=": hq != wq,
            ">=": hq >= wq,
            "<=": hq <= wq,
        }[term.op]
    if (hq is None) != (wq is None):
        return term.op == "!="  # one-sided: ordered ops never match, = is false
    _charge(meter, min(len(have), len(term.value)))  # a string comparison
    return {
        "=": have == term.value,
        "!=": have != term.value,
        ">=": have >= term.value,
        "<=": have <= term.value,
    }[term.op]


#: How much a no-match hint shows, so an answer stays a line.
HINT_KEYS, HINT_VALUES, HINT_CHARS, HINT_KEY_LIST = 4, 5, 64, 8


def _clip(text: str) -> str:
    return text if len(text) <= HINT_CHARS else text[: HINT_CHARS - 3] + "..."


def no_match_hint(selector: Selector, labels: Sequence[Mapping[str, str]]) -> str:
    """A hint of what the devices have for ``selector``'s keys; bounded by ``HINT_*``."""
    if not labels:
        return "no device is registered"
    keys: list[str] = []
    for term in selector.terms:
        if term.key not in keys:
            keys.append(term.key)
            if len(keys) == HINT_KEYS:
                break
    counts: dict[str, dict[str, int]] = {k: {} for k in keys}
    every_key: set[str] = set()
    for device in labels:
        every_key.update(device)
        for key in keys:
            value = device.get(key)
            if value is not None:
                seen = counts[key]
                seen[value] = seen.get(value, 0) + 1
    parts: list[str] = []
    for key in keys:
        seen = counts[key]
        if not seen:
            parts.append(_absent_key(key, every_key))
            continue
        common = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = [
            f"{_clip(v)!r} ({n} device{'s' if n != 1 else ''})" for v, n in common[:HINT_VALUES]
        ]
        if len(common) > HINT_VALUES:
            shown.append(f"{len(common) - HINT_VALUES} more values")
        parts.append(f"{_clip(key)} has " + ", ".join(shown))
    for term in selector.terms:
        seen = counts.get(term.key, {})
        if term.op == "=" and term.value not in seen:
            wanted = term.value.casefold()
            if any(wanted in v.casefold() for v in seen):
                parts.append(
                    f"for a part of the value, write {_clip(term.key)}{CONTAINS}{_clip(term.value)}"
                )
                break
    return "; ".join(parts)


def _absent_key(key: str, every_key: set[str]) -> str:
    """``no device has a label <key>``, with the nearest keys or a few of them."""
    import difflib

    said = f"no device has a label {_clip(key)!r}"
    if not every_key:
        return said + " (the devices have no labels)"
    near = difflib.get_close_matches(key, sorted(every_key), n=3, cutoff=0.6)
    if near:
        return said + f" (did you mean {', '.join(_clip(k) for k in near)}?)"
    listed = sorted(every_key)
    shown = ", ".join(_clip(k) for k in listed[:HINT_KEY_LIST])
    more = f" and {len(listed) - HINT_KEY_LIST} more" if len(listed) > HINT_KEY_LIST else ""
    return said + f" (labels: {shown}{more})"
