"""Usage sheets (§19): which files, missing versus unreadable, the 64 KiB cap."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from resource_controller.worker import sheets


def test_files_and_missing_ones(tmp_path: Path) -> None:  # SHEET-001, SHEET-002
    (tmp_path / "host.md").write_text("# box\nScratch is /scratch.\n")
    (tmp_path / "host.d").mkdir()
    (tmp_path / "host.d" / "gpu1.md").write_text("fan is loud\n")
    got = sheets.read_sheets(str(tmp_path), ["gpu0", "gpu1"])
    assert got.sheet == "# box\nScratch is /scratch.\n"
    assert got.device_sheets == {"gpu0": "", "gpu1": "fan is loud\n"}


def test_no_sheet_dir_reads_as_empty_sheets(tmp_path: Path) -> None:  # SHEET-002
    got = sheets.read_sheets(str(tmp_path / "absent"), ["gpu0"])
    assert got.sheet == "" and got.device_sheets == {"gpu0": ""}


def test_unreadable_sheets_are_unknown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # SHEET-002..004
    (tmp_path / "host.md").mkdir()  # a directory in the way
    (tmp_path / "host.d").write_text("a file, not a directory")
    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.sheets"):
        got = sheets.read_sheets(str(tmp_path), ["gpu0"])
    assert got.sheet is None and got.device_sheets is None
    assert len(caplog.records) == 2


def test_one_unreadable_device_sheet_leaves_only_that_one_out(tmp_path: Path) -> None:
    (tmp_path / "host.d").mkdir()
    (tmp_path / "host.d" / "gpu0.md").mkdir()
    (tmp_path / "host.d" / "gpu1.md").write_text("ok")
    got = sheets.read_sheets(str(tmp_path), ["gpu0", "gpu1"])
    assert got.device_sheets == {"gpu1": "ok"}  # SHEET-004


def test_a_sheet_at_the_cap_is_sent_whole() -> None:  # SHEET-005
    raw = b"x" * sheets.SHEET_CAP
    assert sheets.cap(raw) == raw.decode()


def test_a_longer_sheet_is_cut_with_the_marker(caplog: pytest.LogCaptureFixture) -> None:
    raw = b"y" * (sheets.SHEET_CAP + 1)
    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.sheets"):
        text = sheets.cap(raw, "/etc/rc/host.md")
    assert len(sheets.TRUNCATION_MARKER.encode()) == 36
    assert text == "y" * 65_500 + sheets.TRUNCATION_MARKER
    assert len(text.encode()) == sheets.SHEET_CAP
    (record,) = caplog.records
    assert "/etc/rc/host.md" in record.getMessage() and "65537" in record.getMessage()


def test_the_cut_never_splits_a_character() -> None:  # SHEET-005
    raw = ("é" * 40_000).encode()  # two bytes each; byte 65,500 is a character start
    text = sheets.cap(b"a" + raw)  # now byte 65,500 is the middle of one
    body = text[: -len(sheets.TRUNCATION_MARKER)]
    assert body == "a" + "é" * 32_749
    assert len(text.encode()) <= sheets.SHEET_CAP


def test_invalid_utf8_is_replaced_and_still_within_the_cap() -> None:  # SHEET-005
    assert sheets.cap(b"ok \xff\xfe end") == "ok \ufffd\ufffd end"
    text = sheets.cap(b"\xff" * sheets.SHEET_CAP)  # each byte grows to three
    assert len(text.encode()) <= sheets.SHEET_CAP
    assert text.endswith(sheets.TRUNCATION_MARKER)
