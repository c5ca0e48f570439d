"""The collector's settings for the long-running processes: ``rc serve``, ``rc worker``
and ``rc up``.

What start-up builds (the modules, the app, the configuration, the first reads) never
becomes garbage, yet every full collection walks it: 80-330 ms in a controller with
10,000 devices, about 6 ms in a worker, each one landing on whichever request or job
end set it off. Frozen once start-up is done, it leaves the collector's view.
"""

from __future__ import annotations

import gc

#: Allocations (net) between young collections, and young collections per older one:
#: 700 / 10 / 10 by default. Fewer, larger young collections let a request's
#: short-lived objects die by reference count before any collection sees them.
GC_THRESHOLDS = (50_000, 20, 20)


def settle() -> None:
    """Freeze what start-up built and collect less often, once, before serving.

    Cyclic garbage made afterwards is still collected, only later.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
