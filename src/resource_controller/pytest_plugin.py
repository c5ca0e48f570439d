"""A pytest plugin: the ``rc_device`` fixture leases a device for one test.

Installed with the package (entry point ``pytest11``), so a test suite that needs a
GPU writes::

    @pytest.mark.rc_device(select="vram>=40G", ttl="20m")
    def test_kernel(rc_device):
        ...  # CUDA_VISIBLE_DEVICES names the leased GPU(s), as for a job on them

The marker's keywords override the ini options ``rc_select``, ``rc_device``, ``rc_ttl``
and ``rc_timeout``. With no controller configured the test is skipped; one that does not
answer is an error, so a broken fleet never passes as "no GPU tests".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from resource_controller.client.sync import Lease

#: The marker's keywords, and the ``Client.lease`` arguments they become.
MARKER_KEYS = frozenset({"select", "device", "count", "ttl", "reason", "timeout"})
DEFAULT_TTL = "30m"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "rc_select", "rc_device fixture: label selector of the device to lease", default=""
    )
    parser.addini("rc_device", "rc_device fixture: exact device ID to lease", default="")
    parser.addini(
        "rc_ttl", f"rc_device fixture: hold TTL (default {DEFAULT_TTL})", default=DEFAULT_TTL
    )
    parser.addini(
        "rc_timeout", "rc_device fixture: give up queueing after (default: wait)", default=""
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "rc_device(select=, device=, count=, ttl=, reason=, timeout=): what the rc_device"
        " fixture leases for this test",
    )


def lease_arguments(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ini options overlaid with the nearest ``rc_device`` marker's keywords."""
    ini = request.config.getini
    args: dict[str, Any] = {
        "select": ini("rc_select"),
        "device": ini("rc_device"),
        "ttl": ini("rc_ttl") or DEFAULT_TTL,
        "timeout": ini("rc_timeout") or None,
        "reason": f"pytest {request.node.nodeid}",
    }
    marker = request.node.get_closest_marker("rc_device")
    if marker is not None:
        if marker.args:
            raise pytest.UsageError("rc_device takes keywords only, e.g. rc_device(select='gpu')")
        unknown = set(marker.kwargs) - MARKER_KEYS
        if unknown:
            raise pytest.UsageError(
                f"rc_device marker: unknown keyword(s) {sorted(unknown)};"
                f" valid: {sorted(MARKER_KEYS)}"
            )
        args.update(marker.kwargs)
        if "device" in marker.kwargs and "select" not in marker.kwargs:
            args["select"] = ""
        if "select" in marker.kwargs and "device" not in marker.kwargs:
            args["device"] = ""
    return args


def controller_configured() -> bool:
    """Whether ``RC_CONTROLLER`` or the user config file names a controller."""
    from resource_controller.client import config

    return config.settings().controller_origin() != config.DEFAULT_ORIGIN


@pytest.fixture
def rc_device(request: pytest.FixtureRequest) -> Iterator[Lease]:
    """A device leased for this test: ``device_id``, ``device_ids``, ``cuda_visible_devices``,
    ``epoch``, ``env``, with ``CUDA_VISIBLE_DEVICES`` exported; released when the test ends."""
    if not controller_configured():
        pytest.skip("rc_device: no controller configured (set RC_CONTROLLER, or run rc up)")
    from resource_controller.client.sync import Client

    args = lease_arguments(request)
    with Client() as client, client.lease(**args) as lease, pytest.MonkeyPatch.context() as env:
        if lease.cuda_visible_devices is not None:
            env.setenv("CUDA_VISIBLE_DEVICES", lease.cuda_visible_devices)
        yield lease
