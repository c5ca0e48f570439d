"""Probes and usage sheets with real processes: ``rc serve``, ``rc worker``, ``rc run``.

- PROBE-010..012: a fake ``nvidia-smi`` first on the worker's ``PATH`` answers the real
  query (and ``-L``, EXT-MIG-1) with two different GPUs; ``rc run --select`` lands on
  the right one.
- PROBE-020..034: drop-ins that change between passes, hang past ``probe_timeout``,
  exit non-zero or print garbage; what an earlier run detected stays until a probe
  succeeds again, and a probe that never named a device clears when it fails.
- SHEET-001..005: sheets edited on disk and deleted; ``rc describe`` follows.

Passes come every ``probe_interval`` (a real config key, short here). Every wait is
bounded; nothing asserts how long anything took.
"""

from __future__ import annotations

import os
from pathlib import Path

from .cluster import Cluster, Json, wait_for

HOST = "probebox"
QUERY = "--query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader,nounits"
A10_H100 = "NVIDIA A10, 23028, 22000, 550.54.15\nNVIDIA H100 80GB HBM3, 81559, 81000, 550.54.15\n"
#: ``nvidia-smi -L`` for the same two GPUs, neither in MIG mode (EXT-MIG-1).
LISTING = (
    "GPU 0: NVIDIA A10 (UUID: GPU-3a1c0f6e-93f2-4e1b-8c63-5b0c2f7d9e11)\\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-7b2d1e0f-04a3-4c2d-9e8f-6a1b3c5d7e22)\\n"
)


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def fake_nvidia_smi(tmp: Path) -> tuple[Path, Path]:
    """A ``bin`` directory holding ``nvidia-smi``, and the file it prints."""
    bindir = tmp / "fakebin"
    bindir.mkdir()
    answer = tmp / "gpus.csv"
    answer.write_text(A10_H100)
    executable(
        bindir / "nvidia-smi",
        f'[ "$*" = "-L" ] && {{ printf "{LISTING}"; exit 0; }}\n'
        f'[ "$*" = "{QUERY}" ] || {{ echo "unexpected query: $*" >&2; exit 2; }}\ncat {answer}',
    )
    return bindir, answer


def start(
    cluster: Cluster,
    devices: list[str],
    settings: str,
    path_first: Path | None = None,
) -> None:
    """A worker for ``HOST`` with mapping-form ``devices`` entries, waited for."""
    env = {}
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{os.environ.get('PATH', '')}"
    cluster.start_worker(HOST, devices, extra=settings, env=env, wait=False)

    def registered() -> bool:
        status, views = cluster.api("GET", "/v1/devices")
        return status == 200 and len(views) == len(devices)

    wait_for(registered, 20, "the worker to register")


def describe(cluster: Cluster, name: str) -> dict[str, Json]:
    status, body = cluster.api("GET", f"/v1/devices/{HOST}:{name}/describe")
    assert status == 200, body
    view: dict[str, Json] = body
    return view


def labels(cluster: Cluster, name: str, source: str = "detected") -> dict[str, str]:
    rows = describe(cluster, name).get("labels") or []
    return {r["key"]: r["value"] for r in rows if r["source"] == source}


def until_labels(cluster: Cluster, name: str, want: dict[str, str | None], what: str) -> None:
    """Wait until the device's detected labels hold ``want`` (``None``: key absent)."""

    def holds() -> bool:
        have = labels(cluster, name)
        return all(have.get(k) == v for k, v in want.items())

    try:
        wait_for(holds, 20, what)
    except AssertionError:
        raise AssertionError(f"{what}: have {labels(cluster, name)}\n{cluster.logs()}") from None


