"""Capability probes (§16): parsing, classification, the payload, one probe process, a pass.

Parsing and the payload are pure functions. The pass runs with an injected process
runner, ``PATH`` lookup and clock, so failure attribution and preservation
(PROBE-030..034) are checked without real probes; ``run_probe`` itself runs real,
tiny scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from worker_helpers import run

from resource_controller.clock import FakeClock
from resource_controller.worker import gpus, labelsources, probes, procs
from resource_controller.worker.probes import Run
from resource_controller.worker.timings import Timings

# ---- nvidia-smi (PROBE-012, PROBE-013) -------------------------------------------

H100_A10 = "NVIDIA H100 80GB HBM3, 81559, 81000, 550.54.15\nNVIDIA A10, 23028, 22000, 550.54.15\n"


def test_nvidia_smi_lines_become_per_gpu_facts() -> None:  # PROBE-012
    facts, warnings = gpus.parse_nvidia_smi(H100_A10)
    assert warnings == []
    assert facts == {
        "gpu0.vendor": "nvidia",
        "gpu0.model": "NVIDIA H100 80GB HBM3",
        "gpu0.vram": "81559M",
        "gpu0.vram_free": "81000M",
        "gpu0.driver": "550.54.15",
        "gpu1.vendor": "nvidia",
        "gpu1.model": "NVIDIA A10",
        "gpu1.vram": "23028M",
        "gpu1.vram_free": "22000M",
        "gpu1.driver": "550.54.15",
    }
    assert not any(k.endswith(".cuda") for k in facts)  # PROBE-013


def test_nvidia_smi_fields_are_trimmed_and_na_passes_through() -> None:  # PROBE-012
    facts, _ = gpus.parse_nvidia_smi("  \n  Tesla T4 ,  [N/A] , [N/A],  535.1  \n\n")
    assert facts["gpu0.model"] == "Tesla T4"
    assert facts["gpu0.vram"] == "[N/A]M"
    assert facts["gpu0.vram_free"] == "[N/A]M"
    assert facts["gpu0.driver"] == "535.1"


def test_a_bad_or_blank_nvidia_smi_line_still_consumes_its_index() -> None:  # PROBE-012
    text = "A100, 40960, 1, 1\nonly, three, fields\n\nA10, 24576, 2, 1\n"
    facts, warnings = gpus.parse_nvidia_smi(text)
    assert facts["gpu0.model"] == "A100"
    assert not any(k.startswith(("gpu1.", "gpu2.")) for k in facts)
    assert facts["gpu3.model"] == "A10" and facts["gpu3.vram"] == "24576M"
    assert len(warnings) == 1 and "line 1" in warnings[0]


@pytest.mark.parametrize("text", ["", "   \n\n ", "garbage", "a,b,c,d,e"])
def test_nvidia_smi_garbage_or_empty_gives_no_facts(text: str) -> None:
    facts, _ = gpus.parse_nvidia_smi(text)
    assert facts == {}


def test_the_vram_suffix_is_a_quantity_the_selector_compares() -> None:  # PROBE-012, SEL-008
    from resource_controller.core import selectors

    facts, _ = gpus.parse_nvidia_smi(H100_A10)
    big = {"vram": facts["gpu0.vram"]}
    small = {"vram": facts["gpu1.vram"]}
    sel = selectors.parse("vram>=40G")
    assert sel.matches(big) and not sel.matches(small)
    assert not sel.matches({"vram": "[N/A]M"})


# ---- drop-in output (PROBE-022, PROBE-023) ---------------------------------------


def test_dropin_values_keep_their_literal_text() -> None:  # PROBE-023
    out = b' \n{"s": "x y", "f": 1.50, "e": 1e3, "i": -7, "t": true, "n": false, "z": null}\n '
    facts, warnings = probes.parse_dropin(out)
    assert facts == {"s": "x y", "f": "1.50", "e": "1e3", "i": "-7", "t": "true", "n": "false"}
    assert warnings == []


def test_dropin_nested_values_are_dropped_with_a_warning() -> None:  # PROBE-023
    facts, warnings = probes.parse_dropin(b'{"a": {"b": 1}, "l": [1], "k": "v"}')
    assert facts == {"k": "v"}
    assert len(warnings) == 2


def test_dropin_duplicate_keys_last_wins_and_top_level_null_is_empty() -> None:  # PROBE-023
    assert probes.parse_dropin(b'{"k": "1", "k": "2"}')[0] == {"k": "2"}
    assert probes.parse_dropin(b" null ") == ({}, [])


@pytest.mark.parametrize(
    "out",
    [
        b"",
        b"   \n",
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"42",
        b"true",
        b'{"a": 1} {"b": 2}',
        b'{"a": 1} trailing',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": 1',
        b"\xff\xfe{}",
        b'\xef\xbb\xbf{"a": "1"}',
    ],
)
def test_dropin_garbage_fails(out: bytes) -> None:  # PROBE-022
    with pytest.raises(probes.DropinError):
        probes.parse_dropin(out)


@given(st.dictionaries(st.text(), st.text() | st.integers() | st.booleans() | st.none()))
def test_dropin_any_flat_object_round_trips(data: dict[str, object]) -> None:  # PROBE-023
    facts, warnings = probes.parse_dropin(json.dumps(data).encode())
    assert warnings == []
    expected = {
        k: ("true" if v else "false") if isinstance(v, bool) else str(v)
        for k, v in data.items()
        if v is not None
    }
    assert facts == expected


# ---- classification (PROBE-024) ---------------------------------------------------


def test_keys_are_sorted_into_host_and_device_facts() -> None:  # PROBE-024
    got = labelsources.classify(
        {
            "cpus": "8",
            "gpu0.model": "H100",
            "gpu0.x.y": "z",
            "gpu7.model": "ghost",
            "": "empty",
            ".lead": "1",
            "trail.": "1",
        },
        ["gpu0", "gpu1"],
    )
    assert got.host == {"cpus": "8"}
    assert got.devices == {"gpu0": {"model": "H100", "x.y": "z"}}
    assert got.named == {"gpu0"}
    assert len(got.warnings) == 4  # never promoted to host facts


# ---- the payload (PROBE-040) -------------------------------------------------------


def test_payload_null_when_nothing_anywhere() -> None:  # PROBE-040
    assert labelsources.labels_payload({}, {"a": {}}, (), ["a"]) is None
    assert labelsources.labels_payload({}, {}, {"a"}, ["a"]) is None


def test_payload_names_every_device_unless_unconfirmed_and_empty() -> None:  # PROBE-040
    payload = labelsources.labels_payload(
        {"cpus": "4"}, {"a": {"model": "x"}, "b": {}, "c": {}}, {"a", "c"}, ["a", "b", "c"]
    )
    assert payload == {"": {"cpus": "4"}, "a": {"model": "x"}, "b": {}}


def test_payload_without_host_facts_has_no_empty_key() -> None:  # PROBE-040
    assert labelsources.labels_payload({}, {"a": {"k": "v"}}, (), ["a", "b"]) == {
        "a": {"k": "v"},
        "b": {},
    }


# ---- one probe process (PROBE-003, PROBE-011, PROBE-021, PROBE-022) ----------------


def one_dropin(tmp: Path, name: str, answer: Run) -> tuple[Path, FakeProbes]:
    """``probe.d`` holding the one drop-in ``name``, and fake probes answering it so."""
    d = tmp / "probe.d"
    d.mkdir()
    path = script(d, name, "true")
    fake = FakeProbes()
    fake.answers[str(path)] = answer
    return path, fake


def script(directory: Path, name: str, body: str, mode: int = 0o755) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def test_run_probe_captures_stdout_and_stderr_apart(tmp_path: Path) -> None:
    p = script(tmp_path, "ok", "echo '{\"a\": 1}'; echo note >&2")
    got = run(probes.run_probe([str(p)], 5))
    assert got.ok and got.stdout.strip() == b'{"a": 1}' and got.stderr.strip() == b"note"


def test_run_probe_failures_say_why(tmp_path: Path) -> None:  # PROBE-011, PROBE-022
    code = run(probes.run_probe([str(script(tmp_path, "x", "exit 3"))], 5))
    assert not code.ok and code.problem == "exit status 3"
    missing = run(probes.run_probe([str(tmp_path / "nope")], 5))
    assert not missing.ok and missing.problem.startswith("start: ")
    assert "no such file or directory" in missing.problem
    big = run(probes.run_probe([str(script(tmp_path, "big", "head -c 70000 /dev/zero"))], 5))
    assert not big.ok and big.problem == "stdout exceeds 65536 bytes"
    assert len(big.stdout) == probes.CAPTURE_CAP


def test_run_probe_kills_the_group_after_its_timeout(tmp_path: Path) -> None:  # PROBE-003
    pidfile = tmp_path / "child.pid"
    p = script(tmp_path, "hang", f"sleep 60 & echo $! > {pidfile}; sleep 60")
    got = run(probes.run_probe([str(p)], 0.5, grace=1.0))
    assert not got.ok and got.problem == "killed after 500ms"
    child = procs.read_stat(int(pidfile.read_text()))
    assert child is None or child.state == "Z"  # the background child went with the group


def test_a_cancelled_probe_leaves_no_transport_to_outlive_its_loop(tmp_path: Path) -> None:
    """A probe cancelled while a child that left its group holds a pipe open: the run
    gives up waiting for that pipe, and its transport is closed on the way out, not left
    to the collector after the loop has closed (which raises inside ``__del__``)."""
    pidfile = tmp_path / "escaped.pid"
    p = script(tmp_path, "escape", f"setsid sleep 30 & echo $! > {pidfile}; sleep 30")

    async def cancelled_mid_way() -> None:
        task = asyncio.ensure_future(probes.run_probe([str(p)], 30))
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline, "the probe never started its child"
            await asyncio.sleep(0.02)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    dropped: list[BaseException | None] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: dropped.append(u.exc_value)
    try:
        run(cancelled_mid_way())
        gc.collect()
    finally:
        sys.unraisablehook = previous
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert dropped == []


# ---- the pass with injected probes (PROBE-001, PROBE-030..034) ----------------------


class FakeProbes:
    """Answers for probe paths; records what ran with which timeout.

    ``nvidia-smi -L`` (EXT-MIG) is answered apart, from ``listing`` (by default a
    listing of no GPU), and recorded in ``list_calls``, not ``calls``.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.answers: dict[str, Run] = {}
        self.calls: list[tuple[str, float]] = []
        self.clock = clock
        self.takes: dict[str, float] = {}
        self.listing = Run(True, b"")
        self.list_calls: list[float] = []

    async def __call__(self, argv: Sequence[str], timeout: float) -> Run:
        if list(argv[1:]) == ["-L"]:
            self.list_calls.append(timeout)
            return self.listing
        self.calls.append((argv[0], timeout))
        if self.clock is not None:
            self.clock.advance(min(self.takes.get(argv[0], 0.0), timeout))
        return self.answers[argv[0]]


