"""The garbage collector's view of a run's process: what is alive when a run's optimization
begins (imports, pydantic schemas, polars, the task rows, the program) is left out of the
collector's passes until the run ends.

A full collection walks every tracked object, and a harness process holds a few hundred
thousand long-lived ones: one pass took 110 ms. At 64 rollouts in flight enough of a run's
short-lived objects outlive the young generations to set one off in nearly every
1,000-rollout run of the overhead benchmark, a quarter of the run's time. Frozen objects are
still freed by reference counting; only cycles among them wait for the unfreeze, after which
the next collection sees them. Runs in flight together in one process share one freeze: the
first to hold it freezes, the last to release it unfreezes.
"""

from __future__ import annotations

import gc
import threading


def freeze_loaded() -> None:
    """For a server about to serve (the gateway, a container): what it loaded first (its
    imports, a container's dataset) lives as long as the process, so no collection need walk
    it again. A container's rows are most of its objects: Banking77's are 13,000 dicts."""
    gc.freeze()


class HeapFreeze:
    """One run's hold on the process's freeze; `hold` and `release` may each be called
    more than once (only the first of each counts)."""

    _lock = threading.Lock()
    _holders = 0

    def __init__(self) -> None:
        self._held = False

    def hold(self) -> None:
        if self._held:
            return
        with HeapFreeze._lock:
            if HeapFreeze._holders == 0:
                gc.freeze()
            HeapFreeze._holders += 1
        self._held = True

    def release(self) -> None:
        if not self._held:
            return
        with HeapFreeze._lock:
            HeapFreeze._holders -= 1
            if HeapFreeze._holders == 0:
                gc.unfreeze()
        self._held = False
