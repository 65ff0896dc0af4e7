"""`chain`: N no-op tool tasks (`test.echo`) in a chain; the per-step overhead in ms.

The chain is built behind a client-authored await (`gate`, which `c1` comes after), so no step
runs before all are appended; then the gate is resolved.

The goal is checked against the **whole step**: the chain's time (the gate's `finished_at` to
the last step's) divided by its steps. `test.echo` does no work, so a step is all overhead. The
gap from one task's `finished_at` to the next one's `started_at` is reported too, but it no
longer measures the overhead: the worker that settles a quick call claims the next one in the
same transaction, so both are stamped with that transaction's time and the gap is ≈ 0 by
construction; what a step costs (the settle-and-claim transaction, the heartbeat thread, the
tool) now lies between a task's `started_at` and its `finished_at`.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.harness import Profile, Section, bench_team, goal_at_most, percentile, say, summary, wait_until

APPEND_MAX = 64


def build_chain(steps: int, workspace: Any, user: Any) -> Any:
    """Build the chain behind its gate and resolve the gate; answers the run's id."""
    from runs import kernel

    tasks = [
        {"key": f"c{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}, "after": [f"c{i - 1}" if i > 1 else "gate"]}
        for i in range(1, steps + 1)
    ]
    first = tasks[: APPEND_MAX - 1]
    run, receipt = kernel.create_run(
        workspace=workspace,
        user=user,
        body={"tasks": [{"key": "gate", "kind": "await", "question": "hold the chain until it is built"}, *first]},
    )
    rest = tasks[len(first) :]
    for index in range(0, len(rest), APPEND_MAX):
        chunk = rest[index : index + APPEND_MAX]
        body: dict[str, Any] = {"tasks": chunk}
        if index + APPEND_MAX >= len(rest):
            body["deliverable"] = f"c{steps}"
        kernel.append(run_id=run.id, user=user, body=body)
    kernel.resolve_await(token=receipt["tokens"]["gate"], user=user, value="go")
    return run.id


def run_chain(steps: int, workspace: Any, user: Any) -> dict[str, float]:
    from runs.models import Run, Task

    run_id = build_chain(steps, workspace, user)
    wait_until(
        lambda: Run.objects.filter(pk=run_id, status__in=("completed", "canceled", "needs_attention")).exists(),
        timeout=600,
        interval=0.05,
        what="the chain to finish",
    )
    rows = {
        key: (started, finished)
        for key, started, finished in Task.objects.filter(run_id=run_id, status="completed").values_list(
            "key", "started_at", "finished_at"
        )
    }
    if len(rows) != steps + 1:
        raise RuntimeError(f"bench: the chain completed {len(rows) - 1} of {steps} steps")
    gaps = [(rows[f"c{i + 1}"][0] - rows[f"c{i}"][1]).total_seconds() * 1000 for i in range(1, steps)]
    busy = [(rows[f"c{i}"][1] - rows[f"c{i}"][0]).total_seconds() * 1000 for i in range(1, steps + 1)]
    total = (rows[f"c{steps}"][1] - rows["gate"][1]).total_seconds() * 1000
    return {
        "gap_mean_ms": statistics.fmean(gaps),
        "gap_p50_ms": statistics.median(gaps),
        "gap_p95_ms": percentile(gaps, 95),
        "step_total_ms": total / steps,
        "claim_to_finish_ms": statistics.median(busy),
    }


def run(profile: Profile) -> Section:
    workspace, user = bench_team("chain")
    results = []
    for rep in range(profile.reps):
        result = run_chain(profile.chain_steps, workspace, user)
        results.append(result)
        say(f"chain rep {rep + 1}/{profile.reps}: " + ", ".join(f"{k} {v:.1f}" for k, v in result.items()))
    section = Section()
    n = profile.chain_steps
    section.figures[f"finished -> next started, mean of {n - 1} gaps"] = summary([r["gap_mean_ms"] for r in results], "ms")
    section.figures["finished -> next started, median gap"] = summary([r["gap_p50_ms"] for r in results], "ms")
    section.figures["finished -> next started, p95 gap"] = summary([r["gap_p95_ms"] for r in results], "ms")
    section.figures["a step's claim to its completion (echo)"] = summary([r["claim_to_finish_ms"] for r in results], "ms")
    section.figures["whole step (chain time / steps)"] = summary([r["step_total_ms"] for r in results], "ms")
    section.goals.append(
        goal_at_most("per-step overhead (whole step)", section.figures["whole step (chain time / steps)"]["median"], 10, " ms")
    )
    section.extra = {"runs": results, "steps": n}
    return section
