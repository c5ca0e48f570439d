"""The package's public surface: ``Client``, the error types and the version (EXT-PYAPI-1)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import resource_controller
from resource_controller import errors


def test_client_and_errors_import_from_the_package() -> None:
    from resource_controller import ApiError, Client, RcError
    from resource_controller.client.api import Client as Direct

    assert Client is Direct
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


def test_importing_the_package_does_not_load_the_client() -> None:
    # ``rc`` imports the package on every start; the client's transport must stay lazy.
    code = "import sys, resource_controller; print('resource_controller.client.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_package_is_marked_typed() -> None:
    assert (Path(resource_controller.__file__).parent / "py.typed").is_file()
