"""DynamicBatcher: an asyncio batcher in front of any ``infer(batch) -> results`` that follows a table.

Decision epochs are exactly those of paper 004 §IV: a request arriving at an idle server, and a batch
finishing.  At each epoch the batcher looks at the number n of requests waiting and serves the
``table.decide(n)`` oldest ones as one batch (0: wait for the next arrival).  One batch runs at a time
(the paper's single server); requests are served FIFO.  The loop has one decision point, in the spirit
of Ray Serve's ``_BatchQueue``.

Guarantees (tested with 10⁵ requests, random cancellations and injected failures):

* every caller that is not cancelled gets exactly one result or one exception;
* a caller cancelled while waiting leaves the queue at once (it no longer counts in n);
  one cancelled while its batch runs gets nothing, and the others in the batch are unaffected;
* an exception from ``infer``, or a result list of the wrong length, reaches exactly the callers of
  that batch;
* with ``max_wait_ms`` (default None: exactly the table) a request never waits longer than that for
  the table's next epoch: when the oldest request has waited ``max_wait_ms`` while the table says
  wait, the largest allowed batch ≤ n is served (a safety bound for traffic that stops, like
  Triton's max_queue_delay; counted in ``metrics.forced_batches``);
* ``close(drain=True)`` serves everything still queued (full batches, ignoring waits), and
  ``close(drain=False)`` fails the queued callers with :class:`BatcherClosed`; later
  submissions fail with :class:`BatcherClosed`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .table import PolicyTable

__all__ = ["DynamicBatcher", "BatcherClosed", "BatcherMetrics", "batched"]


class BatcherClosed(RuntimeError):
    """The batcher was closed before this request could be served."""


@dataclass
class BatcherMetrics:
    """Counters since start; waits in ms (submit → batch start)."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    batches: int = 0
    batch_sizes: Counter = field(default_factory=Counter)
    total_wait_ms: float = 0.0
    max_wait_ms: float = 0.0
    queue_length: int = 0
    busy: bool = False
    forced_batches: int = 0  # served because the oldest request reached max_wait_ms

    @property
    def mean_wait_ms(self) -> float:
        served = sum(b * c for b, c in self.batch_sizes.items())
        return self.total_wait_ms / served if served else 0.0

    @property
    def mean_batch_size(self) -> float:
        return sum(b * c for b, c in self.batch_sizes.items()) / self.batches if self.batches else 0.0


class _Entry:
    __slots__ = ("item", "future", "t", "taken")

    def __init__(self, item, future, t):
        self.item, self.future, self.t, self.taken = item, future, t, False


