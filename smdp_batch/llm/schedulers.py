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

__all__ = ["Scheduler", "StaticBatching", "ContinuousFCFS", "MultiBinStatic", "PerBinTables"]


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


class MultiBinStatic(Scheduler):
    """Multi-bin batching (paper 000 Alg. 1) on the LLM engine: requests go to k bins by output length
    (oracle, equal-mass ``edges``), a bin's batch of B runs to completion alone, the first completed
    batch is served first; a bin whose oldest request waited ``max_wait`` s sends a partial batch."""

    def __init__(self, edges, max_batch: int = 32, max_wait: float = 5.0):
        super().__init__()
        self.edges = np.asarray(edges, dtype=np.float64)
        if self.edges.ndim != 1 or self.edges.size < 2 or np.any(np.diff(self.edges) <= 0):
            raise InputError("bin edges must be an increasing sequence of at least two values")
        self.max_batch = _check_int("max_batch", max_batch)
        if not float(max_wait) > 0:
            raise InputError(f"max_wait must be > 0 s, got {max_wait!r}")
        self.max_wait = float(max_wait)
        self.bins: list[deque] = [deque() for _ in range(self.edges.size - 1)]
        self.name = f"multi-bin k={len(self.bins)} B={self.max_batch}"

    def _bin(self, engine, r) -> int:
        k = len(self.bins)
        return int(min(max(np.searchsorted(self.edges, engine.requests.output[r], side="right") - 1, 0), k - 1))

    def push(self, ids, engine) -> None:
        for r in ids:
            self.bins[self._bin(engine, r)].append(r)

    def push_front(self, ids, engine) -> None:
        for r in reversed(list(ids)):
            self.bins[self._bin(engine, r)].appendleft(r)

    def admit(self, now, engine) -> list[int]:
        if engine.running:
            return []
        arr = engine.requests.arrival
        best, ready = None, np.inf
        for q in self.bins:
            if not q:
                continue
            t = arr[q[self.max_batch - 1]] if len(q) >= self.max_batch else arr[q[0]] + self.max_wait
            if t <= now and t < ready:
                best, ready = q, t
        if best is None:
            return []  # the engine idles until the next arrival or :meth:`wakeup`
        return [best.popleft() for _ in range(min(self.max_batch, len(best)))]

    def wakeup(self, engine) -> float:
        """The earliest timeout of a non-empty bin (s)."""
        arr = engine.requests.arrival
        return min((arr[q[0]] + self.max_wait for q in self.bins if q), default=np.inf)


class PerBinTables(Scheduler):
    """Per-bin SMDP tables (:func:`smdp_batch.llm.perbin.solve_engine_bins`) on the LLM engine: bins by
    output length as :class:`MultiBinStatic`, batches run to completion alone; when the engine is idle
    each bin's table maps its queue length n to a batch size (0 = wait, eq. 30 beyond s_max) and the
    serving bin holding the oldest request goes first.  After the last arrival, waiting bins are
    flushed."""

    def __init__(self, edges, tables):
        super().__init__()
        self.edges = np.asarray(edges, dtype=np.float64)
        self.tables = np.asarray(tables, dtype=np.int64)
        if self.tables.ndim != 2 or self.tables.shape[0] != self.edges.size - 1:
            raise InputError("per-bin tables need one row per bin")
        self.bins = [deque() for _ in range(self.edges.size - 1)]
        self.name = f"per-bin SMDP k={len(self.bins)}"

    _bin = MultiBinStatic._bin
    push = MultiBinStatic.push
    push_front = MultiBinStatic.push_front

    def admit(self, now, engine) -> list[int]:
        if engine.running:
            return []
        top = self.tables.shape[1] - 1
        best, size = None, 0
        for i, q in enumerate(self.bins):
            if not q:
                continue
            a = int(self.tables[i, min(len(q), top)])
            if a <= 0 and engine.arrivals_left == 0:
                a = len(q)  # the stream has ended: serve what is left
            if a > 0 and (best is None or q[0] < best[0]):
                best, size = q, min(a, len(q))
        return [] if best is None else [best.popleft() for _ in range(size)]
