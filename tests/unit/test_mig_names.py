"""MIG instance names and the silicon they share (EXT-MIG-1..3), and what they put in
``CUDA_VISIBLE_DEVICES`` (EXT-MIG-2, WRK-077, EXT-GANG-4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resource_controller.core import cuda, mig


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("gpu0", (0, None)),
        ("gpu12", (12, None)),
        ("gpu0.mig3", (0, 3)),
        ("gpu7.mig10", (7, 10)),
        ("gpu", None),
        ("gpu0.mig", None),
        ("gpu0.mig1.x", None),
        ("slot0", None),
        ("GPU0", None),
        ("gpu٣", None),  # a non-ASCII digit is no index (WRK-077)
        ("gpu" + "9" * 20, None),  # beyond a signed 64-bit integer
    ],
)
def test_names_parse(name: str, parsed: tuple[int, int | None] | None) -> None:  # EXT-MIG-1
    assert mig.parse(name) == parsed


def test_instance_names_and_their_whole_gpu() -> None:  # EXT-MIG-1, EXT-MIG-3
    assert mig.instance_name(0, 1) == "gpu0.mig1" and mig.gpu_name(3) == "gpu3"
    assert mig.is_instance("gpu0.mig1") and not mig.is_instance("gpu0")
    assert mig.part_of("gpu0.mig1", "gpu0")
    assert not mig.part_of("gpu10.mig0", "gpu1")  # another GPU
    assert not mig.part_of("gpu0", "gpu0") and not mig.overlap("gpu0", "gpu0")
    assert mig.overlap("gpu0", "gpu0.mig2") and mig.overlap("gpu0.mig2", "gpu0")
    assert not mig.overlap("gpu0.mig0", "gpu0.mig1")  # instances of one GPU coexist


def test_overlapping_pairs() -> None:  # EXT-MIG-3
    names = ["gpu0", "gpu0.mig0", "gpu0.mig1", "gpu1", "gpu1.mig0", "gpu10.mig0"]
    assert mig.overlapping(names) == [
        ("gpu0", "gpu0.mig0"),
        ("gpu0", "gpu0.mig1"),
        ("gpu1", "gpu1.mig0"),
    ]
    assert mig.overlapping(["gpu0.mig0", "gpu0.mig1", "gpu1"]) == []


def test_superseded_names() -> None:  # EXT-MIG-1 under devices: auto
    # GPU 0 went into MIG mode: gpu0 is superseded by its instances.
    assert mig.superseded(["gpu0.mig0", "gpu0.mig1", "gpu1"], ["gpu0", "gpu1"]) == {
        "gpu0": ["gpu0.mig0", "gpu0.mig1"]
    }
    # And back: the instances are superseded by the whole GPU.
    assert mig.superseded(["gpu0", "gpu1"], ["gpu0.mig0", "gpu0.mig1", "gpu1", "gpu2"]) == {
        "gpu0.mig0": ["gpu0"],
        "gpu0.mig1": ["gpu0"],
    }
    assert mig.superseded(["gpu0"], ["gpu0", "slot1"]) == {}
    text = mig.superseded_text(["gpu0.mig0", "gpu0.mig1"])
    assert "gpu0.mig0, gpu0.mig1" in text


@pytest.mark.parametrize(
    ("device_id", "index"),
    [("b:gpu1", "1"), ("b:gpu0.mig1", None), ("b:gpu12.mig0", None), ("b:slot3", "3")],
)
def test_an_instance_yields_no_index(device_id: str, index: str | None) -> None:  # EXT-MIG-2
    # gpu0.mig1's trailing 1 is its MIG device index: never GPU 1 (WRK-077's lesser harm).
    assert cuda.device_index(device_id) == index


def test_cuda_visible_devices_with_mig_uuids() -> None:  # EXT-MIG-2, EXT-GANG-4
    uuids = {"gpu0.mig0": "MIG-aaa", "gpu0.mig1": "MIG-bbb"}
    assert cuda.cuda_visible_devices(["b:gpu0.mig0"], uuids) == "MIG-aaa"
    assert cuda.cuda_visible_devices(["b:gpu0.mig0", "b:gpu0.mig1"], uuids) == "MIG-aaa,MIG-bbb"
    # A mix of whole GPUs and instances is each one's own form.
    assert cuda.cuda_visible_devices(["b:gpu1", "b:gpu0.mig1"], uuids) == "1,MIG-bbb"
    # An instance whose UUID is not known leaves the variable unset, as no index does.
    assert cuda.cuda_visible_devices(["b:gpu0.mig2"], uuids) is None
    assert cuda.cuda_visible_devices(["b:gpu0.mig0"]) is None
    assert cuda.visible_id("b:gpu0.mig0", {"gpu0.mig0": ""}) is None


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_instance_names_round_trip(gpu: int, j: int) -> None:  # EXT-MIG-1
    name = mig.instance_name(gpu, j)
    assert mig.parse(name) == (gpu, j)
    assert mig.part_of(name, mig.gpu_name(gpu))
    assert cuda.device_index("h:" + name) is None
