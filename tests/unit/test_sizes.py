"""Byte-size text (``--max-log-bytes``)."""

from __future__ import annotations

import pytest

from resource_controller.core.sizes import SizeError, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("1048576", 1 << 20),
        ("64KiB", 64 << 10),
        ("64k", 64 << 10),
        ("256MiB", 256 << 20),
        ("256M", 256 << 20),
        ("2GiB", 2 << 30),
        ("1 TiB", 1 << 40),
        ("512B", 512),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "KiB", "1.5MiB", "-1", "10KB", "3 parsecs", "1e6"])
def test_refused(text: str) -> None:
    with pytest.raises(SizeError):
        parse_size(text)
