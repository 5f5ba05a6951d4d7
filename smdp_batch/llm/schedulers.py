"""Baseline schedulers for the LLM engine (:mod:`.engine`): one decision point, ``admit``.

* :class:`StaticBatching` — the engine runs one batch to completion: a group of up to B is admitted
  only when nothing is running (the "server locked until the batch ends" of paper 000 §1).
* :class:`ContinuousFCFS` — vLLM-style continuous batching with a preset maximum batch size
  (paper 002's "static batching" baseline): admit the oldest waiting requests while fewer than B run.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import InputError

__all__ = ["Scheduler", "StaticBatching", "ContinuousFCFS"]


def _check_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise InputError(f"{name} must be an integer ≥ {lo}, got {v!r}")
    return int(v)


class Scheduler:
    """A FIFO waiting queue; subclasses decide ``admit``."""

    name = "scheduler"

    def __init__(self):
        self.queue: deque = deque()

    def push(self, ids, engine) -> None:
        self.queue.extend(ids)

    def push_front(self, ids, engine) -> None:
        self.queue.extendleft(reversed(list(ids)))

    def _take(self, n: int) -> list[int]:
        return [self.queue.popleft() for _ in range(min(n, len(self.queue)))]


class StaticBatching(Scheduler):
    """Run-to-completion batches of up to ``max_batch`` requests, FCFS."""

    def __init__(self, max_batch: int = 32):
        super().__init__()
        self.max_batch = _check_int("max_batch", max_batch)
        self.name = f"static B={self.max_batch}"

    def admit(self, now, engine) -> list[int]:
        return [] if engine.running else self._take(self.max_batch)


class ContinuousFCFS(Scheduler):
    """Continuous batching with a fixed maximum batch size ``max_batch`` (admit FCFS up to it)."""

    def __init__(self, max_batch: int = 64):
        super().__init__()
        self.max_batch = _check_int("max_batch", max_batch)
        self.name = f"continuous B={self.max_batch}"

    def admit(self, now, engine) -> list[int]:
        return self._take(self.max_batch - len(engine.running))
