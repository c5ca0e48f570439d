"""The collector's settings for ``rc serve``, ``rc worker`` and ``rc up``: what start-up
builds never becomes garbage, yet every full collection walks it (80-330 ms in a
controller with 10,000 devices), so it is frozen out of the collector's view.
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
