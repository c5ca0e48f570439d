"""GPU sampling while a job runs (EXT-ACCT-1): the query, the readings, and never waiting.

First the pure parts (which ``-i`` a device gets, what an answer says, what a job's
readings add up to), then the sampler with an injected runner (no process, no clock),
then the real thing: the worker runs the fake ``nvidia-smi`` in
``tests/data/nvidia_smi_sampling/`` (a scenario picked by ``RC_TEST_SMI_SAMPLING``)
against the fake controller, answering, failing, hanging or printing garbage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fake_controller import FakeController, Running, job, make_config, outbox_files, until
from worker_helpers import FAST, run

from resource_controller.worker import config as wc
from resource_controller.worker import gpusample, probes
from resource_controller.worker.gpusample import Reading

FAKE_SMI = Path(__file__).resolve().parent.parent / "data" / "nvidia_smi_sampling"
MIB = 1 << 20
QUERY = [
    "--query-gpu=utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]


# ---- which device, which answer ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        ("gpu0", {}, "0"),
        ("gpu12", {"model": "A100"}, "12"),
        ("gpu0.mig1", {"uuid": "MIG-4f5e"}, "MIG-4f5e"),  # a MIG instance: its UUID only
        ("gpu3", {"uuid": "GPU-1234"}, "GPU-1234"),  # a UUID label wins over the name
        ("gpu0.mig1", {}, None),  # no UUID: nothing to name it by
        ("slot0", {}, None),
        ("gpux", {}, None),
        ("gpu", {"uuid": "  "}, None),
    ],
)
def test_the_target_of_a_device(name: str, labels: dict[str, str], expected: str | None) -> None:
    assert gpusample.target(name, labels) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("87, 10240\n", Reading(87.0, 10240 * MIB)),
        ("  0 ,0 \n", Reading(0.0, 0)),
        ("100, 81559", Reading(100.0, 81559 * MIB)),
        ("[N/A], 4864\n", Reading(None, 4864 * MIB)),  # a MIG instance
        ("[Not Supported], [Not Supported]\n", Reading(None, None)),
        ("87, \n", Reading(87.0, None)),  # truncated: the missing value is unknown
        ("-3, 12\n", Reading(None, 12 * MIB)),
        ("101, 12\n", Reading(None, 12 * MIB)),
        ("nan, inf\n", Reading(None, None)),
        ("garbage, more garbage\n", Reading(None, None)),
    ],
)
def test_an_answer_read(text: str, expected: Reading) -> None:
    assert gpusample.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "87\n",  # truncated after the first field
        "No devices were found\n",
        "87, 10240, 3\n",
        "87, 10240\n88, 10240\n",  # two GPUs where one was asked for
    ],
)
def test_an_answer_that_is_not_one_reading_is_a_problem(text: str) -> None:
    assert isinstance(gpusample.parse(text), str)


def test_the_tally_reports_only_what_some_reading_gave() -> None:
    t = gpusample.ReadingTally()
    assert t.fields() == {}  # absent, not zero (EXT-ACCT-1)
    t.add(Reading(None, None))
    assert t.fields() == {}
    t.add(Reading(None, 100 * MIB))
    assert t.fields() == {"gpu_mem_peak_bytes": 100 * MIB, "samples": 1}
    t.add(Reading(40.0, 50 * MIB))
    t.add(Reading(45.0, None))
    assert t.fields() == {"gpu_util_mean": 42.5, "gpu_mem_peak_bytes": 100 * MIB, "samples": 3}


# ---- the sampler, with its runner injected ---------------------------------------------


class Runs:
    """A ``probes.RunProbe`` that records argv and answers from a table (or hangs)."""

    def __init__(self, answers: dict[str, list[probes.Run]], hang: bool = False) -> None:
        self.answers = answers
        self.hang = hang
        self.argv: list[list[str]] = []
        self.timeouts: list[float] = []
        self.cancelled = 0

    async def __call__(self, argv: Sequence[str], timeout: float) -> probes.Run:
        self.argv.append(list(argv))
        self.timeouts.append(timeout)
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        queue = self.answers[argv[-1]]
        return queue.pop(0) if len(queue) > 1 else queue[0]


def ok(text: str) -> probes.Run:
    return probes.Run(True, text.encode())


def sampler(runs: Runs, targets: dict[str, str], **kw: Any) -> gpusample.Sampler:
    kw.setdefault("which", lambda name: "/opt/bin/" + name)
    return gpusample.Sampler("j1", targets, interval=10, timeout=5, run=runs, **kw)


def test_each_round_asks_every_device_exactly_the_specified_query() -> None:
    # EXT-ACCT-1: ``-i <index|uuid>``, bounded by probe_timeout.
    runs = Runs({"0": [ok("40, 1024\n"), ok("60, 2048\n")], "MIG-a": [ok("[N/A], 512\n")]})
    s = sampler(runs, {"box:gpu0": "0", "box:gpu1.mig0": "MIG-a"})

    async def go() -> None:
        await s.round()
        await s.round()

    run(go())
    assert sorted(runs.argv) == sorted(
        [["/opt/bin/nvidia-smi", *QUERY, "-i", t] for t in ("0", "MIG-a", "0", "MIG-a")]
    )
    assert runs.timeouts == [5, 5, 5, 5]
    assert s.stop() == {"gpu_util_mean": 50.0, "gpu_mem_peak_bytes": 2048 * MIB, "samples": 4}


def test_failures_count_nothing_and_are_said_once_per_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = Runs(
        {
            "0": [
                probes.Run(False, b"", b"GPU is lost", "exit status 15"),
                probes.Run(False, b"", b"", "killed after 5s"),
                probes.Run(False, b"", b"GPU is lost", "exit status 15"),
                ok("garbage\n"),
                ok("garbage\n"),
                ok("30, 100\n"),
            ]
        }
    )
    s = sampler(runs, {"box:gpu0": "0"})

    async def go() -> None:
        for _ in range(6):
            await s.round()

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.gpusample"):
        run(go())
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3, said  # exit status, killed, unreadable: each once
    assert all("job j1" in m and "box:gpu0" in m for m in said)
    assert s.stop() == {"gpu_util_mean": 30.0, "gpu_mem_peak_bytes": 100 * MIB, "samples": 1}


def test_without_nvidia_smi_nothing_runs_and_nothing_is_reported() -> None:
    runs = Runs({})
    s = sampler(runs, {"box:gpu0": "0"}, which=lambda name: None)
    run(s.round())
    assert runs.argv == [] and s.stop() == {}


def test_stop_never_waits_for_a_reading_in_flight() -> None:
    # EXT-ACCT-1: a hanging nvidia-smi never delays the job's end or its report.
    runs = Runs({}, hang=True)
    ticks: list[float] = []

    async def tick(seconds: float) -> None:
        ticks.append(seconds)
        await asyncio.sleep(0)  # the interval, elapsed at once

    async def go() -> dict[str, Any]:
        s = sampler(runs, {"box:gpu0": "0"}, sleep=tick)
        s.start()
        await until(lambda: bool(runs.argv))  # a reading is in flight, and hangs
        fields = s.stop()  # synchronous: nothing to await
        await until(lambda: runs.cancelled == 1)  # the run in flight was cancelled
        return fields

    assert run(go()) == {}
    assert ticks == [10]


# ---- the real thing: the worker, the fake nvidia-smi, the fake controller ----------------


def smi_processes(mark: str) -> list[int]:
    """Live processes started with this test's ``RC_TEST_SMI_MARK``."""
    want = f"RC_TEST_SMI_MARK={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fake ``nvidia-smi`` first on ``PATH``; the scenario is set by the test."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv("PATH", f"{FAKE_SMI}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("RC_TEST_SMI_STATE", str(tmp_path / "smi-state"))
    monkeypatch.setenv("RC_TEST_SMI_MARK", mark)
    yield mark
    for pid in smi_processes(mark):  # a failing test must not leave one behind
        os.kill(pid, 9)


def run_one(
    ctl: FakeController, a: dict[str, Any], config: wc.WorkerConfig
) -> tuple[dict[str, Any], float]:
    """Run ``a`` on an agent; its terminal report and how long after the job's own end
    (the process exit, seen from here as its last output) it arrived."""
    ended: list[float] = []
    got: list[float] = []
    ctl.on_report = lambda request: got.append(time.monotonic())

    async def go() -> None:
        r = await Running(ctl, config).started()
        ctl.hand_out(a)
        await until(lambda: bool(ctl.logs.get(a["job_id"])), timeout=20)
        ended.append(time.monotonic())
        await until(lambda: bool(ctl.terminal(a["job_id"])), timeout=20)
        await r.finish()

    run(go(), timeout=60)
    (body,) = ctl.terminal(a["job_id"])
    return body, got[0] - ended[0]


def test_the_outcome_carries_what_the_gpus_did(
    fake_smi: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EXT-ACCT-1: readings 40 %/10 GiB, 60 %/20 GiB, 80 %/15 GiB, then 80 % again.
    monkeypatch.setenv("RC_TEST_SMI_SAMPLING", "busy")
    ctl = FakeController()
    a = job(["sh", "-c", "sleep 1.2; echo done"])
    body, _ = run_one(ctl, a, make_config(gpu_sample_interval=0.2))
    assert body["state"] == "succeeded"
    n = body["samples"]  # how many rounds fit depends on the machine; what they say does not
    utils = ([40, 60, 80] + [80] * n)[:n]
    mems = ([10240, 20480, 15360] + [15360] * n)[:n]
    assert n >= 1, body
    assert body["gpu_util_mean"] == round(sum(utils) / n, 1)
    assert body["gpu_mem_peak_bytes"] == max(mems) * MIB


@pytest.mark.parametrize("scenario", ["hang", "failing", "unknown", "garbage"])
def test_a_broken_nvidia_smi_never_costs_the_outcome_or_delays_it(
    fake_smi: str, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    # EXT-ACCT-1: a hanging run is bounded by probe_timeout, and the report never waits
    # for it; failures and garbage are unknown values, never a lost outcome.
    monkeypatch.setenv("RC_TEST_SMI_SAMPLING", scenario)
    ctl = FakeController()
    a = job(["sh", "-c", "sleep 0.6; echo done; exit 3"])
    config = make_config(gpu_sample_interval=0.1, probe_timeout=30)
    body, after = run_one(ctl, a, config)
    assert (body["state"], body["exit_code"]) == ("failed", 3)
    if scenario != "garbage":
        assert not {"gpu_util_mean", "gpu_mem_peak_bytes", "samples"} & set(body), body
    else:  # only "50, 2048" and the two-field garbage line are readings at all
        assert body.get("gpu_util_mean", 50.0) == 50.0
    # Far below the 30 s a hanging run is allowed: the report did not wait for it.
    assert after < 10, after
    deadline = time.monotonic() + 10
    while smi_processes(fake_smi) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert smi_processes(fake_smi) == []  # the hanging run's group was killed


def test_a_gpu_that_vanishes_mid_job_keeps_what_was_read(
    fake_smi: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RC_TEST_SMI_SAMPLING", "vanish")
    ctl = FakeController()
    a = job(["sh", "-c", "sleep 0.8; echo done"])
    body, _ = run_one(ctl, a, make_config(gpu_sample_interval=0.15))
    assert body["state"] == "succeeded"
    assert (body["gpu_util_mean"], body["gpu_mem_peak_bytes"], body["samples"]) == (
        30.0,
        1024 * MIB,
        1,
    )


def test_sampling_off_or_no_gpu_device_runs_nothing(
    fake_smi: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RC_TEST_SMI_SAMPLING", "busy")
    for config, device in (
        (make_config(gpu_sample_interval=0), "box:gpu0"),  # 0 turns it off
        (
            wc.make_config(
                "http://controller.test", ["slot0"], host="box", state_dir=str(tmp_path / "s")
            ),
            "box:slot0",  # not a GPU
        ),
    ):
        ctl = FakeController()
        a = job(["sh", "-c", "sleep 0.4; echo done"], device_id=device)
        body, _ = run_one(ctl, a, config)
        assert body["state"] == "succeeded"
        assert "samples" not in body
    assert not (tmp_path / "smi-state").exists()  # the sampling query never ran


def test_the_outbox_keeps_the_figures_on_disk(
    fake_smi: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EXT-OUTBOX-1: the report written before its first attempt carries them, so a
    # restarted worker re-sends them.
    monkeypatch.setenv("RC_TEST_SMI_SAMPLING", "busy")
    ctl = FakeController()
    ctl.reports_unreachable = True
    on_disk: list[list[dict[str, Any]]] = []
    ctl.on_report = lambda request: on_disk.append(
        [json.loads(p.read_text()) for p in outbox_files()]
    )
    a = job(["sh", "-c", "sleep 0.7; echo done"])

    async def go() -> None:
        config = make_config(gpu_sample_interval=0.15)
        r = await Running(ctl, config, timings=replace(FAST, shutdown_wait=0.3)).started()
        ctl.hand_out(a)
        await until(lambda: bool(on_disk), timeout=20)
        await r.finish(10)

    run(go(), timeout=60)
    (record,) = on_disk[0]
    assert record["body"]["samples"] >= 1
    assert {"gpu_util_mean", "gpu_mem_peak_bytes"} <= set(record["body"])


# ---- configuration ---------------------------------------------------------------------


def write(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "worker.yaml"
    path.write_text(f"controller_url: http://c\ndevices: [gpu0]\n{extra}")
    return str(path)


def test_the_interval_defaults_to_ten_seconds_and_zero_turns_it_off(tmp_path: Path) -> None:
    assert wc.load_config(write(tmp_path, ""), {}).gpu_sample_interval == 10.0
    for off in ("0", '"0"', '"0s"'):
        config = wc.load_config(write(tmp_path, f"gpu_sample_interval: {off}\n"), {})
        assert config.gpu_sample_interval == 0
    text = 'gpu_sample_interval: "2s"\n'
    assert wc.load_config(write(tmp_path, text), {}).gpu_sample_interval == 2.0
    assert wc.make_config("http://c", ["gpu0"]).gpu_sample_interval == 10.0


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"-1s"', "gpu_sample_interval -1s"),
        ('"50ms"', "gpu_sample_interval 50ms"),
        ('"ten"', "invalid duration"),
        ("10", "a duration must be a string"),
    ],
)
def test_a_bad_interval_is_refused_naming_it(tmp_path: Path, value: str, says: str) -> None:
    with pytest.raises(wc.ConfigError, match=says):
        wc.load_config(write(tmp_path, f"gpu_sample_interval: {value}\n"), {})


def test_a_device_keeps_its_detected_uuid_while_a_probe_fails(tmp_path: Path) -> None:
    # What ``-i`` names a MIG instance by comes from the probes; a pass that cannot
    # confirm the device (PROBE-031) must not make its GPU unsampled meanwhile.
    probe_dir = tmp_path / "probe.d"
    probe_dir.mkdir()
    probe = probe_dir / "10-uuid"
    probe.write_text('#!/bin/sh\necho \'{"gpu0.uuid": "GPU-0a1b"}\'\n')
    probe.chmod(0o755)
    ctl = FakeController()

    async def go() -> list[str | None]:
        r = await Running(ctl, make_config(probe_dir=str(probe_dir))).started()
        life = r.agent.life
        assert life is not None
        seen = [life.detected.get("gpu0", {}).get("uuid")]
        probe.write_text("#!/bin/sh\nexit 1\n")
        await r.agent.gather_facts()
        seen.append(life.detected.get("gpu0", {}).get("uuid"))
        probe.unlink()  # gone: its facts clear, as the labels do
        await r.agent.gather_facts()
        seen.append(life.detected.get("gpu0", {}).get("uuid"))
        await r.finish()
        return seen

    assert run(go()) == ["GPU-0a1b", "GPU-0a1b", None]
