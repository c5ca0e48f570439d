"""The store's cost per job, without HTTP: the calls one API job makes, under cProfile.

Opens a real store (SQLite file, WAL, ``synchronous=FULL``) with one worker and four
devices, submits ``--jobs`` jobs the way ``POST /v1/jobs`` does (enqueue, one pass, read
back), then plays the worker: hand-out, ``running``, and the terminal report with the pass it
runs in its commit. Prints CPU per job (thread CPU, so fsync waits are not counted) and wall
time per job, and with ``--profile`` the top of the cProfile table by own time.
Usage: ``python bench/storecost.py [--jobs 200] [--profile 25]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from resource_controller.clock import SystemClock
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import JobRecord


def run(store: Store, n: int) -> None:
    worker = store.devices.register(
        "benchbox", "boot", [(f"slot{i}", 0) for i in range(4)]
    ).worker_id
    for _ in range(n):
        job = store.queue.enqueue(NewJob(command=["true"], submitter="bench"))
        store.queue.schedule_after(job)
        store.views.job(job.id)
    done = 0
    while done < n:
        handed, _ = store.reports.take_work(worker)
        for j in handed:
            store.reports.status(j.id, _owned, "running")
        for j in handed:
            store.reports.status(j.id, _owned, "succeeded", 0, "")
            done += 1


def _owned(job: JobRecord) -> None:
    """The ownership check a status report makes (``workerops.report_status``)."""
    assert job.worker_id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--profile", type=int, default=0, help="print this many cProfile rows")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rc-storecost-") as tmp:
        store = Store(Path(tmp) / "rc.db", SystemClock())
        prof = cProfile.Profile(time.thread_time) if args.profile else None
        t0, c0 = time.perf_counter(), time.thread_time()
        if prof:
            prof.enable()
        run(store, args.jobs)
        if prof:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        store.close()
    print(f"store CPU/job {cpu * 1e3 / args.jobs:.2f} ms, wall/job {wall * 1e3 / args.jobs:.2f} ms")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
