"""Our worker's terminal report beside the reference worker's (EXT-COMPAT-2, EXT-ACCT-1).

A fleet moves host by host, so this worker's outcome reports reach reference
controllers too, which ignore fields they do not know. What EXT-ACCT-1 adds must
therefore be new optional keys only: every key the reference worker sends keeps its
name and type, and the measured figures are additions, left out when nothing was
measured.
"""

from __future__ import annotations

import json

from interop.capture import session
from resource_controller.worker import channel

GPU = {"gpu_util_mean": 61.5, "gpu_mem_peak_bytes": 12 << 30, "samples": 7}
#: Ours beside the reference's: the lease epoch (EXT-EPOCH-3) and the figures.
ADDED = {"lease_epoch", *GPU}


def reference_outcomes() -> list[dict[str, object]]:
    return [
        json.loads(x["req"])
        for x in session()
        if x["m"] == "POST"
        and x["p"].endswith("/status")
        and json.loads(x["req"]).get("state") != "running"
    ]


def test_the_figures_are_additions_beside_the_reference_keys() -> None:
    outcomes = reference_outcomes()
    assert outcomes, "the capture holds terminal reports"
    for theirs in outcomes:
        mine = channel.status_body(
            str(theirs["worker_id"]),
            str(theirs["state"]),
            exit_code=theirs.get("exit_code"),  # type: ignore[arg-type]
            reason=str(theirs.get("reason", "")),
            lease_epoch=4,
            gpu=GPU,
        )
        assert set(mine) - set(theirs) <= ADDED
        assert {k: mine[k] for k in theirs} == theirs  # same names, same values
        assert {k: mine[k] for k in GPU} == GPU


def test_nothing_measured_is_the_reference_body_exactly() -> None:
    for theirs in reference_outcomes():
        mine = channel.status_body(
            str(theirs["worker_id"]),
            str(theirs["state"]),
            exit_code=theirs.get("exit_code"),  # type: ignore[arg-type]
            reason=str(theirs.get("reason", "")),
            gpu={},
        )
        assert mine == theirs
