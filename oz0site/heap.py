"""A long-lived process's startup objects, kept out of the garbage collector's full passes.

A full (oldest-generation) collection visits every object the collector tracks. A web or worker
process holds some 150,000 of them from startup alone (Django, the project's modules, settings,
URL and template machinery), alive as long as the process: visiting them is pure cost, 110-140 ms
per full pass on the bench machine. A pass comes when allocation says so, and a kernel
transaction that skips thousands of tasks allocates enough to bring one while it holds its run's
lock: one failing transition over 2,000 descendants took 380 ms with that pass in it and 260
without. Frozen once startup is done, those objects are skipped; a full pass visits what the
process made since (`./oz0 bench --only propagate`: 0-55 ms).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what startup left as garbage, then freeze what lives. Returns the frozen count."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
