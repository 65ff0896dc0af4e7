"""`live`: commit -> websocket message at the client, p50 and p95, with 100 runs changing at once.

daphne serves the project's ASGI app on a free port against the bench database and broker.
A separate client process (as a browser would be) opens one websocket per run to
`/ws/runs/<id>/` with a member's session cookie and stamps each message on arrival. The bench
process then changes all 100 runs at once through the kernel (pause, then resume, wave after
wave; 4 threads, each with its own connection) and stamps each change's commit with an
`on_commit` hook registered before the kernel's own, so it runs first after COMMIT. A
change is matched to the first message of its run whose seq is at or past the change's (a
run's pushes are coalesced: one push may tell of several changes). Both stamps are
`time.time()` on one machine.

**While a fan runs**: a client process builds a fan of `live_fan` quick calls through the same
daphne's JSON API (bench/fan.py's `run_fan`) and the workers run it throughout the waves, so the fan's
own pushes (hundreds of changes a second on one run) compete with the 100 runs' pushes. The
waves start once the fan's first append has committed; the section says how many waves
ended while the fan was still running.

The clients open their sockets 10 handshakes at a time (and reopen a dropped one); after the
measurement, `connect_burst` opens all 100 at the same instant and counts the refusals (a
socket joins its run's group before it is accepted, and the channel layer's `group_add` returns
only once Redis holds the subscription: oz0site/channel_layer.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any

from bench.harness import (
    Environment,
    Processes,
    Profile,
    Section,
    bench_team,
    goal_at_most,
    percentile,
    say,
    summary,
    wait_until,
)

THREADS = 4


CONNECT_AT_ONCE = 10  # handshakes in flight at a time while measuring; `connect_burst` tries all at once


async def run_socket(port: int, cookie: str, run_id: str) -> Any:
    """A signed-in person's websocket on one run page, as the browser opens it."""
    from websockets.asyncio.client import connect

    return await connect(
        f"ws://127.0.0.1:{port}/ws/runs/{run_id}/",
        origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={cookie}"},
        open_timeout=30,
    )


def _client_main(port: int, cookie: str, run_ids: list[str], expected: int, ready: Any, stop: Any, out: Any) -> None:
    """The browser side: one websocket per run; stamps each message on arrival; reconnects a dropped socket."""
    import json

    received: list[tuple[str, int, float]] = []
    counts = {"connect_failures": 0, "drops": 0}
    connected_ids: set[str] = set()
    all_connected = asyncio.Event()
    stopping = asyncio.Event()

    async def listen(run_id: str, gate: asyncio.Semaphore) -> None:
        while not stopping.is_set():
            try:
                async with gate:
                    ws = await run_socket(port, cookie, run_id)
            except Exception:
                counts["connect_failures"] += 1
                await asyncio.sleep(0.5)
                continue
            connected_ids.add(run_id)
            if len(connected_ids) == len(run_ids):
                all_connected.set()
            try:
                async for raw in ws:
                    stamp = time.time()
                    message = json.loads(raw)
                    received.append((str(message.get("run")), int(message.get("seq") or 0), stamp))
            except Exception:
                pass
            finally:
                connected_ids.discard(run_id)
                await ws.close()
            if not stopping.is_set():
                counts["drops"] += 1

    async def main() -> None:
        gate = asyncio.Semaphore(CONNECT_AT_ONCE)
        tasks = [asyncio.create_task(listen(r, gate)) for r in run_ids]
        try:
            await asyncio.wait_for(all_connected.wait(), timeout=120)
        except TimeoutError:
            out.put(("error", f"{len(connected_ids)} of {len(run_ids)} websockets connected ({counts})"))
            stopping.set()
            for task in tasks:
                task.cancel()
            return
        ready.set()
        while not stop.is_set() and len(received) < expected:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        stopping.set()
        for task in tasks:
            task.cancel()
        out.put(("ok", {"received": received, **counts}))

    asyncio.run(main())


def connect_burst(port: int, cookie: str, run_ids: list[str]) -> dict[str, int]:
    """Open every websocket at once (no pacing), as a page reload of 100 clients would: how many are refused."""

    async def one(run_id: str) -> bool:
        try:
            ws = await run_socket(port, cookie, run_id)
        except Exception:
            return False
        await asyncio.sleep(1.0)
        await ws.close()
        return True

    async def main() -> list[bool]:
        return list(await asyncio.gather(*(one(r) for r in run_ids)))

    results = asyncio.run(main())
    return {"attempted": len(results), "refused": results.count(False)}


