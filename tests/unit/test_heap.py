"""``rc serve``, ``rc worker`` and ``rc up`` settle their heap before serving: what
start-up built leaves the collector's view, young collections are rarer, and cyclic
garbage made afterwards is still freed. ``rc`` itself holds collections off while it
imports."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from resource_controller import heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_start_up_objects_are_frozen_and_later_cycles_still_collected(restored_gc: None) -> None:
    survivor = _Node()
    heap.settle()
    assert gc.get_threshold() == heap.GC_THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert not any(o is survivor for o in gc.get_objects())  # out of every collection
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None  # a cycle made after start-up is freed


def test_rc_collects_nothing_during_its_imports_and_as_usual_after(restored_gc: None) -> None:
    heap.hold()
    try:
        assert not gc.isenabled()
    finally:
        heap.release()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
