"""Label selectors: parse, normalise, and match against a device's labels (SEL-001..010).

A selector is a conjunction of ``key op value`` terms. Quantities (``40G``,
``81920M``) compare numerically; a term whose key a device lacks never matches, not
even ``!=``, because a missing fact cannot show that the device differs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

_OPS = ("!=", ">=", "<=", "=")
_FORBIDDEN = set("=!<>")
_SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_FLOAT = re.compile(  # ASCII digits only (SEL-006)
    r"[+-]?(?:(?:\d(?:_?\d)*)?\.?\d(?:_?\d)*(?:[eE][+-]?\d(?:_?\d)*)?|\d(?:_?\d)*\.)",
    re.ASCII,
)
_SPECIAL = re.compile(r"[+-]?(?:inf|infinity)|nan", re.IGNORECASE)


class SelectorError(ValueError):
    """A selector did not parse; the message names the offending term."""


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

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every term holds for these effective labels."""
        return all(_holds(t, labels) for t in self.terms)


def parse(text: str) -> Selector:
    """Parse a selector (SEL-001..003); raise ``SelectorError`` naming the bad part."""
    if not text.strip():
        raise SelectorError("empty selector")
    terms = []
    for raw in text.split(","):
        if not raw.strip():
            raise SelectorError(f"empty term in selector {text!r}")
        terms.append(_parse_term(raw))
    return Selector(tuple(terms))


def _parse_term(raw: str) -> Term:
    for op in _OPS:
        idx = raw.find(op)
        if idx >= 0:
            key, value = raw[:idx].strip(), raw[idx + len(op) :].strip()
            if not key or not value:
                raise SelectorError(f"term {raw.strip()!r} needs a key and a value")
            if _FORBIDDEN & set(key) or _FORBIDDEN & set(value):
                raise SelectorError(f"term {raw.strip()!r} has a stray operator character")
            return Term(key, op, value)
    raise SelectorError(f"term {raw.strip()!r} has no operator (use =, !=, >= or <=)")


def normalise(text: str) -> str:
    """The stored form: ``vendor=nvidia,vram>=40G`` (SEL-004)."""
    return str(parse(text))


def quantity(s: str) -> float | None:
    """A label value as a number, or None when it is not a quantity (SEL-006)."""
    if not s:
        return None
    mult = 1.0
    if s[-1].upper() in _SUFFIX:
        mult = _SUFFIX[s[-1].upper()]
        s = s[:-1]
    s = s.strip()
    if _SPECIAL.fullmatch(s):
        return float(s.replace("infinity", "inf").replace("INFINITY", "inf")) * mult
    if not s or not _FLOAT.fullmatch(s):
        return None
    try:
        v = float(s.replace("_", ""))
    except ValueError:
        return None
    if math.isinf(v):
        return None  # a literal that overflows a double is not a quantity
    return v * mult


def _holds(term: Term, labels: Mapping[str, str]) -> bool:
    have = labels.get(term.key)
    if have is None:
        return False
    hq, wq = quantity(have), quantity(term.value)
    if hq is not None and wq is not None:
        return {
            "=": hq == wq,
            "!=": hq != wq,
            ">=": hq >= wq,
            "<=": hq <= wq,
        }[term.op]
    if (hq is None) != (wq is None):
        return term.op == "!="  # one-sided: ordered ops never match, = is false
    return {
        "=": have == term.value,
        "!=": have != term.value,
        ">=": have >= term.value,
        "<=": have <= term.value,
    }[term.op]
