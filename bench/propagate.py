"""`propagate`: failure propagation and quiescence over 1,000 / 2,000 / 4,000 / 8,000 descendants.

A `test.fail` root (`on_failure: propagate`) is created first; it is queued for a worker, but
no worker consumes the bench queue while this workload runs, so the root stays held back
while the bench appends its descendants (64 per append). Two shapes: a `chain` (each
descendant after the previous one: propagation goes level by level) and a `tree` (each node
has 8 children: few, wide levels). Then the bench claims the root itself and times the kernel's
failing transition, `kernel.task_fail`, in-process: one transaction that fails the root, skips
every descendant, and leaves the run quiescent (held, `needs_attention`). The growth ratio per
doubling is time(2n) / time(n) within one repetition; sizes alternate ascending and descending.
"""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Profile, QueryCounter, Section, bench_team, goal_at_most, say, summary

APPEND_MAX = 64
TREE_FANOUT = 8
SHAPES = ("chain", "tree")


def parent_of(index: int, shape: str) -> str:
    if shape == "chain":
        return "root" if index == 1 else f"d{index - 1}"
    parent = (index - 1) // TREE_FANOUT
    return "root" if parent == 0 else f"d{parent}"


def build(size: int, shape: str, workspace: Any, user: Any) -> tuple[Any, int]:
    from runs import kernel
    from runs.models import Task

    run, _ = kernel.create_run(
        workspace=workspace,
        user=user,
        body={
            "tasks": [
                {"key": "root", "kind": "tool", "tool": "test.fail", "args": {"error": "tool_failed"}, "on_failure": "propagate"}
            ]
        },
    )
    descendants = [
        {"key": f"d{i}", "kind": "tool", "tool": "test.echo", "args": {}, "after": [parent_of(i, shape)]}
        for i in range(1, size + 1)
    ]
    for index in range(0, size, APPEND_MAX):
        kernel.append(run_id=run.id, user=user, body={"tasks": descendants[index : index + APPEND_MAX]})
    root_id = Task.objects.filter(run=run, key="root").values_list("pk", flat=True).get()
    return run, root_id


def fail_root(run: Any, root_id: int) -> dict[str, float]:
    from runs import kernel
    from runs.models import Run, Task

    claimed = kernel.claim_task(None, root_id, "bench-propagate")
    if claimed is None:
        raise RuntimeError("bench: the propagate root was taken by someone else (is a worker consuming the bench queue?)")
    wal_before = wal_position()
    with QueryCounter() as queries:
        started = time.perf_counter()
        kernel.task_fail(claimed, "tool_failed", "the bench's root failure")
        seconds = time.perf_counter() - started
    wal_bytes = wal_since(wal_before)
    status = Run.objects.filter(pk=run.id).values_list("status", flat=True).get()
    skipped = Task.objects.filter(run=run, status="skipped").count()
    return {"ms": seconds * 1000, "queries": queries.count, "status": status, "skipped": skipped, "wal_bytes": wal_bytes}


def wal_position() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
        return str(cursor.fetchone()[0])


def wal_since(position: str) -> int:
    """Bytes of write-ahead log written since `position` (by every client: none other writes here)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", [position])
        return int(cursor.fetchone()[0])


def run(profile: Profile) -> Section:
    workspace, user = bench_team("propagate")
    sizes = profile.propagate_sizes
    times: dict[tuple[str, int], list[float]] = {}
    queries: dict[tuple[str, int], list[int]] = {}
    wal: dict[tuple[str, int], list[int]] = {}
    for rep in range(profile.propagate_reps):
        order = sizes if rep % 2 == 0 else tuple(reversed(sizes))
        for shape in SHAPES:
            for size in order:
                built = time.perf_counter()
                run_row, root_id = build(size, shape, workspace, user)
                build_s = time.perf_counter() - built
                result = fail_root(run_row, root_id)
                if result["skipped"] != size or result["status"] != "needs_attention":
                    raise RuntimeError(f"bench: propagate {shape} {size}: {result['skipped']} skipped, run {result['status']}")
                times.setdefault((shape, size), []).append(result["ms"])
                queries.setdefault((shape, size), []).append(int(result["queries"]))
                wal.setdefault((shape, size), []).append(int(result["wal_bytes"]))
                say(
                    f"propagate rep {rep + 1}/{profile.propagate_reps} {shape} {size}: failing transition "
                    f"{result['ms']:.0f} ms, {result['queries']} queries (built in {build_s:.1f}s)"
                )
    section = Section()
    worst: float | None = None
    for shape in SHAPES:
        for size in sizes:
            section.figures[f"{shape} of {size}: failing transition"] = summary(times[(shape, size)], "ms", digits=1)
        for small, large in zip(sizes, sizes[1:], strict=False):
            ratios = [b / a for a, b in zip(times[(shape, small)], times[(shape, large)], strict=True)]
            stat = summary(ratios, "x")
            section.figures[f"{shape} growth {small} -> {large}"] = stat
            worst = stat["median"] if worst is None else max(worst, stat["median"])
        section.figures[f"{shape} of {sizes[-1]}: SQL statements"] = summary(queries[(shape, sizes[-1])], "statements", digits=0)
        section.figures[f"{shape} of {sizes[-1]}: WAL per descendant"] = summary(
            [b / sizes[-1] for b in wal[(shape, sizes[-1])]], "bytes", digits=0
        )
    section.goals.append(goal_at_most("growth per doubling (worst shape and step)", worst, 2.1, "x"))
    section.extra = {
        "times_ms": {f"{s}:{n}": v for (s, n), v in times.items()},
        "queries": {f"{s}:{n}": v for (s, n), v in queries.items()},
        "wal_bytes": {f"{s}:{n}": v for (s, n), v in wal.items()},
    }
    section.notes.append(
        "The failing transition is timed in-process (kernel.task_fail, commit included); "
        f"chain = each descendant after the previous one, tree = {TREE_FANOUT} children per node."
    )
    return section
