"""``rc cp``'s own rules, without processes: argument parsing, far-side paths, and the
extraction of an untrusted archive (CLI-161, CLI-164, CLI-166..168)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from resource_controller.cli import common, cp


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("dgx:gpu0:/workspace/x.py", cp.Remote("dgx:gpu0", "/workspace/x.py")),
        ("dgx:gpu0:rel/x", cp.Remote("dgx:gpu0", "rel/x")),
        ("./a:b", None),
        ("C:\\tmp", None),
        ("plain.txt", None),
        ("a:b:c:/x", None),
        (":gpu0:/x", None),
    ],
)
def test_each_argument_is_local_or_a_device_path(arg: str, expected: cp.Remote | None) -> None:
    assert cp.parse_side(arg) == expected  # CLI-161


def test_a_device_without_a_path_and_a_host_less_path_are_refused() -> None:
    with pytest.raises(common.Failure, match="no path"):
        cp.parse_side("dgx:gpu0:")
    with pytest.raises(common.Failure, match="host:name:path") as e:
        cp.parse_side("gpu0:/work/x")
    assert "dgx:gpu0:/work/x" in str(e.value)  # the example itself parses as remote


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("/tmp/b.py", ("/tmp", "b.py")),  # renames
        ("/workspace", ("/", "workspace")),  # a FILE called /workspace; root rule
        ("/workspace/", ("/workspace", "a.py")),
        ("/", ("/", "a.py")),
        ("b.py", (".", "b.py")),
    ],
)
def test_upload_targets(remote: str, expected: tuple[str, str]) -> None:
    assert cp.upload_target("./a.py", remote) == expected  # CLI-164, CLI-201


def test_download_sources() -> None:
    assert cp.download_source("/tmp/a.py") == ("/tmp", "a.py")  # CLI-167
    assert cp.download_source("/tmp/dir/") == ("/tmp", "dir")
    assert cp.download_source("/etc") == ("/", "etc")  # root rule
    assert cp.download_source("x") == (".", "x")
    with pytest.raises(common.Failure, match="names no file"):
        cp.download_source("/")


def _archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _file(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    ("member", "data", "what"),
    [
        (_file("/etc/evil"), b"x", "absolute"),
        (_file("../evil"), b"x", "escapes"),
        (_file("out/../../evil"), b"x", "escapes"),
        (_link("out/link", "../../evil"), None, "outside"),
        (_link("out/link", "/etc/passwd"), None, "outside"),
    ],
)
def test_extraction_refuses_entries_that_leave_the_destination(
    tmp_path: Path, member: tarfile.TarInfo, data: bytes | None, what: str
) -> None:
    # CLI-168: the archive is untrusted; the entry is named; nothing lands outside.
    dest = tmp_path / "dest"
    with pytest.raises(cp.UnsafeEntry, match=what) as e:
        cp.extract(_archive((_file("out/ok"), b"fine"), (member, data)), str(dest), None)
    assert member.name in str(e.value)
    assert (dest / "out" / "ok").read_bytes() == b"fine"  # entries before the abort stay
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


def test_a_symlinked_directory_cannot_carry_a_file_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "sneaky")  # already there, pointing out
    with pytest.raises(cp.UnsafeEntry, match="symlink"):
        cp.extract(_archive((_file("sneaky/evil"), b"x")), str(dest), None)
    assert list(outside.iterdir()) == []


def test_extraction_applies_modes_despite_the_umask_and_skips_special_entries(
    tmp_path: Path,
) -> None:
    fifo = tarfile.TarInfo("t/fifo")
    fifo.type = tarfile.FIFOTYPE
    old = os.umask(0o077)
    try:
        cp.extract(
            _archive(
                (_file("t/run.sh", 0o4755), b"#!/bin/sh\n"),
                (_link("t/hard", "t/run.sh", tarfile.LNKTYPE), None),
                (fifo, None),
                (_link("t/link", "run.sh"), None),
            ),
            str(tmp_path),
            "renamed",
        )
    finally:
        os.umask(old)
    script = tmp_path / "renamed" / "run.sh"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755  # 0777 bits only, exec bit kept
    assert os.readlink(tmp_path / "renamed" / "link") == "run.sh"
    assert sorted(p.name for p in (tmp_path / "renamed").iterdir()) == ["link", "run.sh"]


def test_an_upload_archive_keeps_modes_links_and_zeroes_owners(tmp_path: Path) -> None:
    # CLI-166: lexical order, directories first, links as links, uid/gid 0.
    src = tmp_path / "tree"
    (src / "b").mkdir(parents=True)
    (src / "a.sh").write_text("echo\n")
    (src / "a.sh").chmod(0o755)
    (src / "b" / "c").write_bytes(bytes(range(256)))
    os.symlink("/etc/shadow", src / "secret")
    buf = io.BytesIO()
    cp.write_archive(buf, str(src), "dst")
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["dst", "dst/a.sh", "dst/b", "dst/b/c", "dst/secret"]
        by = {m.name: m for m in members}
        assert by["dst/a.sh"].mode == 0o755
        assert by["dst/secret"].issym() and by["dst/secret"].linkname == "/etc/shadow"
        assert all(m.uid == 0 and m.gid == 0 and not m.uname for m in members)
        data = tar.extractfile(by["dst/b/c"])
        assert data is not None and data.read() == bytes(range(256))
