"""``nvidia-smi -L`` parsed into GPUs and MIG instances, and the probe pass over it
(EXT-MIG-1..4, PROBE-012, PROBE-024, PROBE-031, PROBE-040).

Parsing reads the recorded outputs of real A100 and H100 cards in
``tests/data/nvidia_smi``; the pass runs with a probe runner that serves the same
recordings in-process (``support.nvsmi.answer``), so nothing here starts a process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worker_helpers import run

from resource_controller.clock import FakeClock
from resource_controller.core import mig, selectors
from resource_controller.worker import gpus, labelsources, probes
from resource_controller.worker.probes import Run
from resource_controller.worker.timings import Timings
from support import nvsmi

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
#: The MIG UUIDs of GPU 0 in a100-40gb-mig, and after its instances were created again.
A100_MIG = [
    "MIG-414beea8-db80-5873-9762-84efefa8037b",
    "MIG-bbec0088-2811-5a60-ba7e-49f58185fa67",
    "MIG-f132dadf-589b-5ff1-87ab-0aae566c816d",
]
A100_MIG_AGAIN = [
    "MIG-29fcc9e3-61a4-5118-b42f-f72e65e46f2c",
    "MIG-ea0e6a6e-5fb5-588e-a7d8-baa2ca9674c4",
    "MIG-d7b207fa-9d1f-5cca-80af-9c9dc9c583dc",
]


def listing(scenario: str) -> tuple[gpus.Inventory, list[str]]:
    return gpus.parse_list(nvsmi.recorded(scenario, "list.txt"))


# ---- the recordings and the fake (EXT-MIG-4) --------------------------------------


@pytest.mark.parametrize("scenario", nvsmi.scenarios())
def test_every_recording_names_its_format_and_is_served_without_it(scenario: str) -> None:
    for path in (nvsmi.DATA / scenario).iterdir():
        head = path.read_text().splitlines()[0]
        assert head.startswith("# "), path  # a header saying what it records
        assert "Lines starting with `#`" in path.read_text(), path
    out, _, _ = nvsmi.answer(scenario, ["-L"])
    assert not out.startswith("#")


def test_the_fake_selects_gpus_by_index_or_uuid() -> None:
    sample = ("--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits")
    assert nvsmi.answer("a100-40gb", sample) == ("87, 31544\n0, 0\n", "", 0)
    assert nvsmi.answer("a100-40gb", [*sample, "-i", "1"]) == ("0, 0\n", "", 0)
    gpu0 = "GPU-145f656c-76cc-1d7a-ed52-c2b21bbbb90b"
    assert nvsmi.answer("a100-40gb-mig", [*sample, "-i", gpu0]) == ("[N/A], 13529\n", "", 0)
    assert nvsmi.answer("a100-40gb-mig", [*sample, f"--id={gpu0},1"])[0].count("\n") == 2
    # -i names GPUs: a MIG UUID or an index past the last GPU finds none.
    assert nvsmi.answer("a100-40gb-mig", [*sample, "-i", A100_MIG[0]]) == (
        "No devices were found\n",
        "",
        6,
    )
    assert nvsmi.answer("a100-40gb", [*sample, "-i", "2"])[2] == 6
    # Another format, or a command nobody recorded, is a usage error.
    assert nvsmi.answer("a100-40gb", ["--query-gpu=name", "--format=csv"])[2] == 2
    assert nvsmi.answer("a100-40gb", ["-q"])[2] == 2
    # A driver that is down answers everything alike.
    out, _, code = nvsmi.answer("no-driver", ["-L"])
    assert code == 9 and "couldn't communicate with the NVIDIA driver" in out


def test_the_fake_script_runs_on_path(tmp_path: Path) -> None:
    import subprocess

    fake = nvsmi.FakeNvidiaSmi(tmp_path, "h100-80gb-mig")
    env = fake.env()
    done = subprocess.run(["nvidia-smi", "-L"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.startswith(f"GPU 0: {H100} (UUID: GPU-")
    fake.use("h100-80gb")
    again = subprocess.run(
        ["nvidia-smi", "-L"], env=env, capture_output=True, text=True, timeout=30
    )
    assert "MIG" not in again.stdout
    assert fake.calls() == ["-L", "-L"]


# ---- parsing nvidia-smi -L (EXT-MIG-1) ---------------------------------------------


def test_a100_with_one_gpu_in_mig_mode() -> None:
    listed, warnings = listing("a100-40gb-mig")
    assert warnings == []
    assert listed.device_names() == ["gpu0.mig0", "gpu0.mig1", "gpu0.mig2", "gpu1"]
    gpu0, gpu1 = listed.gpus
    assert gpu0.mig_mode and not gpu1.mig_mode
    assert gpu0.model == A100 and gpu0.uuid == "GPU-145f656c-76cc-1d7a-ed52-c2b21bbbb90b"
    assert [(m.index, m.profile, m.uuid) for m in gpu0.migs] == [
        (0, "3g.20gb", A100_MIG[0]),
        (1, "2g.10gb", A100_MIG[1]),
        (2, "1g.5gb", A100_MIG[2]),
    ]
    assert listed.mig_uuids() == dict(
        zip(["gpu0.mig0", "gpu0.mig1", "gpu0.mig2"], A100_MIG, strict=True)
    )


def test_h100_both_gpus_in_mig_mode() -> None:
    listed, warnings = listing("h100-80gb-mig")
    assert warnings == []
    assert listed.device_names() == [
        "gpu0.mig0",
        "gpu0.mig1",
        "gpu1.mig0",
        "gpu1.mig1",
        "gpu1.mig2",
    ]
    assert [m.profile for g in listed.gpus for m in g.migs] == [
        "3g.40gb",
        "3g.40gb",
        "4g.40gb",
        "2g.20gb",
        "1g.10gb",
    ]


@pytest.mark.parametrize("scenario", ["a100-40gb", "h100-80gb", "a100-40gb-gpu1-gone"])
def test_gpus_without_mig_stay_whole(scenario: str) -> None:
    listed, warnings = listing(scenario)
    assert warnings == []
    assert listed.device_names() == [f"gpu{i}" for i in range(len(listed.gpus))]
    assert listed.mig_uuids() == {}


def test_the_r450_form_of_mig_uuids() -> None:
    # Before MIG devices had UUIDs of their own: MIG-GPU-<gpu uuid>/<gi>/<ci>, which
    # is what CUDA_VISIBLE_DEVICES took under that driver.
    listed, warnings = listing("a100-40gb-mig-r450")
    assert warnings == []
    assert listed.device_names() == ["gpu0.mig0", "gpu0.mig1", "gpu1"]
    assert listed.mig_uuids() == {
        "gpu0.mig0": "MIG-GPU-145f656c-76cc-1d7a-ed52-c2b21bbbb90b/1/0",
        "gpu0.mig1": "MIG-GPU-145f656c-76cc-1d7a-ed52-c2b21bbbb90b/2/0",
    }
    assert listed.gpus[0].model == "A100-SXM4-40GB"


def test_damaged_lines_are_warnings_never_errors() -> None:
    listed, warnings = listing("malformed")
    gpu0, gpu1, gpu2 = listed.gpus
    # GPU 0: one MIG line readable, one cut short: still in MIG mode, instance 1 unknown.
    assert gpu0.mig_mode and [m.index for m in gpu0.migs] == [0] and gpu0.unreadable == 1
    assert listed.unknown("gpu0.mig1") and not listed.unknown("gpu0.mig0")
    assert listed.conflict("gpu0.mig1") == ""  # not judged: it may be the damaged line
    assert listed.conflict("gpu0").startswith("GPU 0 is in MIG mode")
    # GPU 1: its line lost its UUID; it is GPU 1 all the same.
    assert (gpu1.index, gpu1.model, gpu1.uuid) == (1, A100, "")
    assert gpu2.uuid.startswith("GPU-")
    assert listed.device_names() == ["gpu0.mig0", "gpu1", "gpu2"]
    assert len(warnings) == 2 and any("GPU 1" in w for w in warnings)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "No devices were found\n",
        "  MIG 1g.5gb      Device  0: (UUID: MIG-x)\n",  # under no GPU
        "GPU x: what\n",
        "GPU 0: A (UUID: GPU-1)\nGPU 0: B (UUID: GPU-2)\n",
        "GPU 0: A (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-a)\n"
        "  MIG 1g.5gb Device 0: (UUID: MIG-b)\n",
    ],
)
def test_odd_listings(text: str) -> None:
    listed, _ = gpus.parse_list(text)
    for name in listed.device_names():
        assert mig.parse(name) is not None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["a100-40gb-mig", "h100-80gb-mig", "a100-40gb-mig-r450"]), st.data())
def test_any_cut_of_a_real_listing_parses(scenario: str, data: st.DataObject) -> None:
    # Output cut at any byte (a killed nvidia-smi, a full pipe): never an exception,
    # and whatever it names is a device name the rest of the system reads.
    text = nvsmi.recorded(scenario, "list.txt")
    cut = data.draw(st.integers(0, len(text)))
    listed, _ = gpus.parse_list(text[:cut])
    for name in listed.device_names():
        assert mig.parse(name) is not None
        found = listed.instance(name)
        assert found is None or found.uuid.startswith("MIG-")


@given(st.text())
def test_arbitrary_text_parses(text: str) -> None:
    gpus.parse_list(text)


@pytest.mark.parametrize(
    ("profile", "vram"),
    [
        ("3g.40gb", "40G"),
        ("1g.5gb", "5G"),
        ("1c.3g.20gb", "20G"),
        ("1g.10gb+me", "10G"),
        ("7g.80gb", "80G"),
        ("weird", None),
    ],
)
def test_instance_memory_from_its_profile(profile: str, vram: str | None) -> None:
    assert gpus.instance_vram(profile) == vram


def test_a_3g_40gb_instance_matches_what_its_profile_says() -> None:  # SEL-006
    labels = {"vram": gpus.instance_vram("3g.40gb") or ""}
    assert selectors.parse("vram>=40G").matches(labels)
    assert not selectors.parse("vram>=41G").matches(labels)


# ---- conflicts (EXT-MIG-3) ---------------------------------------------------------


def test_names_that_do_not_fit_the_cards_mode() -> None:
    listed, _ = listing("a100-40gb-mig")
    assert listed.conflict("gpu0") == (
        "GPU 0 is in MIG mode: its MIG devices are gpu0.mig0, gpu0.mig1, gpu0.mig2, "
        "not the whole GPU"
    )
    assert listed.conflict("gpu1.mig0") == (
        "GPU 1 is not in MIG mode: it is offered whole, as gpu1"
    )
    assert listed.conflict("gpu0.mig5") == (
        "GPU 0 has no MIG device 5 (its MIG devices are gpu0.mig0, gpu0.mig1, gpu0.mig2)"
    )
    assert listed.conflict("gpu3.mig0") == "nvidia-smi lists no GPU 3"
    for fine in ("gpu0.mig1", "gpu1", "gpu3", "slot0", "gpu0x"):
        assert listed.conflict(fine) == "", fine
    assert gpus.conflicts(listed, ["gpu0", "gpu0.mig1", "gpu1"]) == {
        "gpu0": listed.conflict("gpu0")
    }
    assert listed.missing("gpu3") and not listed.missing("gpu1")
    assert not gpus.Inventory().missing("gpu0")  # an empty listing proves nothing


# ---- the pass (PROBE-001, PROBE-012, PROBE-024, PROBE-031, PROBE-040) ----------------

NVIDIA_PATH = "/fake/bin/nvidia-smi"


class Served:
    """A probe runner serving the recordings of a scenario it can switch."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.calls: list[list[str]] = []

    async def __call__(self, argv: Sequence[str], timeout: float) -> Run:
        args = list(argv[1:])
        self.calls.append(args)
        if self.scenario == "hang":
            return Run(False, problem=f"killed after {timeout:g}s")
        out, err, code = nvsmi.answer(self.scenario, args)
        problem = "" if code == 0 else f"exit status {code}"
        return Run(code == 0, out.encode(), err.encode(), problem)


