"""resource-controller: exclusive leases on shared hardware, GPUs first.

``from resource_controller import Client`` is the Python way in. Everything but the
error types is imported on first use: ``rc`` imports this package on every start.
"""

from __future__ import annotations

from resource_controller.errors import (
    ApiError,
    ClientError,
    NoDeviceError,
    NotCancellableError,
    RcError,
    TransportError,
)

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any

    from resource_controller.client.aio import AsyncClient, AsyncJob, AsyncLease
    from resource_controller.client.models import (
        Device,
        DeviceDetails,
        Explanation,
        JobInfo,
        Label,
        LeaseInfo,
        RunResult,
        Usage,
        UsageGroup,
    )
    from resource_controller.client.sync import Client, Job, Lease
    from resource_controller.client.typed import CountNotHonoured, JobFailed, NotGranted
    from resource_controller.client.waits import LostContact, PollGiveUp, WaitTimeout

#: Public name -> the module that defines it, loaded on first access (PEP 562).
_LAZY = {
    "Client": "resource_controller.client.sync",
    "Job": "resource_controller.client.sync",
    "Lease": "resource_controller.client.sync",
    "JobFailed": "resource_controller.client.typed",
    "NotGranted": "resource_controller.client.typed",
    "AsyncClient": "resource_controller.client.aio",
    "AsyncJob": "resource_controller.client.aio",
    "AsyncLease": "resource_controller.client.aio",
    "Device": "resource_controller.client.models",
    "DeviceDetails": "resource_controller.client.models",
    "Explanation": "resource_controller.client.models",
    "JobInfo": "resource_controller.client.models",
    "Label": "resource_controller.client.models",
    "LeaseInfo": "resource_controller.client.models",
    "RunResult": "resource_controller.client.models",
    "Usage": "resource_controller.client.models",
    "UsageGroup": "resource_controller.client.models",
    "CountNotHonoured": "resource_controller.client.typed",
    "LostContact": "resource_controller.client.waits",
    "PollGiveUp": "resource_controller.client.waits",
    "WaitTimeout": "resource_controller.client.waits",
}

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncJob",
    "AsyncLease",
    "Client",
    "ClientError",
    "CountNotHonoured",
    "Device",
    "DeviceDetails",
    "Explanation",
    "Job",
    "JobFailed",
    "JobInfo",
    "Label",
    "Lease",
    "LeaseInfo",
    "LostContact",
    "NoDeviceError",
    "NotCancellableError",
    "NotGranted",
    "PollGiveUp",
    "RcError",
    "RunResult",
    "TransportError",
    "Usage",
    "UsageGroup",
    "WaitTimeout",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Load the client side and ``__version__`` lazily (PEP 562)."""
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(module), name)
    if name == "__version__":
        from resource_controller import version

        return version.installed_version(default="0+unknown")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