def _fan_main(n: int, workspace_id: int, port: int, token: str, probe_dir: Any, out: Any) -> None:
    """The fan's client in a process of its own, as a program building runs would be: its HTTP
    calls and JSON must not take the GIL from the bench process's publisher and drivers."""
    from bench import harness

    harness.setup_django()
    from bench import fan
    from tenancy.models import Workspace

    client = fan.Client(port, token)
    try:
        out.put(("ok", fan.run_fan(n, Workspace.objects.get(pk=workspace_id), client, probe_dir)))
    except BaseException as error:
        out.put(("error", repr(error)))
    finally:
        client.close()


def start_fan(profile: Profile, workspace: Any, user: Any, port: int, procs: Processes) -> tuple[Any, Any]:
    """Start a process that builds and runs a fan through this daphne's API; returns once its
    first request committed. (None, None) when the profile runs no fan beside the waves."""
    from runs.models import Run
    from tenancy import tokens

    if profile.live_fan <= 0:
        return None, None
    before = set(Run.objects.filter(workspace=workspace).values_list("pk", flat=True))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    token = tokens.issue(user=user, label="bench-live")[0]
    process = ctx.Process(target=_fan_main, args=(profile.live_fan, workspace.pk, port, token, procs.probe_dir, out))
    process.start()

    def building() -> bool:
        return (
            not process.is_alive()
            or Run.objects.filter(workspace=workspace).exclude(pk__in=before).filter(tasks__key="e1").exists()
        )

    wait_until(building, timeout=120, interval=0.02, what="the fan beside the live waves to start")
    return process, out