def ok(payload: object) -> Run:
    return Run(True, json.dumps(payload).encode())


NVIDIA_PATH = "/fake/bin/nvidia-smi"


@pytest.fixture
def no_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "builtin_facts", lambda: {"cpus": "8"})


def prober(
    tmp_path: Path,
    fake: FakeProbes,
    *,
    nvidia: list[bool] | None = None,
    devices: Sequence[str] = ("gpu0", "gpu1"),
    clock: FakeClock | None = None,
    budget: float = 30.0,
) -> probes.Prober:
    found = nvidia if nvidia is not None else [False]

    def which(name: str) -> str | None:
        assert name == "nvidia-smi"
        here = found.pop(0) if len(found) > 1 else found[0]
        return NVIDIA_PATH if here else None

    return probes.Prober(
        devices,
        str(tmp_path / "probe.d"),
        5.0,
        clock=clock or FakeClock(),
        timings=Timings(probe_pass_budget=budget),
        run=fake,
        which=which,
    )


def labels(p: probes.Prober) -> labelsources.LabelsPayload:
    return run(p.run_pass()).labels


@pytest.mark.usefixtures("no_builtins")
def test_sources_run_in_order_later_ones_overwrite(tmp_path: Path) -> None:  # PROBE-001
    d = tmp_path / "probe.d"
    d.mkdir()
    fake = FakeProbes()
    fake.answers[NVIDIA_PATH] = Run(True, H100_A10.encode())
    for name, payload in (("20-b", {"cpus": "2", "gpu0.model": "B"}), ("10-a", {"cpus": "1"})):
        script(d, name, "true")
        fake.answers[str(d / name)] = ok(payload)
    script(d, "30-plain-file", "true", mode=0o644)  # not executable: not a source
    (d / "40-dir").mkdir()
    script(d, ".hidden", "true")
    fake.answers[str(d / ".hidden")] = ok({"hidden": "yes"})
    got = labels(prober(tmp_path, fake, nvidia=[True]))
    assert [c[0] for c in fake.calls] == [
        NVIDIA_PATH,
        str(d / ".hidden"),
        str(d / "10-a"),
        str(d / "20-b"),
    ]
    assert got is not None
    assert got[""] == {"cpus": "2", "hidden": "yes"}
    assert got["gpu0"]["model"] == "B" and got["gpu1"]["model"] == "NVIDIA A10"
    assert all(timeout == 5.0 for _, timeout in fake.calls)


