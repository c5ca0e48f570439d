"""resource-controller: exclusive leases on shared hardware, GPUs first.

``from resource_controller import Client`` is the Python way in (EXT-PYAPI-1); the
error types are here too, so that callers can catch the project's own exceptions
without knowing its module layout. The client is imported on first use: ``rc`` itself
imports this package on every start, and the CLI's hot path must not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resource_controller.errors import (
    ApiError,
    ClientError,
    NoDeviceError,
    NotCancellableError,
    RcError,
    TransportError,
)

if TYPE_CHECKING:
    from resource_controller.client.api import Client

__all__ = [
    "ApiError",
    "Client",
    "ClientError",
    "NoDeviceError",
    "NotCancellableError",
    "RcError",
    "TransportError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Load ``Client`` and ``__version__`` lazily (PEP 562)."""
    if name == "Client":
        from resource_controller.client.api import Client

        return Client
    if name == "__version__":
        from importlib import metadata

        try:
            return metadata.version("resource-controller")
        except metadata.PackageNotFoundError:
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