@pytest.fixture(autouse=True)
def only_gpu_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "builtin_facts", lambda: {"cpus": "8"})


def prober(tmp_path: Path, served: Served, devices: Sequence[str] = ()) -> probes.Prober:
    return probes.Prober(
        devices,
        str(tmp_path / "no-probe.d"),
        5.0,
        clock=FakeClock(),
        timings=Timings(),
        run=served,
        which=lambda name: NVIDIA_PATH,
    )


def payload(p: probes.Prober, *, discover: bool = False) -> dict[str, dict[str, str]]:
    labels = run(p.run_pass(discover=discover)).labels
    assert labels is not None
    return labels


def test_each_instance_is_a_device_with_its_own_facts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # EXT-MIG-1
    names = ["gpu0.mig0", "gpu0.mig1", "gpu0.mig2", "gpu1"]
    served = Served("a100-40gb-mig")
    with caplog.at_level(logging.WARNING):
        got = payload(prober(tmp_path, served, names))
    assert served.calls == [list(nvsmi.PROBE_ARGS), list(nvsmi.LIST_ARGS)]
    assert got[""] == {"cpus": "8"}  # host facts apart, as always (PROBE-040)
    assert got["gpu0.mig0"] == {
        "vendor": "nvidia",
        "model": A100,
        "driver": "535.183.01",
        "mig_profile": "3g.20gb",
        "vram": "20G",
        "parent": "gpu0",
        "uuid": A100_MIG[0],
    }
    assert got["gpu0.mig2"]["mig_profile"] == "1g.5gb" and got["gpu0.mig2"]["vram"] == "5G"
    assert got["gpu1"]["vram"] == "40960M" and "mig_profile" not in got["gpu1"]  # PROBE-012
    # GPU 0's whole-GPU facts go nowhere, and say nothing about it (gpu0 is not offered).
    assert "gpu0" not in got and "names no configured device" not in caplog.text


