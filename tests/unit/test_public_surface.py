"""The package's public surface: ``Client``, the error types and the version (EXT-PYAPI-1)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import resource_controller
from resource_controller import errors


def test_client_and_errors_import_from_the_package() -> None:
    from resource_controller import ApiError, AsyncClient, Client, RcError
    from resource_controller.client.aio import AsyncClient as DirectAsync
    from resource_controller.client.sync import Client as Direct

    assert Client is Direct and AsyncClient is DirectAsync
    assert RcError is errors.RcError
    assert issubclass(ApiError, RcError)


def test_version_comes_from_the_installed_metadata() -> None:
    assert resource_controller.__version__ == metadata.version("resource-controller")


def test_unknown_attributes_are_refused() -> None:
    try:
        resource_controller.Nope  # noqa: B018
    except AttributeError as e:
        assert "Nope" in str(e)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")


def test_every_public_name_resolves() -> None:
    for name in resource_controller.__all__:
        assert getattr(resource_controller, name) is not None, name


def test_importing_the_package_does_not_load_the_client() -> None:
    # ``rc`` imports the package on every start; the client's transport must stay lazy.
    code = "import sys, resource_controller; print('resource_controller.client.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_command_line_does_not_load_the_typed_layer() -> None:
    # ``rc run``'s start-up path: the click group and the run command, never the typed
    # Python API, httpx or pydantic (EXT-PYAPI-1 must not slow rc down).
    code = (
        "import sys\n"
        "from resource_controller.cli import main, jobs, run, hold\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('httpx', 'pydantic')\n"
        "       or m.startswith(('resource_controller.client.sync', 'resource_controller.client.aio',\n"
        "                        'resource_controller.client.models'))]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_package_is_marked_typed() -> None:
    assert (Path(resource_controller.__file__).parent / "py.typed").is_file()
