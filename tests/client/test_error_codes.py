"""One exception type per wire error code (API-090, EXT-EPOCH-3; EXT-PYAPI-1).

The list below is the catalogue of controller-api.md §8 plus ``stale_lease``; when the
spec sits beside the checkout (``../shared/spec``) the test also reads the table from it,
so a code added there and not here fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resource_controller import errors
from resource_controller.client import transport

#: controller-api.md §8 (API-090), in its order, and EXT-EPOCH-3's ``stale_lease``.
CATALOGUE = {
    "unauthorized": 401,
    "forbidden": 403,
    "bad_request": 400,
    "priority_out_of_range": 400,
    "bad_selector": 400,
    "runtime_above_ceiling": 400,
    "unknown_device": 400,
    "no_matching_device": 400,
    "logs_not_stored": 400,
    "not_job_owner": 403,
    "not_found": 404,
    "device_not_found": 404,
    "no_device_available": 409,
    "not_cancellable": 409,
    "device_not_cleared": 409,
    "device_busy": 409,
    "conflict": 409,
    "sheet_too_large": 413,
    "body_too_large": 413,
    "chunk_too_large": 413,
    "store_error": 500,
    "log_error": 500,
    "unsupported": 500,
    "stale_lease": 409,
}

SPEC = Path(__file__).resolve().parents[2].parent / "shared" / "spec" / "controller-api.md"


def spec_catalogue(text: str) -> dict[str, int]:
    """The ``| `code` | status | where |`` rows of §8."""
    section = text.split("## 8. Error code catalogue", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", section, flags=re.M)
    return {code: int(status) for code, status in rows}


def test_the_list_matches_the_spec_table() -> None:
    if not SPEC.exists():
        pytest.skip(f"the spec is not beside the checkout ({SPEC})")
    found = spec_catalogue(SPEC.read_text())
    assert len(found) > 20
    assert "stale_lease" in SPEC.with_name("extensions.md").read_text()
    assert {**found, "stale_lease": 409} == CATALOGUE


@pytest.mark.parametrize(("code", "status"), sorted(CATALOGUE.items()))
def test_every_code_has_its_own_class(code: str, status: int) -> None:
    cls = errors.API_CODES[code]
    assert issubclass(cls, errors.RcError)
    assert cls.code == code and cls.status == status
    body = f'{{"error": "{code}", "message": "why"}}'.encode()
    raised = transport.Bases("http://ctl").refusal(status, "", body, "t")
    assert isinstance(raised, cls) and isinstance(raised, errors.ApiError)
    assert (raised.code, raised.status, raised.message) == (code, status, "why")
    assert str(raised) == f"{code}: why"  # CLI-042's rendering is unchanged


def test_codes_map_to_distinct_classes() -> None:
    assert len(set(errors.API_CODES.values())) == len(errors.API_CODES) == len(CATALOGUE)


def test_an_unknown_code_is_a_plain_api_error() -> None:
    body = b'{"error": "teapot", "message": "short"}'
    raised = transport.Bases("http://ctl").refusal(418, "", body, "t")
    assert type(raised) is errors.ApiError and raised.code == "teapot"


def test_the_client_side_409s_are_their_codes_too() -> None:  # CLI-075
    assert isinstance(errors.NoDeviceError("busy"), errors.NoDeviceAvailable)
    assert isinstance(errors.NotCancellableError("done"), errors.NotCancellable)
    assert errors.NoDeviceError().code == "no_device_available"


def test_server_side_codes_are_unchanged() -> None:
    assert errors.DeviceNotFound("x").code == "not_found"
    assert errors.DeviceNotFound("x", code="device_not_found").code == "device_not_found"
    assert errors.TooLarge("x").code == "body_too_large"
    assert errors.TooLarge("x", code="chunk_too_large").code == "chunk_too_large"
    assert errors.NotThisHost().code == "forbidden"