class DynamicBatcher:
    """Serve single requests through ``infer(list_of_items) -> list_of_results`` as the table says.

    ``table``: a :class:`PolicyTable`, an :class:`~smdp_batch.runtime.bank.AdaptivePolicy` (told of every
    arrival, in ms), a path to an HDF5 table, or any callable n ↦ b.
    ``infer`` may be ``async def`` or a plain function returning the results (or an awaitable).
    """

    def __init__(self, infer: Callable[[list], Any], table: PolicyTable | str | Callable[[int], int],
                 max_wait_ms: float | None = None):
        if not callable(infer):
            raise TypeError("infer must be callable: infer(list_of_items) -> list_of_results")
        if max_wait_ms is not None and not (max_wait_ms >= 0):
            raise ValueError(f"max_wait_ms must be ≥ 0 or None, got {max_wait_ms!r}")
        self._max_wait_s = None if max_wait_ms is None else float(max_wait_ms) / 1e3
        if isinstance(table, str):
            table = PolicyTable.load(table)
        self._decide = table.decide if hasattr(table, "decide") else table
        self._observe = getattr(table, "observe_arrival", None)
        sizes = getattr(table, "batch_sizes", None)
        self._sizes = sorted(int(b) for b in sizes) if sizes else None
        self.table = table
        self._infer = infer
        self._queue: deque[_Entry] = deque()
        self._waiting = 0  # entries in the queue that are neither cancelled nor taken
        self._arrival = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing: bool | None = None  # None: open; True: drain; False: reject
        self.metrics = BatcherMetrics()

    # ------------------------------------------------------------------ public API
    async def submit(self, item: Any) -> Any:
        """Queue one request and wait for its result (raises what ``infer`` raised for its batch)."""
        if self._closing is not None:
            raise BatcherClosed("the batcher is closed")
        self._ensure_started()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        entry = _Entry(item, fut, time.perf_counter())
        if self._observe is not None:
            self._observe(entry.t * 1e3)
        self._queue.append(entry)
        self._waiting += 1
        self.metrics.submitted += 1
        self.metrics.queue_length = self._waiting
        fut.add_done_callback(functools.partial(self._on_done, entry))
        self._arrival.set()
        return await fut

    async def close(self, drain: bool = True) -> None:
        """Stop accepting requests; serve (drain=True) or fail (drain=False) those still queued."""
        if self._closing is None:
            self._closing = bool(drain)
        if not drain:
            self._reject_queued()
        self._arrival.set()
        if self._task is not None:
            await self._task

    async def __aenter__(self) -> "DynamicBatcher":
        self._ensure_started()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close(drain=True)

    # ------------------------------------------------------------------ internals
    def _ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def _on_done(self, entry: _Entry, fut: asyncio.Future) -> None:
        if fut.cancelled():
            self.metrics.cancelled += 1
            if not entry.taken:  # still queued: it no longer counts
                entry.taken = True
                self._waiting -= 1
                self.metrics.queue_length = self._waiting

    def _take(self, b: int) -> list[_Entry]:
        batch = []
        while len(batch) < b and self._queue:
            e = self._queue.popleft()
            if e.taken:  # cancelled while queued
                continue
            e.taken = True
            batch.append(e)
        self._waiting -= len(batch)
        self.metrics.queue_length = self._waiting
        return batch

    def _reject_queued(self) -> None:
        while self._queue:
            e = self._queue.popleft()
            if not e.taken:
                e.taken = True
                self._waiting -= 1
                if not e.future.done():
                    e.future.set_exception(BatcherClosed("the batcher was closed before this request was served"))
                    self.metrics.failed += 1
        self.metrics.queue_length = self._waiting

    async def _loop(self) -> None:
        while True:
            n = self._waiting
            if n == 0:
                if self._closing is not None:
                    return
                self._arrival.clear()
                await self._arrival.wait()
                continue
            b = int(self._decide(n))
            if b <= 0 or b > n:
                if self._closing is True:  # draining: no more arrivals will come, serve what is left
                    b = n
                elif b > n:
                    raise RuntimeError(f"policy asked for a batch of {b} with only {n} waiting")
                else:
                    forced = await self._wait_for_epoch(n)  # the next decision epoch is the next arrival
                    if not forced:
                        continue
                    b = forced
                    self.metrics.forced_batches += 1
            await self._serve(self._take(b))

    async def _wait_for_epoch(self, n: int) -> int:
        """Wait for the next arrival; with max_wait_ms, return a batch size once the oldest has waited that long."""
        self._arrival.clear()
        if self._max_wait_s is None:
            await self._arrival.wait()
            return 0
        while self._queue and self._queue[0].taken:
            self._queue.popleft()
        left = self._max_wait_s - (time.perf_counter() - self._queue[0].t)
        if left > 0:
            try:
                await asyncio.wait_for(self._arrival.wait(), left)
                return 0
            except asyncio.TimeoutError:
                pass
        n = self._waiting
        if self._sizes is None:
            return n
        fit = [b for b in self._sizes if b <= n]
        return fit[-1] if fit else 0

    async def _serve(self, batch: list[_Entry]) -> None:
        if not batch:
            return
        now = time.perf_counter()
        m = self.metrics
        m.batches += 1
        m.batch_sizes[len(batch)] += 1
        for e in batch:
            w = (now - e.t) * 1e3
            m.total_wait_ms += w
            m.max_wait_ms = max(m.max_wait_ms, w)
        m.busy = True
        try:
            out = self._infer([e.item for e in batch])
            if inspect.isawaitable(out):
                out = await out
            results = list(out)
            if len(results) != len(batch):
                raise ValueError(f"infer returned {len(results)} results for a batch of {len(batch)}")
        except asyncio.CancelledError:
            for e in batch:
                if not e.future.done():
                    e.future.set_exception(BatcherClosed("the batcher's task was cancelled"))
            raise
        except Exception as exc:  # reaches exactly this batch's callers
            for e in batch:
                if not e.future.done():
                    e.future.set_exception(exc)
                    m.failed += 1
        else:
            for e, r in zip(batch, results):
                if not e.future.done():
                    e.future.set_result(r)
                    m.completed += 1
        finally:
            m.busy = False


def batched(table: PolicyTable | str | Callable[[int], int]):
    """Decorator like Ray Serve's ``@serve.batch``: ``async def f(items: list) -> list`` becomes
    ``async def f(item) -> result`` served by a :class:`DynamicBatcher` following ``table``.

    One batcher per event loop (created on first call); ``f.batcher`` is the current one.
    """

    def wrap(func: Callable[[list], Awaitable[list]]):
        batchers: dict[int, DynamicBatcher] = {}

        @functools.wraps(func)
        async def single(item):
            loop = asyncio.get_running_loop()
            bt = batchers.get(id(loop))
            if bt is None:
                bt = batchers[id(loop)] = DynamicBatcher(func, table)
                single.batcher = bt
            return await bt.submit(item)

        single.batcher = None
        return single

    return wrap
