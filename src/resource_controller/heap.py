"""The collector's settings: what start-up builds never becomes garbage, yet every
collection walks it (80-330 ms in a controller with 10,000 devices; ~3 ms of an
``rc run``'s imports), so it is frozen out of the collector's view.
"""

from __future__ import annotations

import gc

#: Allocations (net) between young collections, and young collections per older one:
#: 700 / 10 / 10 by default. Fewer, larger young collections let a request's
#: short-lived objects die by reference count before any collection sees them.
GC_THRESHOLDS = (50_000, 20, 20)


def settle() -> None:
    """Freeze what start-up built and collect less often, once, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def hold() -> None:
    """No collections while ``rc`` imports: they would find nothing to free."""
    gc.disable()


def release() -> None:
    """After ``rc``'s imports: freeze them, collect as usual from here on."""
    gc.freeze()
    gc.enable()
