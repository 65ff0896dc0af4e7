"""The console's presentation helpers."""

from __future__ import annotations

from console.templatetags.oz0_console import capped, dom_id, duration, graph_layout


def test_it_formats_durations() -> None:
    assert [duration(s) for s in (0, 12, 64, 3 * 3600 + 125, 2 * 86400 + 7200)] == ["0s", "12s", "1m 04s", "3h 02m", "2d 2h"]
    assert duration(-5) == "0s" and duration(None) == ""


def test_it_makes_dom_ids_one_to_one() -> None:
    assert dom_id("r1.1") != dom_id("r11")
    assert dom_id("task:12") == "task_3a_12"


def test_it_caps_counts() -> None:
    assert capped(999) == "999" and capped(1000) == "1000+"


def test_it_lays_out_a_dag_by_depth() -> None:
    tasks = [
        {"key": "a", "kind": "tool", "status": "completed", "after": []},
        {"key": "b", "kind": "tool", "status": "running", "after": ["a"]},
        {"key": "c", "kind": "tool", "status": "waiting", "after": ["a", "b"]},
        {"key": "d", "kind": "tool", "status": "waiting", "after": []},
    ]
    layout = graph_layout(tasks)
    x = {n["key"]: n["x"] for n in layout["nodes"]}
    y = {n["key"]: n["y"] for n in layout["nodes"]}
    assert x["a"] == x["d"] < x["b"] < x["c"]
    assert y["a"] < y["d"]
    assert len(layout["edges"]) == 3
    assert layout["width"] > x["c"] and layout["height"] > y["d"]
    assert graph_layout([]) == {"nodes": [], "edges": [], "width": 0, "height": 0, "node_w": 150, "node_h": 34}