def test_h100_instances_and_selectors(tmp_path: Path) -> None:  # EXT-MIG-1, SEL-006
    names = ["gpu0.mig0", "gpu0.mig1", "gpu1.mig0", "gpu1.mig1", "gpu1.mig2"]
    got = payload(prober(tmp_path, Served("h100-80gb-mig"), names))
    matched = [n for n in names if selectors.parse("vram>=40G,model~H100").matches(got[n])]
    assert matched == ["gpu0.mig0", "gpu0.mig1", "gpu1.mig0"]
    assert got["gpu1.mig2"]["mig_profile"] == "1g.10gb" and got["gpu1.mig2"]["parent"] == "gpu1"


def test_a_declared_whole_gpu_in_mig_mode_is_marked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # EXT-MIG-3
    p = prober(tmp_path, Served("a100-40gb-mig"), ["gpu0", "gpu1", "gpu1.mig0"])
    with caplog.at_level(logging.WARNING):
        got = payload(p)
    assert got["gpu0"]["model"] == A100  # its facts still hold
    assert got["gpu0"][mig.CONFLICT].startswith("GPU 0 is in MIG mode")
    assert got["gpu1.mig0"] == {
        mig.CONFLICT: "GPU 1 is not in MIG mode: it is offered whole, as gpu1",
    }
    assert mig.CONFLICT not in got["gpu1"]
    assert "device gpu0: MIG conflict: GPU 0 is in MIG mode" in caplog.text
    assert set(p.conflicts) == {"gpu0", "gpu1.mig0"}
    # Said once: the next pass finds the same conflicts and says nothing new.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        payload(p)
    assert "MIG conflict" not in caplog.text


