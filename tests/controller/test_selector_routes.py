"""Hostile selectors and label values at the routes (EXT-LIMITS-3, EXT-LIMITS-5)."""

from __future__ import annotations

from controller_harness import Harness, assert_error


def test_a_long_digit_run_in_explain_is_answered(rc: Harness) -> None:
    # EXT-LIMITS-3: 8,000 digits and an x held the store thread for seconds; the
    # scanner is linear, so the longest selector allowed (EXT-LIMITS-2: 4 KiB) gets an
    # ordinary answer (no device has such a value), and a longer one a plain refusal.
    rc.register("gpubox", ("gpu0",), labels={"gpu0": {"cpus": "8"}})
    r = rc.client.get("/v1/explain", params={"selector": "cpus>=" + "1" * 4089 + "x"})
    assert r.status_code == 200, r.text
    assert r.json()["matching"] == []
    r = rc.client.get("/v1/explain", params={"selector": "cpus>=" + "=" * 4000})
    assert_error(r, 400, "bad_selector")
    r = rc.client.get("/v1/explain", params={"selector": "cpus>=" + "1" * 8000 + "x"})
    assert_error(r, 400, "bad_request")
    assert rc.client.get("/v1/whoami").status_code == 200


def test_a_non_ascii_inf_label_value_does_not_break_matching(rc: Harness) -> None:
    # SEL-006: a worker's label value "ınf" (dotless i) is a string, not a quantity;
    # it used to raise inside matching and turn explain into a 500.
    rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu0": {"x": "ınf"}, "gpu1": {"x": "2"}})
    r = rc.client.get("/v1/explain", params={"selector": "x>=1"})
    assert r.status_code == 200, r.text
    assert r.json()["matching"] == ["gpubox:gpu1"]
    r = rc.client.get("/v1/explain", params={"selector": "x!=1"})
    assert r.json()["matching"] == ["gpubox:gpu0", "gpubox:gpu1"]


# ---- size units, ~ and what exists when nothing matches (core/selectors.py) --------------

H100 = {"model": "NVIDIA H100 80GB HBM3", "vram": "81559M"}
T4 = {"model": "Tesla T4", "vram": "15360M"}


def test_no_match_says_what_the_devices_have(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1", "gpu2"), labels={"gpu0": H100, "gpu1": H100, "gpu2": T4})
    r = rc.submit_raw(selector="model=H100")
    assert_error(r, 400, "no_matching_device")
    message = r.json()["message"]
    assert "model=H100" in message
    assert "model has 'NVIDIA H100 80GB HBM3' (2 devices), 'Tesla T4' (1 device)" in message
    assert "write model~H100" in message
    r = rc.client.get("/v1/explain", params={"selector": "model=H100"})
    assert r.status_code == 200, r.text
    assert r.json()["matching"] == [] and "model has 'NVIDIA H100" in r.json()["hint"]
    r = rc.client.get("/v1/explain", params={"selector": "modle=H100"})
    assert r.json()["hint"] == "no device has a label 'modle' (did you mean model?)"
    r = rc.client.get("/v1/explain", params={"selector": "model~h100"})
    assert r.json()["matching"] == ["gpubox:gpu0", "gpubox:gpu1"]
    assert "hint" not in r.json()  # only when nothing matches


def test_substring_and_units_reach_the_scheduler(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu0": H100, "gpu1": T4})
    job = rc.submit(selector="model~H100")
    assert job["state"] == "assigned" and job["device_id"] == "gpubox:gpu0"
    assert job["selector"] == "model~H100"
    for selector in ("vram>=80GB", "vram>=40GiB", "vram>=40Gi"):
        r = rc.client.get("/v1/explain", params={"selector": selector})
        assert r.json()["matching"] == ["gpubox:gpu0"], (selector, r.text)
    r = rc.client.get("/v1/explain", params={"selector": "vram>=80G"})  # 80 GiB > 81559 MiB
    assert r.json()["matching"] == []


def test_an_unknown_size_unit_is_a_bad_selector(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0",), labels={"gpu0": H100})
    for r in (
        rc.submit_raw(selector="vram>=1PB"),
        rc.client.get("/v1/explain", params={"selector": "vram>=1PB"}),
    ):
        assert_error(r, 400, "bad_selector")
        assert "'PB'" in r.json()["message"]
