"""The session keeper's loop hears its agents' exits whatever else the process runs: an
`asyncio.run` on the main thread (a test's, or a task's code) once took asyncio's one child watcher
to its own loop and, ending, closed every pidfd the keeper watched."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from runs.worker.harness.keeper import keeper

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"), reason="asyncio watches children by pidfd itself"
)


async def _waiting_child() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", "import sys; sys.stdin.read()", stdin=subprocess.PIPE)


async def _ended(process: asyncio.subprocess.Process) -> int:
    assert process.stdin is not None
    process.stdin.close()
    return await asyncio.wait_for(process.wait(), 20)


async def _child_of_its_own() -> int:
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(3)")
    return await asyncio.wait_for(process.wait(), 20)


def test_a_main_thread_asyncio_run_leaves_the_keepers_children_watched() -> None:
    loop = keeper().loop
    before = asyncio.run_coroutine_threadsafe(_waiting_child(), loop).result(20)
    # The main thread runs a loop of its own, which starts and waits for a child too.
    assert asyncio.run(_child_of_its_own()) == 3
    assert asyncio.run(_child_of_its_own()) == 3
    # The keeper's child started before still has its exit heard, and a new one starts and ends.
    assert asyncio.run_coroutine_threadsafe(_ended(before), loop).result(30) == 0
    after = asyncio.run_coroutine_threadsafe(_waiting_child(), loop).result(20)
    assert asyncio.run_coroutine_threadsafe(_ended(after), loop).result(30) == 0