def test_the_conflict_ends_when_the_card_changes_mode(tmp_path: Path) -> None:  # EXT-MIG-3
    served = Served("a100-40gb-mig")
    p = prober(tmp_path, served, ["gpu0", "gpu1"])
    assert mig.CONFLICT in payload(p)["gpu0"]
    served.scenario = "a100-40gb"
    assert mig.CONFLICT not in payload(p)["gpu0"]
    assert p.conflicts == {}


def test_discovery_takes_what_nvidia_smi_lists(tmp_path: Path) -> None:  # EXT-MIG-1 auto
    served = Served("h100-80gb-mig")
    p = prober(tmp_path, served)
    got = payload(p, discover=True)
    assert p.device_names == ["gpu0.mig0", "gpu0.mig1", "gpu1.mig0", "gpu1.mig1", "gpu1.mig2"]
    assert set(got) - {""} == set(p.device_names)
    # Without discover a pass keeps the registered devices, whatever is listed now.
    served.scenario = "h100-80gb"
    got = payload(p)
    assert p.device_names[0] == "gpu0.mig0"
    assert got["gpu0.mig0"][mig.CONFLICT].startswith("GPU 0 is not in MIG mode")
    assert p.inventory is not None and p.inventory.device_names() == ["gpu0", "gpu1"]
    # Discovering again follows the card.
    payload(p, discover=True)
    assert p.device_names == ["gpu0", "gpu1"]


@pytest.mark.parametrize("broken", ["no-driver", "hang", "a100-40gb-gpu1-lost"])
def test_discovery_without_an_answer_keeps_the_devices(tmp_path: Path, broken: str) -> None:
    served = Served("a100-40gb-mig")
    p = prober(tmp_path, served)
    payload(p, discover=True)
    before = list(p.device_names)
    served.scenario = broken
    got = run(p.run_pass(discover=True)).labels
    assert p.device_names == before
    # PROBE-032: what nvidia-smi reported last is kept by leaving the devices out.
    assert got is None or not (set(got) - {""})


def test_a_recreated_instance_gets_its_new_uuid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # EXT-MIG bad input: a MIG UUID that changes between probes
    served = Served("a100-40gb-mig")
    p = prober(tmp_path, served, ["gpu0.mig0", "gpu0.mig1"])
    assert payload(p)["gpu0.mig1"]["uuid"] == A100_MIG[1]
    served.scenario = "a100-40gb-mig-recreated"
    with caplog.at_level(logging.WARNING):
        got = payload(p)
    assert got["gpu0.mig1"]["uuid"] == A100_MIG_AGAIN[1]
    assert p.mig_uuids()["gpu0.mig1"] == A100_MIG_AGAIN[1]
    assert f"device gpu0.mig1: MIG device created again: UUID {A100_MIG[1]}" in caplog.text


