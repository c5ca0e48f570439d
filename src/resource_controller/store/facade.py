"""``Store``: the one door to the database, the core with one aggregate per part of the state."""

from __future__ import annotations

from pathlib import Path

from resource_controller.clock import Clock
from resource_controller.store import arrays, devices, jobs, reports, views
from resource_controller.store.base import Core


class Store(Core):
    """The controller's state, behind serialised transactions."""

    def __init__(self, database: Path | str, clock: Clock, priority_aging: int = 0) -> None:
        """``database``: a SQLite file's path, or a ``postgresql://`` URL."""
        super().__init__(database, clock, priority_aging)
        self.queue = jobs.Queue(self)
        self.arrays = arrays.Arrays(self)
        self.reports = reports.Reports(self, self.queue)
        self.devices = devices.Devices(self)
        self.views = views.Views(self)