@pytest.mark.usefixtures("no_builtins")
def test_a_failing_dropin_keeps_the_devices_it_named(tmp_path: Path) -> None:  # PROBE-030/031
    path, fake = one_dropin(tmp_path, "10-gpu", ok({"gpu0.model": "H100"}))
    source = str(path)
    p = prober(tmp_path, fake)
    assert labels(p) == {"": {"cpus": "8"}, "gpu0": {"model": "H100"}, "gpu1": {}}
    for broken in (Run(False, problem="exit status 1"), Run(True, b"garbage"), ok([1])):
        fake.answers[source] = broken
        assert labels(p) == {"": {"cpus": "8"}, "gpu1": {}}  # gpu0 omitted: kept as stored
        assert p.sources.named[source] == {"gpu0"}  # carried forward unchanged
    fake.answers[source] = ok({})
    assert labels(p) == {"": {"cpus": "8"}, "gpu0": {}, "gpu1": {}}  # success: clears
    path.unlink()
    labels(p)
    assert source not in p.sources.named  # forgotten once gone


@pytest.mark.usefixtures("no_builtins")
def test_a_dropin_that_never_named_a_device_warns_once_per_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # PROBE-031
    path, fake = one_dropin(
        tmp_path, "10-x", Run(False, problem="exit status 2", stderr=b"E" * 500)
    )
    source = str(path)
    p = prober(tmp_path, fake)

    def cleared_warnings() -> int:
        return sum("will be cleared" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.probes"):
        assert labels(p) == {"": {"cpus": "8"}, "gpu0": {}, "gpu1": {}}
        labels(p)
        assert cleared_warnings() == 1
        failed = [r.getMessage() for r in caplog.records if "exit status 2" in r.getMessage()]
        assert failed and all(m.count("E") == probes.STDERR_NOTE for m in failed)
        fake.answers[source] = ok({"k": "v"})
        labels(p)
        fake.answers[source] = Run(False, problem="exit status 2")
        labels(p)
        assert cleared_warnings() == 2  # a new episode warns again


@pytest.mark.usefixtures("no_builtins")
def test_an_omitted_device_is_warned_once_per_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # PROBE-041
    path, fake = one_dropin(tmp_path, "10-gpu", ok({"gpu0.model": "H100"}))
    source = str(path)
    p = prober(tmp_path, fake)
    broken = Run(False, problem="exit status 1")

    def omitted_warnings() -> int:
        return sum(
            r.levelno == logging.WARNING and r.getMessage().startswith("device gpu0: a probe")
            for r in caplog.records
        )

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.probes"):
        labels(p)
        fake.answers[source] = broken
        for _ in range(3):
            assert labels(p) == {"": {"cpus": "8"}, "gpu1": {}}
        assert omitted_warnings() == 1
        fake.answers[source] = ok({"gpu0.model": "H100"})
        assert labels(p) == {"": {"cpus": "8"}, "gpu0": {"model": "H100"}, "gpu1": {}}
        fake.answers[source] = broken
        labels(p)
        assert omitted_warnings() == 2  # the success ended the episode


@pytest.mark.usefixtures("no_builtins")
def test_a_dangling_symlink_is_a_failure_of_that_source(tmp_path: Path) -> None:  # PROBE-020
    path, fake = one_dropin(tmp_path, "10-gpu", ok({"gpu1.rack": "r1"}))
    source = str(path)
    p = prober(tmp_path, fake)
    labels(p)
    path.unlink()
    path.symlink_to(tmp_path / "gone")
    assert labels(p) == {"": {"cpus": "8"}, "gpu0": {}}
    assert p.sources.named[source] == {"gpu1"}


@pytest.mark.usefixtures("no_builtins")
def test_probe_dir_missing_or_unlistable(tmp_path: Path) -> None:  # PROBE-033
    path, fake = one_dropin(tmp_path, "10-gpu", ok({"gpu1.rack": "r1"}))
    source = str(path)
    fake.answers[NVIDIA_PATH] = Run(True, b"A, 1, 1, 1\n")
    p = prober(tmp_path, fake, nvidia=[True])
    labels(p)
    # Not a directory any more: every remembered drop-in failed; nvidia-smi is fine.
    path.unlink()
    d = path.parent
    d.rmdir()
    d.write_text("")
    got = labels(p)
    assert got is not None and "gpu1" not in got and got["gpu0"]["model"] == "A"
    assert p.sources.named[source] == {"gpu1"}
    # Removed entirely: a legitimate configuration; facts clear.
    d.unlink()
    got = labels(p)
    assert got is not None and got["gpu1"] == {} and got["gpu0"]["model"] == "A"
    assert source not in p.sources.named


@pytest.mark.usefixtures("no_builtins")
def test_nvidia_smi_broken_or_gone_keeps_the_gpus(tmp_path: Path) -> None:  # PROBE-032
    fake = FakeProbes()
    fake.answers[NVIDIA_PATH] = Run(False, problem="killed after 5s")
    # Broken on the first pass: no memory, so every gpu<N> device is unconfirmed.
    p = prober(tmp_path, fake, nvidia=[True], devices=("gpu0", "gpu12", "gpux", "cpu"))
    assert labels(p) == {"": {"cpus": "8"}, "gpux": {}, "cpu": {}}
    fake.answers[NVIDIA_PATH] = Run(True, b"A, 1, 1, 1\n")
    got = labels(p)
    assert got is not None and got["gpu0"]["model"] == "A" and got["gpu12"] == {}
    fake.answers[NVIDIA_PATH] = Run(False, problem="exit status 9")
    assert labels(p) == {"": {"cpus": "8"}, "gpu12": {}, "gpux": {}, "cpu": {}}


@pytest.mark.usefixtures("no_builtins")
def test_nvidia_smi_seen_at_start_then_missing_is_a_failure(tmp_path: Path) -> None:
    fake = FakeProbes()
    fake.answers[NVIDIA_PATH] = Run(True, b"A, 1, 1, 1\n")
    p = prober(tmp_path, fake, nvidia=[True, False])
    labels(p)
    assert labels(p) == {"": {"cpus": "8"}, "gpu1": {}}  # PROBE-032
    assert p.nvidia_at_start is True  # PROBE-014


@pytest.mark.usefixtures("no_builtins")
def test_nvidia_smi_never_seen_is_not_a_failure(tmp_path: Path) -> None:  # PROBE-032
    p = prober(tmp_path, FakeProbes(), nvidia=[False])
    assert labels(p) == {"": {"cpus": "8"}, "gpu0": {}, "gpu1": {}}
    assert p.nvidia_at_start is False


def test_a_pass_with_no_facts_is_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:  # PROBE-040
    monkeypatch.setattr(probes, "builtin_facts", dict)
    with caplog.at_level(logging.ERROR, logger="resource_controller.worker.probes"):
        assert labels(prober(tmp_path, FakeProbes())) is None
    assert any("no facts" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("no_builtins")
def test_the_pass_budget_skips_what_it_did_not_reach(tmp_path: Path) -> None:  # PROBE-003
    d = tmp_path / "probe.d"
    d.mkdir()
    clock = FakeClock()
    fake = FakeProbes(clock)
    sources = [str(script(d, f"{i}0-p", "true")) for i in range(1, 4)]
    for i, source in enumerate(sources):
        fake.answers[source] = ok({f"gpu{i % 2}.k{i}": "v"})
    p = prober(tmp_path, fake, clock=clock, budget=8.0)
    labels(p)  # all three succeed, instantly
    fake.takes[sources[0]] = 5.0
    fake.takes[sources[1]] = 99.0
    fake.answers[sources[1]] = Run(False, problem="killed")
    got = labels(p)
    # The second ran with what was left of the budget and was cut; the third never ran.
    assert fake.calls[-2:] == [(sources[0], 5.0), (sources[1], 3.0)]
    # gpu1 was named only by the cut one: left out, kept as stored. gpu0 still has a fact.
    assert got == {"": {"cpus": "8"}, "gpu0": {"k0": "v"}}
    assert p.sources.named[sources[2]] == {"gpu0"}


@pytest.mark.usefixtures("no_builtins")
def test_a_device_still_reported_by_another_source_is_sent(tmp_path: Path) -> None:  # PROBE-042
    d = tmp_path / "probe.d"
    d.mkdir()
    a, b = str(script(d, "10-a", "true")), str(script(d, "20-b", "true"))
    fake = FakeProbes()
    fake.answers[a] = ok({"gpu0.a": "1"})
    fake.answers[b] = ok({"gpu0.b": "2"})
    p = prober(tmp_path, fake)
    labels(p)
    fake.answers[a] = Run(False, problem="exit status 1")
    got = labels(p)
    assert got is not None and got["gpu0"] == {"b": "2"}  # a's key for gpu0 clears


# ---- the agent: registration and the interval push (WRK-040..043, PROBE-050) --------


def test_registration_and_interval_pushes_carry_probes_and_sheets(tmp_path: Path) -> None:
    from fake_controller import FakeController, Running, make_config, until

    probe_dir = tmp_path / "probe.d"
    probe_dir.mkdir()
    counter = tmp_path / "n"
    script(
        probe_dir,
        "10-count",
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; "
        'echo "{\\"gpu1.pass\\": \\"$n\\", \\"site\\": \\"lab\\"}"',
    )
    sheet_dir = tmp_path / "sheets"
    (sheet_dir / "host.d").mkdir(parents=True)
    (sheet_dir / "host.md").write_text("# box\n")
    ctl = FakeController()
    config = make_config(probe_dir=str(probe_dir), sheet_dir=str(sheet_dir), probe_interval=0.2)

    async def go() -> None:
        r = await Running(ctl, config).started()
        await until(lambda: len(ctl.label_pushes) >= 1)
        (sheet_dir / "host.d" / "gpu0.md").write_text("gpu0 note\n")
        await until(lambda: any(p.get("device_sheets", {}).get("gpu0") for p in ctl.label_pushes))
        (sheet_dir / "host.md").unlink()
        await until(lambda: ctl.label_pushes[-1].get("sheet") == "")
        await r.finish()

    run(go())
    (reg,) = ctl.registrations  # WRK-040: the pass ran at registration; pushes never register
    assert reg["labels"]["gpu1"] == {"pass": "1"} and reg["labels"][""]["site"] == "lab"
    assert reg["sheet"] == "# box\n" and reg["device_sheets"] == {"gpu0": "", "gpu1": ""}
    first = ctl.label_pushes[0]
    assert first["host"] == "box" and first["devices"] == ["gpu0", "gpu1"]
    assert first["labels"]["gpu1"] == {"pass": "2"}  # a fresh pass for every push
    assert first["declared_labels"] == {"gpu0": {}, "gpu1": {"rack": "r3"}}  # WRK-044
    assert any(p["device_sheets"]["gpu0"] == "gpu0 note\n" for p in ctl.label_pushes)
    assert ctl.label_pushes[-1]["sheet"] == ""  # a deleted host.md clears (SHEET-002)


def test_a_hanging_probe_never_delays_heartbeats(tmp_path: Path) -> None:  # WRK-042
    from fake_controller import FakeController, Running, make_config, until

    probe_dir = tmp_path / "probe.d"
    probe_dir.mkdir()
    marker, pidfile = tmp_path / "hang-now", tmp_path / "probe.pid"
    script(
        probe_dir,
        "10-hang",
        f"[ -e {marker} ] && {{ echo $$ > {pidfile}; exec sleep 60; }}; echo '{{}}'",
    )
    ctl = FakeController()
    config = make_config(probe_dir=str(probe_dir), probe_interval=0.05, probe_timeout=60)

    async def go() -> int:
        r = await Running(ctl, config).started()
        marker.write_text("")
        await until(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
        pid = int(pidfile.read_text())
        pushes, beats = len(ctl.label_pushes), len(ctl.heartbeats)
        await until(lambda: len(ctl.heartbeats) >= beats + 3)
        assert len(ctl.label_pushes) == pushes  # the pass is still stuck on its probe
        stat = procs.read_stat(pid)
        assert stat is not None and stat.state != "Z"
        await r.finish()  # shutdown cancels the pass, which kills the probe's group
        return pid

    pid = run(go())
    # SIGKILL is sent by then; the probe's death itself takes a moment on a busy host.
    deadline = time.monotonic() + 10
    while (stat := procs.read_stat(pid)) is not None and stat.state != "Z":
        assert time.monotonic() < deadline, f"probe {pid} still alive: {stat}"
        time.sleep(0.01)
