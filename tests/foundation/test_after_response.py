"""Work a request leaves for after its response (oz0site/after_response.py): done in the order it
was left, one failure stopping nothing, and a key's `settled` waiting for that key's work only."""

from __future__ import annotations

import threading

from oz0site.after_response import AfterResponse


def test_work_is_done_in_order_and_a_key_waits_only_for_its_own() -> None:
    sender, release, done = AfterResponse(), threading.Event(), []

    def blocked(name: str) -> None:
        release.wait(5)
        done.append(name)

    sender.leave("busy", lambda: blocked("first"))
    sender.leave("quiet", lambda: done.append("second"))
    sender.leave("busy", lambda: done.append("third"))
    assert not sender.settled("busy", timeout=0.05), "a key's work still on its way counted as done"
    assert sender.settled("nobody", timeout=0), "a key with nothing left waited"
    release.set()
    assert sender.settled("busy", timeout=5) and sender.settled("quiet", timeout=5)
    assert done == ["first", "second", "third"]


def test_a_failing_piece_of_work_stops_nothing_after_it() -> None:
    sender, done = AfterResponse(), []

    def fails() -> None:
        raise RuntimeError("Redis went away")

    sender.leave("a", fails)
    sender.leave("a", lambda: done.append("after"))
    assert sender.settled("a", timeout=5) and done == ["after"]


def test_past_its_bound_the_caller_does_its_own_work_and_nothing_is_dropped() -> None:
    sender, release, done, taken = AfterResponse(max_left=2), threading.Event(), [], threading.Event()
    sender.leave("a", lambda: (taken.set(), release.wait(5)))
    assert taken.wait(5)  # the sender's thread holds it, blocked: nothing waits in the queue
    sender.leave("a", lambda: done.append("queued 1"))
    sender.leave("a", lambda: done.append("queued 2"))
    sender.leave("a", lambda: done.append("inline"))  # two waiting: done at once, here
    assert done == ["inline"]
    release.set()
    assert sender.settled("a", timeout=5) and done == ["inline", "queued 1", "queued 2"]