def test_nvidia_smi_labels_steer_selectors(cluster: Cluster, tmp_path: Path) -> None:
    bindir, _ = fake_nvidia_smi(tmp_path)
    sheets = tmp_path / "sheets"
    (sheets / "host.d").mkdir(parents=True)
    (sheets / "host.md").write_text("# probebox: shared box\nScratch is /scratch.\n")
    (sheets / "host.d" / "gpu1.md").write_text("The H100. Book it in #gpu first.\n")
    cluster.start_controller()
    start(
        cluster,
        ["{name: gpu0, labels: {rack: r3, vram: 8G}}", "gpu1"],
        f"probe_dir: {tmp_path / 'no-probes'}\nsheet_dir: {sheets}\n",
        path_first=bindir,
    )
    until_labels(cluster, "gpu1", {"model": "NVIDIA H100 80GB HBM3"}, "nvidia-smi facts")
    gpu0, gpu1 = labels(cluster, "gpu0"), labels(cluster, "gpu1")
    assert gpu0["vram"] == "23028M" and gpu0["vendor"] == "nvidia"  # PROBE-012
    assert gpu1["vram"] == "81559M" and gpu1["driver"] == "550.54.15"
    assert "cpus" in gpu0 and "cpus" in gpu1  # host facts reach every device
    assert labels(cluster, "gpu0", "declared") == {"rack": "r3", "vram": "8G"}

    def device_of(selector: str) -> str:
        done = cluster.rc("run", "--select", selector, "--", "sh", "-c", "echo $RC_DEVICE")
        assert done.returncode == 0, done.stderr + cluster.logs()
        return done.stdout.strip()

    assert device_of("vram>=40G") == f"{HOST}:gpu1"
    assert device_of("model=NVIDIA A10") == f"{HOST}:gpu0"
    assert device_of("vendor=nvidia,vram<=40G") == f"{HOST}:gpu0"  # detected wins (STORE-142)
    assert device_of("rack=r3") == f"{HOST}:gpu0"  # a declared label still counts

    text = cluster.rc("describe", f"{HOST}:gpu0")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    print(out)  # the shape CLI-154 shows, for whoever reads the test log
    assert "vram=23028M" in out and "vram=8G" in out  # both sources, side by side
    assert out.index("vram=23028M") < out.index("vram=8G")  # detected first (CLI-155)
    assert "detected " in out and "declared " in out
    assert "host-wide note, updated" in out and "Scratch is /scratch." in out
    own = cluster.rc("describe", f"{HOST}:gpu1").stdout
    assert "device note, updated" in own and "Book it in #gpu first." in own


def test_nvidia_smi_failing_keeps_the_gpu_labels(cluster: Cluster, tmp_path: Path) -> None:
    bindir, answer = fake_nvidia_smi(tmp_path)
    cluster.start_controller()
    start(
        cluster,
        ["gpu0", "gpu1"],
        f"probe_interval: 300ms\nprobe_timeout: 2s\nprobe_dir: {tmp_path / 'probe.d'}\n",
        path_first=bindir,
    )
    until_labels(cluster, "gpu1", {"vram": "81559M"}, "nvidia-smi facts")
    # A different answer on a later pass replaces the facts (STORE-141).
    answer.write_text("NVIDIA A10, 23028, 100, 550.54.15\nNVIDIA L4, 23034, 9, 550.54.15\n")
    until_labels(cluster, "gpu1", {"model": "NVIDIA L4", "vram_free": "9M"}, "a new answer")
    # Broken (PROBE-011): the devices it named keep their labels (PROBE-032).
    executable(bindir / "nvidia-smi", "echo 'NVML: driver/library mismatch' >&2; exit 9")
    probe_log = tmp_path / "probe.d"
    probe_log.mkdir()
    marker = tmp_path / "passes"
    executable(probe_log / "10-count", f"echo x >> {marker}; echo '{{}}'")
    wait_for(lambda: marker.exists() and len(marker.read_text().split()) >= 3, 20, "passes")
    assert labels(cluster, "gpu1")["model"] == "NVIDIA L4"
    assert labels(cluster, "gpu0")["vram_free"] == "100M"
    assert "driver/library mismatch" in (tmp_path / f"worker-{HOST}.log").read_text()


