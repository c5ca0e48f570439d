"""The route table's lookup (``controller/table.py``): every template finds its own route
and parameter, a parameter is one non-empty segment (API-007), and a path served under
other methods names them for the 405 (AUTH-030)."""

from __future__ import annotations

import pytest
from starlette.responses import Response

from resource_controller.controller import table
from resource_controller.controller.deps import Route, RouteCall
from resource_controller.core.states import Role

TABLE = table.Table(table.ROUTES)


@pytest.mark.parametrize("route", table.ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_every_template_finds_its_route_and_parameter(route: Route) -> None:
    # A device ID holds a colon (API-007: decoded before matching).
    path = route.path.replace("{job_id}", "j1").replace("{worker_id}", "w1")
    path = path.replace("{device_id}", "gpubox:gpu0")
    found = TABLE.find(route.method, path)
    assert found.route is route
    assert found.param == ("" if "{" not in route.path else path.split("/")[3])


@pytest.mark.parametrize(
    "path", ["/v1/jobs/", "/v1/jobs//status", "/v1/jobs/a/b/c", "//v1/jobs", "/v1", "/nope"]
)
def test_a_parameter_is_one_non_empty_segment(path: str) -> None:
    assert TABLE.find("GET", path) == table.Found(None, "", [])
    assert TABLE.find("POST", path) == table.Found(None, "", [])


def test_other_methods_of_a_path_are_named_for_the_405() -> None:
    found = TABLE.find("DELETE", "/v1/jobs")
    assert found.route is None and sorted(r.method for r in found.others) == ["GET", "POST"]
    found = TABLE.find("HEAD", "/v1/jobs/j1/tty/out")  # AUTH-032 leaves HEAD unserved
    assert found.route is None and sorted(r.method for r in found.others) == ["GET", "POST"]


def test_a_path_without_a_parameter_comes_first_and_two_parameters_are_refused() -> None:
    async def handler(_: RouteCall) -> Response:
        raise AssertionError("not called")

    static = Route("GET", "/v1/things/all", Role.CLIENT, handler)
    param = Route("GET", "/v1/things/{thing_id}", Role.CLIENT, handler)
    for routes in ((static, param), (param, static)):
        assert table.Table(routes).find("GET", "/v1/things/all").route is static
        assert table.Table(routes).find("GET", "/v1/things/x") == table.Found(param, "x", [])
    two = Route("GET", "/v1/{a}/{b}", Role.CLIENT, handler)
    with pytest.raises(ValueError, match="one path parameter"):
        table.Table([two])
