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