def test_relist_outside_a_pass(tmp_path: Path) -> None:  # EXT-MIG-2
    served = Served("a100-40gb-mig")
    p = prober(tmp_path, served, ["gpu0.mig0"])
    listed = run(p.relist())
    assert listed is not None and p.inventory is listed
    assert served.calls == [["-L"]]
    served.scenario = "no-driver"
    assert run(p.relist()) is None and p.inventory is listed  # the latest one stays


def test_damaged_output_keeps_what_it_cannot_read(tmp_path: Path) -> None:
    # EXT-MIG bad input: cut lines, [N/A], [Not Supported]: no crash, no lost facts.
    served = Served("a100-40gb-mig")
    names = ["gpu0.mig0", "gpu0.mig1", "gpu1", "gpu2"]
    p = prober(tmp_path, served, names)
    first = payload(p)
    assert first["gpu0.mig1"]["uuid"] == A100_MIG[1]
    served.scenario = "malformed"
    got = payload(p)
    assert "gpu0.mig1" not in got  # unreadable this time: the controller keeps its labels
    assert got["gpu0.mig0"]["uuid"].startswith("MIG-")
    assert got["gpu1"]["vram"] == "[Not Supported]M"  # passes through (PROBE-012)
    assert got["gpu2"] == {}  # its query line was cut: no GPU facts this pass


def test_a_gpu_that_disappears(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    served = Served("a100-40gb")
    p = prober(tmp_path, served, ["gpu0", "gpu1"])
    assert payload(p)["gpu1"]["model"] == A100
    served.scenario = "a100-40gb-gpu1-gone"
    with caplog.at_level(logging.WARNING):
        got = payload(p)
    assert got["gpu1"] == {}  # its facts clear (PROBE-040)
    assert "device gpu1: nvidia-smi no longer lists this GPU" in caplog.text
    # Fallen off the bus: nvidia-smi fails, so what it last reported is not dropped:
    # gpu0 is left out (kept as stored, PROBE-032); gpu1 had nothing left to keep.
    served.scenario = "a100-40gb-gpu1-lost"
    got = payload(p)
    assert "gpu0" not in got and got["gpu1"] == {}


def test_a_failing_listing_leaves_the_mig_layout_as_it_was_and_reports_the_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # EXT-MIG-1, EXT-MIG-3, PROBE-012, PROBE-032: the fake nvidia-smi on PATH
    fake = nvsmi.FakeNvidiaSmi(tmp_path, "a100-40gb-mig")
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    names = ["gpu0", "gpu0.mig0", "gpu0.mig1", "gpu1"]

    def real(devices: Sequence[str]) -> probes.Prober:
        return probes.Prober(devices, str(tmp_path / "no-probe.d"), 5.0, timings=Timings())

    p, auto = real(names), real([])
    first, listed = payload(p), payload(auto, discover=True)
    assert first["gpu1"]["vram_free"] == "40327M"
    assert first["gpu0"][mig.CONFLICT].startswith("GPU 0 is in MIG mode")
    fake.use("a100-40gb-mig-list-fails")
    got = payload(p)
    assert fake.calls()[-1] == "-L"
    assert got["gpu1"] == {**first["gpu1"], "vram_free": "20113M"}  # what the query found
    # The layout is unknown, not absent: the MIG facts and the conflict stand as they were.
    for name in ("gpu0", "gpu0.mig0", "gpu0.mig1"):
        assert got[name] == first[name]
    assert p.device_names == names
    # devices: auto keeps the devices the last listing named; no whole GPU is made up.
    again = payload(auto, discover=True)
    assert auto.device_names == ["gpu0.mig0", "gpu0.mig1", "gpu0.mig2", "gpu1"]
    assert again == {**listed, "gpu1": got["gpu1"]}
    # Never listed in this process: what the controller stored stands for every GPU.
    assert set(payload(real(names))) == {""}


def test_dotted_device_names_take_their_own_keys() -> None:  # PROBE-024 with MIG names
    names = ["gpu0", "gpu0.mig1"]
    sorted_facts = labelsources.classify(
        {"gpu0.mig1.uuid": "MIG-a", "gpu0.model": "A", "gpu0.mig1": "x", "gpu0.mig2.k": "v"},
        names,
    )
    assert sorted_facts.devices == {
        "gpu0.mig1": {"uuid": "MIG-a"},
        "gpu0": {"model": "A", "mig1": "x", "mig2.k": "v"},
    }
