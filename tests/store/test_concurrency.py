"""Sixteen threads sharing one Store on four devices.

The store serialises its operations (STORE-002), so whatever the interleaving, a reader
of the database must never see two live leases on a device (STORE-180), more active
jobs than devices, or any other breach of STORE-181/182; and same-priority jobs pinned
to one device must still be granted in submission order (STORE-186).
"""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path

from resource_controller.clock import FakeClock
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

from .dbview import Raw, invariant_violations

THREADS = 16
ITERATIONS = 40
NAMES = [f"gpu{i}" for i in range(4)]
DEVICES = [f"box:{n}" for n in NAMES]
WORKER = str(uuid.uuid5(uuid.NAMESPACE_DNS, "box"))
TERMINAL = ("succeeded", "failed", "killed", "lost")


def _client(
    store: Store, seed: int, start: threading.Barrier, submitted: list[str], pinned: list[str]
) -> None:
    rng = random.Random(seed)
    start.wait()
    for _ in range(ITERATIONS):
        op = rng.random()
        if op < 0.35:
            kind = rng.choice(["pinned", "pinned", "selector", "any"])
            job = store.queue.enqueue(
                NewJob(
                    command=["run"],
                    submitter=f"client{seed}",
                    device_id=rng.choice(DEVICES) if kind == "pinned" else "",
                    selector=rng.choice(["kind=a", "kind=b"]) if kind == "selector" else "",
                    priority=rng.choice([0, 0, 1]),
                )
            )
            submitted.append(job.id)
            if kind == "pinned":
                pinned.append(job.id)
        elif op < 0.55:
            placed = store.queue.run_pass().assigned
            assert len(placed) <= len(DEVICES)
        elif op < 0.70:
            store.reports.take_work(WORKER)
        elif op < 0.92:
            active = store.views.active()
            if active:
                victim = rng.choice(active)
                store_helpers.release(store, victim.id, rng.choice(TERMINAL), 0, "done")
        elif op < 0.96:
            queued = store.views.queued()
            if queued:
                store.queue.cancel(rng.choice(queued).id, f"killed by client{seed}")
        else:
            store.reports.heartbeat(WORKER, [j.id for j in store.views.active()])
        # Checks inside each operation: one read transaction, so one consistent view.
        active = store.views.active()
        assert len(active) <= len(DEVICES)
        assert len({j.device_id for j in active}) == len(active)


def _checker(path: Path, stop: threading.Event, found: list[str], rounds: list[int]) -> None:
    raw = Raw(path)
    try:
        while not stop.is_set():
            found.extend(invariant_violations(raw))  # STORE-180..182 in one snapshot
            (row,) = raw.rows(
                "SELECT COUNT(*) AS n FROM jobs WHERE state IN ('assigned', 'running')"
            )
            if row["n"] > len(DEVICES):
                found.append(f"{row['n']} active jobs on {len(DEVICES)} devices")
            rounds[0] += 1
    finally:
        raw.close()


def test_sixteen_threads_never_share_a_device(tmp_path: Path) -> None:
    path = tmp_path / "rc.db"
    store = Store(path, FakeClock())
    raw = Raw(path)
    try:
        store.devices.register("box", "boot-1", [(n, 0) for n in NAMES])
        store.devices.apply_facts(
            "box", NAMES, {n: {"kind": "ab"[i % 2]} for i, n in enumerate(NAMES)}, None, None, None
        )
        start = threading.Barrier(THREADS)
        stop = threading.Event()
        found: list[str] = []
        rounds = [0]
        submitted: list[list[str]] = [[] for _ in range(THREADS)]
        pinned: list[list[str]] = [[] for _ in range(THREADS)]
        failures: list[BaseException] = []

        def run(i: int) -> None:
            try:
                _client(store, i, start, submitted[i], pinned[i])
            except BaseException as exc:
                failures.append(exc)
                start.abort()

        checker = threading.Thread(target=_checker, args=(path, stop, found, rounds))
        checker.start()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        stop.set()
        checker.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert failures == []
        assert found == []
        assert rounds[0] > 0

        # At rest: every job is queued, active with its lease, or terminal (STORE-181).
        assert invariant_violations(raw) == []
        all_ids = {j for ids in submitted for j in ids}
        rows = {r["id"]: r for r in raw.rows("SELECT * FROM jobs")}
        assert set(rows) == all_ids
        for r in rows.values():
            if r["state"] == "queued":
                assert r["worker_id"] == "" and r["started_at"] is None
                assert raw.leases_of(r["id"]) == []

        # Drain: the queue empties and every job ends terminal, every device ready.
        for _ in range(10 * len(all_ids) + 10):
            store.queue.run_pass()
            store.reports.take_work(WORKER)
            for j in store.views.active():
                store_helpers.release(store, j.id, "succeeded", 0)
            if not store.views.queued() and not store.views.active():
                break
        states = {r["state"] for r in raw.rows("SELECT state FROM jobs")}
        assert states <= set(TERMINAL)
        assert [d.state for d in store_helpers.devices(store)] == ["ready"] * len(DEVICES)
        assert invariant_violations(raw) == []

        # STORE-186: same-priority jobs pinned to one device were granted in seq order
        # (epochs strictly increase in grant order, EXT-EPOCH-1).
        pinned_ids = {j for ids in pinned for j in ids}
        by_key: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for r in raw.rows(
            "SELECT j.id, j.device_id, j.priority, j.seq, l.epoch"
            " FROM jobs j JOIN leases l ON l.job_id = j.id"
        ):
            if r["id"] in pinned_ids:
                key = (r["device_id"], r["priority"])
                by_key.setdefault(key, []).append((r["epoch"], r["seq"]))
        checked = 0
        for grants in by_key.values():
            seqs = [seq for _, seq in sorted(grants)]
            assert seqs == sorted(seqs)
            checked += len(seqs)
        assert checked > 0
    finally:
        raw.close()
        store.close()