def run(profile: Profile, env: Environment, procs: Processes) -> Section:
    from django.db import connection, transaction
    from django.test import Client

    from runs import kernel

    workspace, user = bench_team("live")
    runs = []
    for _ in range(profile.live_runs):
        run_row, _ = kernel.create_run(
            workspace=workspace, user=user, body={"tasks": [{"key": "gate", "kind": "await", "question": "held open"}]}
        )
        runs.append(str(run_row.id))
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value

    port, daphne = procs.web_server()

    # Stamp when each publish's group_send has returned (the publisher's side of the latency):
    # the kernel calls `realtime.publish` through the module, so a wrapper here sees every one.
    from oz0site import realtime

    original_publish = realtime.publish
    published: dict[tuple[str, int], float] = {}

    def stamped_publish(groups: list[str], event: dict[str, Any]) -> Any:
        future = original_publish(groups, event)
        key = (str(event.get("run")), int(event.get("seq") or 0))
        if future is not None:
            future.add_done_callback(lambda _f, key=key: published.__setitem__(key, time.time()))
        return future

    realtime.publish = stamped_publish  # type: ignore[assignment]

    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    waves = profile.live_waves + 1  # wave 0 warms the publisher's channel-layer connections: not counted
    expected = profile.live_runs * waves
    listener = ctx.Process(target=_client_main, args=(port, cookie, runs, expected, ready, stop, out))
    listener.start()
    try:
        if not ready.wait(timeout=150):
            status, detail = out.get(timeout=5) if not out.empty() else ("error", "no answer")
            raise RuntimeError(f"bench: the websocket clients did not connect: {detail}")
        say(f"live: {len(runs)} websockets connected to daphne on port {port}")
        fan_process, fan_out = start_fan(profile, workspace, user, port, procs)
        fan_result: dict[str, Any] = {}
        waves_during_fan = 0
        commits: dict[tuple[str, int], float] = {}
        wave_of: dict[tuple[str, int], int] = {}
        lock = threading.Lock()
        barrier = threading.Barrier(THREADS + 1)
        errors: list[BaseException] = []

        def change(run_id: str, wave: int) -> None:
            stamp: list[float] = []
            with transaction.atomic():
                transaction.on_commit(lambda: stamp.append(time.time()))
                if wave % 2 == 0:
                    changed = kernel.pause_run(run_id=run_id, user=user)
                else:
                    changed = kernel.resume_run(run_id=run_id, user=user)
            with lock:
                commits[(run_id, int(changed.last_seq))] = stamp[0]
                wave_of[(run_id, int(changed.last_seq))] = wave

        def driver(share: list[str]) -> None:
            try:
                for wave in range(waves):
                    barrier.wait()
                    for run_id in share:
                        change(run_id, wave)
                    barrier.wait()
            except BaseException as error:  # surfaced below; the barrier is broken for the others
                errors.append(error)
                barrier.abort()
            finally:
                connection.close()

        threads = [threading.Thread(target=driver, args=(runs[i::THREADS],), daemon=True) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for wave in range(waves):
            barrier.wait()
            started = time.time()
            barrier.wait()
            fan_running = fan_process is not None and fan_process.is_alive()
            waves_during_fan += int(fan_running and wave > 0)
            say(
                f"live wave {wave}/{profile.live_waves}{' (warm-up)' if wave == 0 else ''}: {len(runs)} runs changed in "
                f"{(time.time() - started) * 1000:.0f} ms{', the fan running' if fan_running else ''}"
            )
            time.sleep(0.5)
        for thread in threads:
            thread.join(timeout=60)
        if fan_process is not None:
            fan_status, fan_answer = fan_out.get(timeout=900)
            fan_process.join(timeout=30)
            if fan_status != "ok":
                raise RuntimeError(f"bench: the fan beside the live waves failed: {fan_answer}")
            fan_result = fan_answer
        if errors:
            raise errors[0]
        stop.set()
        status, payload = out.get(timeout=60)
        if status != "ok":
            raise RuntimeError(f"bench: the websocket clients failed: {payload}")
        stop.set()
        listener.join(timeout=30)
        burst = connect_burst(port, cookie, runs)
        say(f"live: a burst of {burst['attempted']} simultaneous websocket connects: {burst['refused']} refused")
    finally:
        realtime.publish = original_publish  # type: ignore[assignment]
        stop.set()
        listener.join(timeout=30)
        if listener.is_alive():
            listener.kill()
        procs.stop(daphne)

    latencies: dict[int, list[float]] = {}
    to_publish: dict[int, list[float]] = {}
    to_client: dict[int, list[float]] = {}
    matched = 0
    arrivals: dict[str, list[tuple[int, float]]] = {}
    for run_id, seq, received in payload["received"]:
        arrivals.setdefault(run_id, []).append((seq, received))
    for (run_id, seq), committed in commits.items():
        # The first message of the run that tells of this change (its seq or a later one).
        told = min((at for message_seq, at in arrivals.get(run_id, []) if message_seq >= seq), default=None)
        if told is None:
            continue
        matched += 1
        wave = wave_of[(run_id, seq)]
        if wave == 0:
            continue
        latencies.setdefault(wave, []).append((told - committed) * 1000)
        key = (run_id, seq)
        if key in published:
            to_publish.setdefault(wave, []).append((published[key] - committed) * 1000)
            to_client.setdefault(wave, []).append((told - published[key]) * 1000)
    lost = len(commits) - matched
    p50s = [percentile(v, 50) for v in latencies.values() if v]
    p95s = [percentile(v, 95) for v in latencies.values() if v]
    pooled = [x for v in latencies.values() for x in v]
    section = Section()
    section.figures[f"commit -> message p50 ({len(runs)} runs at once)"] = summary(p50s, "ms", digits=1)
    section.figures[f"commit -> message p95 ({len(runs)} runs at once)"] = summary(p95s, "ms", digits=1)
    for label, split in (("commit -> group_send done (publisher)", to_publish), ("group_send done -> client", to_client)):
        section.figures[f"{label} p50"] = summary([percentile(v, 50) for v in split.values() if v], "ms", digits=1)
        section.figures[f"{label} p95"] = summary([percentile(v, 95) for v in split.values() if v], "ms", digits=1)
    section.figures["messages lost"] = summary([lost], "messages", digits=0)
    section.figures[f"waves measured while a fan of {profile.live_fan} ran"] = summary([waves_during_fan], "waves", digits=0)
    if fan_result:
        section.figures["the fan beside the waves: tasks/s"] = summary([fan_result["tasks_per_s"]], "tasks/s")
    section.figures["sockets dropped while measuring"] = summary([payload["drops"]], "sockets", digits=0)
    section.figures[f"connects refused, {len(runs)} at once (unpaced)"] = summary([burst["refused"]], "connects", digits=0)
    section.goals.append(
        goal_at_most(
            "p95 commit -> message", section.figures[f"commit -> message p95 ({len(runs)} runs at once)"]["median"], 100, " ms"
        )
    )
    section.extra = {
        "pooled_p50_ms": round(percentile(pooled, 50), 1) if pooled else None,
        "pooled_p95_ms": round(percentile(pooled, 95), 1) if pooled else None,
        "pooled_max_ms": round(max(pooled), 1) if pooled else None,
        "samples": len(pooled),
        "waves": profile.live_waves,
        "paced_connect_failures": payload["connect_failures"],
        "burst": burst,
    }
    if burst["refused"]:
        section.notes.append(
            f"{burst['refused']} of {burst['attempted']} websocket connects opened at the same instant were refused "
            "(daphne's log, beside the bench's other logs, says why)"
        )
    section.notes.append(
        "the split at the publisher is approximate: its stamp is taken by a done-callback on the publisher's event loop, "
        "which can run after the client already has the message (a negative 'group_send done -> client')"
    )
    section.notes.append(
        f"one figure per wave of {len(runs)} changes (median of the waves' p50 and p95); {len(pooled)} changes matched"
    )
    section.notes.append(
        f"a fan of {profile.live_fan} quick calls was built over HTTP and run beside the waves; "
        f"{waves_during_fan} of {profile.live_waves} measured waves ended while it ran"
    )
    return section
