"""``ArrayInfo`` reads an array's view without failing on what it cannot use (EXT-ARRAY-3)."""

from __future__ import annotations

from resource_controller.client.models import ArrayInfo


def test_an_array_view_reads_its_counts_tasks_and_failures() -> None:
    info = ArrayInfo.of(
        {
            "id": "a1",
            "spec": "0-2%2",
            "size": 3,
            "max_running": 2,
            "counts": {"succeeded": 1, "failed": 1, "running": 1, "odd": "x"},
            "tasks": [
                {"id": "t0", "index": 0, "state": "succeeded", "exit_code": 0},
                {"id": "t1", "index": 1, "state": "failed", "exit_code": 3},
                {"id": "t2", "index": 2, "state": "running"},
                "not a task",
            ],
            "newer_field": True,
        }
    )
    assert (info.id, info.size, info.max_running) == ("a1", 3, 2)
    assert info.counts == {"succeeded": 1, "failed": 1, "running": 1}
    assert [t["id"] for t in info.tasks] == ["t0", "t1", "t2"]
    assert info.failed == [1] and not info.done
    assert info.raw["newer_field"] is True


def test_an_unreadable_view_reads_as_empty() -> None:
    info = ArrayInfo.of({"id": "a2", "counts": [], "tasks": {}, "size": "many"})
    assert (info.counts, info.tasks, info.size) == ({}, [], 0)
    assert info.done and info.failed == []
