"""``client/records.py``: the NamedTuple stand-in builds what ``typing.NamedTuple`` does."""

from __future__ import annotations

import typing

import pytest

TYPE_CHECKING = False  # as the modules on rc's start-up path declare their records
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from resource_controller.client.records import NamedTuple


class Ours(NamedTuple):
    """A record."""

    a: int
    b: str = "x"
    c: tuple[int, ...] = ()

    @property
    def twice(self) -> int:
        return self.a * 2

    def label(self) -> str:
        return f"{self.a}{self.b}"


class Theirs(typing.NamedTuple):
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


def test_fields_defaults_and_order_match_typing() -> None:
    assert not hasattr(Ours, "__orig_bases__")  # built by records, not by typing
    assert Ours._fields == Theirs._fields
    assert Ours._field_defaults == Theirs._field_defaults
    assert tuple(Ours(1)) == tuple(Theirs(1)) == (1, "x", ())
    assert Ours(2, "y") == Ours(a=2, b="y") != Ours(2)


def test_methods_properties_and_docstring_are_kept() -> None:
    r = Ours(3, "z")
    assert (r.twice, r.label(), Ours.__doc__) == (6, "3z", "A record.")
    assert r._replace(a=4) == Ours(4, "z")
    assert repr(r) == "Ours(a=3, b='z', c=())"
    assert Ours.__module__ == __name__


def test_records_are_immutable() -> None:
    r = Ours(1)
    with pytest.raises(AttributeError):
        r.a = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        setattr(r, "other", 1)  # noqa: B010


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="follows one with a default"):

        class Bad(NamedTuple):
            a: int = 0
            b: int  # type: ignore[misc]
