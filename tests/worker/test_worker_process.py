"""``rc worker`` as a process: how it learns that its children exited.

A worker spawns a process per job, hook, probe and verify script. On Python 3.11 the
default child watcher parks one thread per child in ``waitpid``; the worker process
watches each child's pidfd on the event loop instead.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from resource_controller.worker import process


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 watches children by pidfd itself")
def test_a_child_is_watched_on_the_loop_without_a_thread() -> None:
    async def go() -> tuple[int, int, int | None]:
        watchers = process._watch_children_by_pidfd(asyncio.get_running_loop())
        if watchers is None:
            pytest.skip("this kernel has no pidfd_open")
        try:
            before = threading.active_count()
            child = await asyncio.create_subprocess_exec(
                "sh", "-c", "read line; exit 3", stdin=asyncio.subprocess.PIPE
            )
            during = threading.active_count()  # the child is blocked on its stdin
            assert child.stdin is not None
            child.stdin.close()
            code = await asyncio.wait_for(child.wait(), 10)
        finally:
            asyncio.set_child_watcher(watchers[1])
            watchers[0].close()
        return before, during, code

    before, during, code = asyncio.run(go())
    assert code == 3
    assert during == before


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 watches children by pidfd itself")
def test_the_previous_watcher_comes_back() -> None:
    async def go() -> None:
        previous = asyncio.get_child_watcher()
        watchers = process._watch_children_by_pidfd(asyncio.get_running_loop())
        if watchers is None:
            pytest.skip("this kernel has no pidfd_open")
        assert asyncio.get_child_watcher() is watchers[0] is not previous
        asyncio.set_child_watcher(watchers[1])
        watchers[0].close()
        assert asyncio.get_child_watcher() is previous

    asyncio.run(go())