def test_dropins_across_passes(cluster: Cluster, tmp_path: Path) -> None:
    probe_dir = tmp_path / "probe.d"
    probe_dir.mkdir()
    phase, mode = tmp_path / "phase", tmp_path / "mode"
    phase.write_text("1")
    mode.write_text("ok")
    # 10-phase names gpu0 with whatever ``phase`` says: proves a later pass ran.
    executable(probe_dir / "10-phase", f'echo "{{\\"gpu0.phase\\": \\"$(cat {phase})\\"}}"')
    # 20-flaky is gpu1's only source; ``mode`` decides how it behaves this pass.
    executable(
        probe_dir / "20-flaky",
        f"""case "$(cat {mode})" in
  ok) echo '{{"gpu1.flaky": "yes", "gpu1.count": 2}}' ;;
  hang) exec sleep 60 ;;
  fail) echo 'sensor offline' >&2; exit 3 ;;
  garbage) echo 'this is not json' ;;
  array) echo '[1, 2, 3]' ;;
  empty) echo '{{}}' ;;
esac""",
    )
    executable(probe_dir / "30-site", 'echo \'{"site": "lab", "rack": 7}\'')
    (probe_dir / "40-not-executable").write_text("#!/bin/sh\necho '{\"x\": 1}'\n")
    cluster.start_controller()
    start(
        cluster,
        ["gpu0", "gpu1"],
        f"probe_dir: {probe_dir}\nprobe_interval: 200ms\nprobe_timeout: 1s\n",
        path_first=tmp_path / "empty-bin",  # no nvidia-smi anywhere on this PATH
    )
    until_labels(cluster, "gpu1", {"flaky": "yes", "count": "2", "site": "lab"}, "first pass")
    assert labels(cluster, "gpu0")["rack"] == "7"  # a number keeps its literal text
    assert "x" not in labels(cluster, "gpu0")  # no execute bit: not a probe (PROBE-020)

    for n, how in enumerate(("hang", "fail", "garbage", "array"), start=2):
        mode.write_text(how)
        phase.write_text(str(n))
        # A pass that read the new phase also ran 20-flaky in its new mode.
        until_labels(cluster, "gpu0", {"phase": str(n)}, f"a pass with 20-flaky {how}")
        # PROBE-031: gpu1 left out of the push, so everything it had is kept.
        have = labels(cluster, "gpu1")
        assert (have.get("flaky"), have.get("count"), have.get("site")) == ("yes", "2", "lab"), how

    mode.write_text("empty")  # success with nothing for gpu1: its facts clear
    until_labels(cluster, "gpu1", {"flaky": None, "count": None, "site": "lab"}, "a clear")

    # A probe that only ever reported host keys is not preserved: failing clears them.
    executable(probe_dir / "30-site", "exit 1")
    until_labels(cluster, "gpu1", {"site": None, "rack": None}, "host facts of 30-site clear")
    until_labels(cluster, "gpu0", {"site": None}, "on every device")
    assert "cpus" in labels(cluster, "gpu0")  # built-ins still there (PROBE-034)
    log = (tmp_path / f"worker-{HOST}.log").read_text()
    assert "sensor offline" in log  # the failing probe's stderr is quoted
    assert "will be cleared" in log


def test_usage_sheets_follow_the_files(cluster: Cluster, tmp_path: Path) -> None:
    sheets = tmp_path / "sheets"
    sheets.mkdir()
    cluster.start_controller()
    start(
        cluster,
        ["gpu0", "gpu1"],
        f"sheet_dir: {sheets}\nprobe_interval: 200ms\nprobe_dir: {tmp_path / 'none'}\n",
        path_first=tmp_path / "empty-bin",
    )

    def sheet_of(name: str) -> tuple[str, bool]:
        d = describe(cluster, name)
        return str(d.get("sheet") or ""), bool(d.get("sheet_is_host_wide"))

    def until_sheet(name: str, want: tuple[str, bool], what: str) -> None:
        wait_for(lambda: sheet_of(name) == want, 20, what)

    assert "(none on file)" in cluster.rc("describe", f"{HOST}:gpu0").stdout
    (sheets / "host.md").write_text("# probebox\n")
    until_sheet("gpu0", ("# probebox\n", True), "the host sheet")  # API-062 fallback
    (sheets / "host.d").mkdir()
    (sheets / "host.d" / "gpu0.md").write_text("gpu0: fan is loud\n")
    until_sheet("gpu0", ("gpu0: fan is loud\n", False), "gpu0's own sheet")
    assert sheet_of("gpu1") == ("# probebox\n", True)
    (sheets / "host.d" / "gpu0.md").write_text("gpu0: fan replaced\n")
    until_sheet("gpu0", ("gpu0: fan replaced\n", False), "an edited sheet")
    out = cluster.rc("describe", f"{HOST}:gpu0").stdout
    assert "device note, updated" in out and "gpu0: fan replaced" in out
    # SHEET-005: an oversized sheet is cut, not refused (a 413 would lock the host out).
    (sheets / "host.md").write_text("z" * 70_000)
    wait_for(lambda: sheet_of("gpu1")[0].endswith("sheet exceeds 64KB)\n"), 20, "a cut sheet")
    assert len(sheet_of("gpu1")[0].encode()) == 65_536
    (sheets / "host.d" / "gpu0.md").unlink()  # a deleted file clears the sheet
    until_sheet("gpu0", (sheet_of("gpu1")[0], True), "the host sheet again")
    (sheets / "host.md").unlink()
    until_sheet("gpu0", ("", True), "no sheet at all")
    assert "(none on file)" in cluster.rc("describe", f"{HOST}:gpu0").stdout
