"""DynamicBatcher: an asyncio batcher in front of any ``infer(batch) -> results`` that follows a table.

Decision epochs are exactly those of paper 004 §IV: a request arriving at an idle server, and a batch
finishing.  At each epoch the batcher looks at the number n of requests waiting and serves the
``table.decide(n)`` oldest ones as one batch (0: wait for the next arrival).  One batch runs at a time
(the paper's single server); requests are served FIFO.  With ``instances=c`` (c model instances behind the one
queue, as Triton's instance_group and TF-Serving's batch threads run them) up to c batches run at once: a
decision is made whenever an instance is free — at an arrival, and at a batch's end — exactly as
``simulate --instances c`` models it; a busy-aware c-server table (``table.busy_table``) is asked
``decide_busy(n, k)`` with k the batches running.  The loop has one decision point, in the spirit
of Ray Serve's ``_BatchQueue``, and every pass through it either serves a non-empty batch or awaits an
arrival or a timer: it never spins.

Guarantees (tested with 10⁵ requests, random cancellations and injected failures, and with every fault
class below):

* every submitted request ends with exactly one outcome: its result, one exception, or its caller's
  cancellation;
* a caller cancelled while waiting leaves the queue at once (it no longer counts in n; its entry is
  dropped lazily, so the queue holds at most 2·n + 32 entries); one cancelled while its batch runs
  gets nothing, and the others in the batch are unaffected;
* ``infer`` returns a sized sequence with one result per item, in order (a list, tuple, numpy array, or
  anything with ``__len__`` and ``__getitem__`` but not a str, bytes, dict or set;
  :func:`~smdp_batch.runtime.guard.batch_results`); its length is checked before it is read, so a generator
  or an endless iterator is refused, not consumed.  An exception from ``infer``, or a result of the wrong kind (``TypeError``) or
  length (``ValueError``), reaches exactly the callers of that batch;
* a *fault* — ``infer`` raising a ``BaseException`` that is not an ``Exception`` (``CancelledError``,
  ``KeyboardInterrupt``, …), the decision callable raising or returning an impossible batch (not an
  int, < 0, > n), or the batcher's task being cancelled while requests are pending — stops the batcher: the running batch and
  every queued request fail with :class:`BatcherBroken` (its ``__cause__`` is the fault), later
  submissions fail with it at once, and ``close()`` returns without raising.  ``KeyboardInterrupt``
  and ``SystemExit`` are re-raised after that, so that they still stop the program, and a
  ``CancelledError`` ends the batcher's task cancelled;
* a safety bound ``max_wait_ms`` (default ``"auto"``: :func:`default_max_wait_ms`) caps how long the
  oldest request waits while the table says wait: then the largest allowed batch ≤ n is served
  (a *forced* batch, counted in ``metrics.forced_batches``, like Triton's max_queue_delay).  When
  fewer than the smallest allowed batch size are waiting, ``short_batch`` decides: ``"serve"``
  (default) serves them as a smaller batch, ``"pad"`` pads the batch to the smallest allowed size
  with ``pad_item`` (the pads' results are dropped), ``"wait"`` waits for the next arrival (no timer,
  no spinning; such requests may wait for ever if traffic stops).  ``"pad-up"`` changes every forced
  batch: it takes min(n, largest size) requests and pads them up to the next allowed size — Triton's
  rule on a model with padded profiles (the SLO search tries both forms).  ``max_wait_ms=None`` (or ``inf``)
  follows the table exactly: a request below the table's limit then waits for the next arrival;
* ``close(drain=True)`` serves everything still queued (ignoring waits; short batches as
  ``short_batch`` says, and with ``"wait"`` a remainder below the smallest size fails with
  :class:`BatcherClosed`).  ``close(drain=False)`` fails the queued callers *and the running batch's*
  with :class:`BatcherClosed` at once and returns without waiting for ``infer`` (an ``async`` call is
  cancelled; one that ignores cancellation, or a plain infer blocked in its thread, is abandoned and its
  result dropped); it also ends a drain in progress.  Later submissions fail with :class:`BatcherClosed`.
  Awaited from the batcher's own ``infer`` (or a task or thread it started), ``close()`` does not wait for
  that ``infer``: it closes as ``drain`` says and returns (what is queued is drained after this batch);
* ``batch_timeout_s`` bounds each ``infer`` call: a batch still running then fails its callers with
  ``TimeoutError`` (``metrics.timed_out_batches``), its call is cancelled or abandoned as above, and the
  batcher goes on (an abandoned call that ignores cancellation may run beside the next).  By default it is
  :data:`DEFAULT_BATCH_TIMEOUT_S` (5 minutes), so an ``infer`` that hangs still gives every request an
  outcome; ``batch_timeout_s=None`` lifts it;
* a plain (non-``async``) ``infer`` runs in a worker thread (:class:`~smdp_batch.runtime.guard.InferWorker`),
  so the event loop keeps accepting requests; ``infer_thread=False`` calls it on the loop;
* a policy whose decision changes with time alone (a :class:`~smdp_batch.runtime.phase.PhasePolicy`:
  silence moves its phase belief) is asked again while requests wait, when its ``next_decision_ms(n, t_ms)``
  says, so a burst's last requests are served when the belief says serve, not at the safety bound (never
  sooner than 1 ms, backing off to 0.1 s while it answers "now" or a past time: no busy loop);
* the batcher's clock never steps back (a step back counts as zero elapsed time);
* after its event loop stopped (``asyncio.run`` twice), a batcher rebinds to the new loop; requests left
  on the old one fail with :class:`BatcherClosed`.  From a second loop while the first runs (two threads)
  it raises ``RuntimeError``: one batcher per loop (:func:`batched` makes one per loop).  Its task
  cancelled with no request pending (``asyncio.run`` at exit) is a clean stop: the next submit restarts it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import math
import numbers
import os
import time
from collections import deque
from typing import Any, Callable

from .batcher_types import BatcherBroken, BatcherClosed, BatcherMetrics
from .bound import BOUND_EPS, BOUND_SAFETY, FALLBACK_MAX_WAIT_MS, default_max_wait_ms, erlang_quantile_ms
from .guard import (InferWorker, batch_results, call_marked, check_max_wait_ms, check_timeout_s, inside_infer,
                    redecide_delay, running_infer)
from .table import PolicyTable

__all__ = ["DynamicBatcher", "BatcherClosed", "BatcherBroken", "BatcherMetrics",
           "default_max_wait_ms", "erlang_quantile_ms", "FALLBACK_MAX_WAIT_MS", "BOUND_EPS", "BOUND_SAFETY"]

_SHORT = ("serve", "pad", "wait", "pad-up")
#: The longest one ``infer`` call may run unless the batcher is told otherwise (s): a hung model still gives
#: every request an outcome (``TimeoutError``) instead of leaving it pending for ever.  ``batch_timeout_s=None``
#: lifts it (an LLM batch that may run for minutes, say).
DEFAULT_BATCH_TIMEOUT_S = 300.0
_EARLY_S = 1e-4  # asyncio may run a timer up to its clock resolution early: treat that as due


def _is_async(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    # an instance whose __call__ is async (B004: the method itself is wanted, not a callable test)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _settle(waiter: asyncio.Future, how: str) -> None:
    if not waiter.done():
        waiter.set_result(how)


class _Entry:
    __slots__ = ("item", "future", "t", "taken")

    def __init__(self, item, future, t):
        self.item, self.future, self.t, self.taken = item, future, t, False


class _Fault(Exception):
    """The decision callable misbehaved (raised, or returned an impossible batch)."""


class DynamicBatcher:
    """Serve single requests through ``infer(list_of_items) -> list_of_results`` as the table says.

    ``table``: a :class:`PolicyTable`, an :class:`~smdp_batch.runtime.bank.AdaptivePolicy` (told of every
    arrival, in ms), a :class:`~smdp_batch.runtime.phase.PhasePolicy`, a path to an HDF5 table, or any
    callable n ↦ b (must return an int in 0..n).  A table with ``observe_batch(b, seconds, ok)`` (an Autopilot) is told of
    every executed batch, and with ``observe_response(ms_list)`` of its requests' response times (ms).
    ``infer`` may be ``async def`` or a plain function returning the results (or an awaitable); a plain one
    runs in a worker thread unless ``infer_thread=False``.
    ``max_wait_ms``: the safety bound on the oldest request's wait while the table says wait (ms);
    ``"auto"`` (default) is :func:`default_max_wait_ms` of the table (for an AdaptivePolicy, of its
    current table) at rate ``lam`` (1/ms in [1e-12, 1e12], default the table's λ); ``None`` or ``math.inf``:
    no bound.  ``short_batch``: ``"serve"``, ``"pad"`` (with ``pad_item``) or ``"wait"``, for a forced or
    drained batch with fewer requests than the smallest allowed batch size; ``"pad-up"`` (with ``pad_item``):
    every forced batch takes up to the largest size and pads to the next allowed one (module docstring).
    ``batch_timeout_s``: the longest one ``infer`` call may run (seconds, > 0; default
    :data:`DEFAULT_BATCH_TIMEOUT_S`; None: no limit); its callers then get ``TimeoutError`` and the batcher goes on.  ``instances``: how many batches may run at once (model
    instances, 1..64; a plain infer then gets one worker thread per instance); every guarantee above holds
    for each batch, and a fault in any one stops the batcher.
    """

    def __init__(self, infer: Callable[[list], Any], table: PolicyTable | str | os.PathLike | Callable[[int], int],
                 max_wait_ms: float | str | None = "auto", *, lam: float | None = None,
                 short_batch: str = "serve", pad_item: Any = None, batch_timeout_s: float | str | None = "default",
                 infer_thread: bool = True, instances: int = 1):
        count: Any = instances  # an int, a numpy integer, or anything else (refused)
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 1 <= int(count) <= 64:
            raise ValueError(f"instances must be an integer in 1..64 (model instances serving the queue), got {instances!r}")
        if not callable(infer):
            raise TypeError("infer must be callable: infer(list_of_items) -> list_of_results")
        if isinstance(table, (str, os.PathLike)):
            table = PolicyTable.load(table)
        if not (callable(table) or callable(getattr(table, "decide", None))):
            raise TypeError("table must be a PolicyTable, an AdaptivePolicy, a PhasePolicy, a path or a callable n -> b")
        solved_for = getattr(table, "instances", 1)  # a c-server table knows the count it was solved for
        if isinstance(solved_for, int) and solved_for > 1 and solved_for != int(count):
            raise ValueError(f"this table was solved for {solved_for} instances sharing the queue; pass "
                             f"instances={solved_for} (got {int(count)})")
        if short_batch not in _SHORT:
            raise ValueError(f"short_batch must be one of {_SHORT}, got {short_batch!r}")
        default_max_wait_ms(table, lam)  # checks lam
        self._fixed_wait_s = check_max_wait_ms(max_wait_ms)  # None: "auto"
        self.batch_timeout_s = check_timeout_s(DEFAULT_BATCH_TIMEOUT_S if isinstance(batch_timeout_s, str)
                                               and batch_timeout_s == "default" else batch_timeout_s, "batch_timeout_s")
        if not isinstance(infer_thread, bool):
            raise TypeError(f"infer_thread must be True or False, got {infer_thread!r}")
        # any object with a decide method (AdaptivePolicy, PhasePolicy) is taken: mypy cannot narrow on callable()
        self._decide: Callable[[int], int] = table.decide if callable(getattr(table, "decide", None)) else table  # type: ignore[union-attr, assignment]
        busy = getattr(table, "decide_busy", None)  # a busy-aware c-server table: sees the batches running too
        rows = getattr(table, "busy_table", None)
        self._decide_busy: Callable[[int, int], int] | None = None
        if callable(busy) and rows is not None:
            if len(rows) != int(count):
                raise ValueError(f"this busy-aware table has a row per busy count 0..{len(rows) - 1}; pass "
                                 f"instances={len(rows)} (got {int(count)})")
            self._decide_busy = busy
        self._observe = getattr(table, "observe_arrival", None)
        redecide = getattr(table, "next_decision_ms", None)
        self._redecide = redecide if callable(redecide) else None
        self._soon = 0  # re-decision times in a row that were not ahead (redecide_delay backs off)
        self._hooks = (getattr(table, "observe_batch", None), getattr(table, "observe_response", None))  # Autopilot
        self.table = table
        self.lam = lam
        self.short_batch = short_batch
        self.pad_item = pad_item
        self._auto_cache: dict[int, tuple[Any, float]] = {}
        self._infer = infer
        self._threaded = infer_thread and not _is_async(infer)
        self.instances = int(count)
        self._workers = [InferWorker() for _ in range(self.instances)] if self._threaded else []  # one per instance
        self._queue: deque[_Entry] = deque()
        self._waiting = 0  # entries in the queue that are neither cancelled nor taken
        self._dead = 0  # cancelled entries still in the queue (dropped lazily)
        self._running: dict[int, tuple[list[_Entry], asyncio.Future]] = {}  # batches running: entries, waiter
        self._ids = itertools.count()
        self._batch_tasks: set[asyncio.Task] = set()  # with several instances: the batches running beside the loop
        self._fault: BaseException | None = None  # a fault raised in such a batch, for the loop to raise
        self._evloop: asyncio.AbstractEventLoop | None = None
        self._arrival = asyncio.Event()  # an arrival, close(), or (several instances) a batch ending
        self._task: asyncio.Task | None = None
        self._clock = 0.0  # the latest time read (s): the batcher's clock never steps back
        self._closing: bool | None = None  # None: open; True: drain; False: reject
        self._broken: BaseException | None = None
        self.metrics = BatcherMetrics()

    # ------------------------------------------------------------------ public API
    @property
    def max_wait_ms(self) -> float | None:
        """The safety bound now in force (ms), or None for none."""
        s = self._bound_s()
        return None if s == math.inf else s * 1e3

    @property
    def broken(self) -> BaseException | None:
        """The fault that stopped the batcher, or None."""
        return self._broken

    async def submit(self, item: Any) -> Any:
        """Queue one request and wait for its result (raises what ``infer`` raised for its batch,
        ``TimeoutError`` after ``batch_timeout_s``, :class:`BatcherClosed` after ``close()``,
        :class:`BatcherBroken` after a fault)."""
        loop = asyncio.get_running_loop()
        self._bind(loop)
        self._refuse_if_stopped()
        self._ensure_started(loop)
        fut = loop.create_future()
        entry = _Entry(item, fut, self._now())
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
        """Stop accepting requests; serve (drain=True) or fail (drain=False) those still queued.

        ``drain=False`` also fails the running batch's callers at once and returns without waiting for its
        ``infer`` call (cancelled, or abandoned if it does not stop); it ends a drain in progress too.
        Awaited from this batcher's own ``infer``, it closes as ``drain`` says and returns at once.
        Never raises the fault that broke the batcher (see :attr:`broken`)."""
        self._bind(asyncio.get_running_loop())
        if self._closing is None or not drain:
            self._closing = bool(drain)
        if not drain:
            self._reject_queued(BatcherClosed("the batcher was closed before this request was served"))
            for e in self._inflight:
                self._fail(e, BatcherClosed("the batcher was closed (drain=False) while this request's batch ran"))
            for _, waiter in list(self._running.values()):
                _settle(waiter, "closed")
        self._arrival.set()
        task = self._task
        if inside_infer(self):  # from this batcher's own infer: the batch cannot end before close() returns
            return
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: a fault is reported through ``broken``, not re-raised

    async def __aenter__(self) -> "DynamicBatcher":
        loop = asyncio.get_running_loop()
        self._bind(loop)
        self._refuse_if_stopped()
        self._ensure_started(loop)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close(drain=True)

    # ------------------------------------------------------------------ internals
    def _refuse_if_stopped(self) -> None:
        if self._broken is not None:
            raise BatcherBroken(f"the batcher stopped on a fault: {self._broken!r}") from self._broken
        if self._closing is not None:
            raise BatcherClosed("the batcher is closed")

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve ``loop``: on a change of loop, drop what was left on the previous one (which must have stopped)."""
        old = self._evloop
        if old is loop:
            return
        if old is not None and not old.is_closed() and old.is_running():
            raise RuntimeError("this DynamicBatcher is serving another running event loop; "
                               "create one batcher per event loop (batched() does)")
        left = [e for e in self._queue if not e.taken] + self._inflight
        self._queue, self._waiting, self._dead = deque(), 0, 0
        self._running, self._batch_tasks, self._fault = {}, set(), None
        if self._threaded:  # a batch cut off with the old loop kept its worker: a full set for the new one
            self._workers = [InferWorker() for _ in range(self.instances)]
        for e in left:
            try:
                self._fail(e, BatcherClosed("the event loop of this request stopped before it was served"))
            except RuntimeError:  # its loop is closed: nobody can wait for it any more
                pass
        self._evloop, self._task = loop, None
        self._arrival = asyncio.Event()
        if isinstance(self._broken, asyncio.CancelledError):  # the old loop cancelled the task: not a fault here
            self._broken = None
        self.metrics.queue_length, self.metrics.busy = 0, False

    def _ensure_started(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None:
            self._task = loop.create_task(self._run())

    def _now(self) -> float:
        """time.monotonic() (s), never earlier than a time read before."""
        t = time.monotonic()
        if t < self._clock:
            return self._clock
        self._clock = t
        return t

    def _bound_s(self) -> float:
        if self._fixed_wait_s is not None:
            return self._fixed_wait_s
        table = self.table if hasattr(self.table, "phase_table") else getattr(self.table, "table", self.table)
        hit = self._auto_cache.get(id(table))
        if hit is None or hit[0] is not table:
            hit = self._auto_cache[id(table)] = (table, default_max_wait_ms(table, self.lam) / 1e3)
        return hit[1]

    def _sizes(self) -> list[int] | None:
        sizes = getattr(self.table, "batch_sizes", None)
        return sorted(int(b) for b in sizes) if sizes else None

    @property
    def _inflight(self) -> list[_Entry]:
        """The requests of every batch running."""
        return [e for batch, _ in self._running.values() for e in batch]

    def _on_done(self, entry: _Entry, fut: asyncio.Future) -> None:
        if fut.cancelled():
            self.metrics.cancelled += 1
            if not entry.taken:  # still queued: it no longer counts, and is dropped lazily
                entry.taken = True
                self._waiting -= 1
                self._dead += 1
                self.metrics.queue_length = self._waiting
                if self._dead > 32 and 2 * self._dead > len(self._queue):
                    self._queue = deque(e for e in self._queue if not e.taken)
                    self._dead = 0

    def _oldest(self) -> _Entry:
        while self._queue[0].taken:  # cancelled while queued
            self._queue.popleft()
            self._dead -= 1
        return self._queue[0]

    def _take(self, b: int) -> list[_Entry]:
        batch: list[_Entry] = []
        while len(batch) < b:
            e = self._queue.popleft()
            if e.taken:  # cancelled while queued
                self._dead -= 1
                continue
            e.taken = True
            batch.append(e)
        self._waiting -= len(batch)
        self.metrics.queue_length = self._waiting
        return batch

    def _reject_queued(self, exc: BaseException) -> None:
        while self._queue:
            e = self._queue.popleft()
            if not e.taken:
                e.taken = True
                self._fail(e, exc)
        self._waiting = self._dead = 0
        self.metrics.queue_length = 0

    def _fail(self, e: _Entry, exc: BaseException) -> None:
        if not e.future.done():
            e.future.set_exception(exc)
            self.metrics.failed += 1

    def _policy_batch(self, n: int) -> int:
        try:
            b = self._decide(n) if self._decide_busy is None else self._decide_busy(n, len(self._running))
        except Exception as exc:
            raise _Fault(f"the policy raised {exc!r} at queue length {n}") from exc
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 0 <= b <= n:
            raise _Fault(f"the policy returned {b!r} at queue length {n}; a batch must be an int in 0..{n}")
        return int(b)

    def _forced_batch(self, n: int) -> tuple[int, int]:
        """(batch, pads) for an epoch where the bound or a drain forces service of n ≥ 1 waiting."""
        sizes = self._sizes()
        if not sizes:
            return n, 0
        if self.short_batch == "pad-up":
            take = min(n, sizes[-1])
            return take, next(b for b in sizes if b >= take) - take
        fit = [b for b in sizes if b <= n]
        if fit:
            return fit[-1], 0
        if self.short_batch == "serve":
            return n, 0
        if self.short_batch == "pad":
            return n, sizes[0] - n
        return 0, 0  # "wait"

    def _wait_s(self, n: int, now: float, delay_s: float | None) -> float | None:
        """How long to await an arrival: ``delay_s`` (None: no timer), or less where the policy says its
        decision changes with time alone (``next_decision_ms``)."""
        if self._redecide is None:
            return delay_s
        try:
            t = self._redecide(n, now * 1e3)
        except Exception as exc:
            raise _Fault(f"the policy's next_decision_ms raised {exc!r} at queue length {n}") from exc
        d, self._soon = redecide_delay(t, now, self._soon)
        if d is None:
            return delay_s
        return d if delay_s is None else min(delay_s, d)

    async def _wake(self, delay_s: float | None) -> None:
        """Wait for the next arrival (or close()), or at most ``delay_s`` seconds."""
        self._arrival.clear()
        timer = None if delay_s is None else asyncio.get_running_loop().call_later(delay_s, self._arrival.set)
        try:
            await self._arrival.wait()
        finally:
            if timer is not None:
                timer.cancel()

    def _pending(self) -> bool:
        return any(not e.future.done() for e in self._inflight) or any(
            not e.taken and not e.future.done() for e in self._queue)

    def _serves(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether ``loop`` is the open loop served now: a task of an earlier or closed loop leaves the state alone."""
        return loop is self._evloop and not loop.is_closed()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self._loop()
        except BaseException as exc:
            if not self._serves(loop):  # its requests were failed when the batcher moved to another loop (_bind)
                raise
            if isinstance(exc, asyncio.CancelledError) and not self._pending():
                if self._task is asyncio.current_task():  # cancelled while idle: a clean stop, restarted on demand
                    self._task = None
                self._running.clear()
                self.metrics.busy = False
                raise
            self._broken = exc
            broken = BatcherBroken(f"the batcher stopped on a fault: {exc!r}")
            broken.__cause__ = exc
            for e in self._inflight:
                self._fail(e, broken)
            for _, waiter in list(self._running.values()):  # batches beside the loop end at once
                _settle(waiter, "closed")
            self._running.clear()
            self._reject_queued(broken)
            self.metrics.busy = False
            if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise  # still stop the program / end the task cancelled (close() does not re-raise it)

    async def _loop(self) -> None:
        while True:
            if self._fault is not None:
                raise self._fault
            n = self._waiting
            if n == 0 or len(self._running) >= self.instances:  # nothing to serve, or no instance free
                if n == 0 and self._closing is not None and not self._running:
                    return
                await self._wake(None)
                continue
            b, pads = self._policy_batch(n), 0
            if b == 0:
                if self._closing is True:  # draining: no more arrivals will come
                    b, pads = self._forced_batch(n)
                    if b == 0:  # short_batch="wait": never a batch below the smallest size
                        self._reject_queued(BatcherClosed(
                            f"closed with {n} request(s) left, fewer than the smallest batch size, "
                            "and short_batch='wait'"))
                        continue
                else:
                    bound = self._bound_s()
                    now = self._now()
                    left = bound - (now - self._oldest().t)
                    if left > _EARLY_S:
                        await self._wake(self._wait_s(n, now, None if bound == math.inf else left))
                        continue
                    b, pads = self._forced_batch(n)
                    if b == 0:  # overdue, but short_batch="wait": the next arrival is the next epoch
                        await self._wake(self._wait_s(n, now, None))
                        continue
                    self.metrics.forced_batches += 1
            run = self._start(self._take(b), pads)
            if self.instances == 1:
                await self._finish(*run)
            else:  # it runs beside the loop, which decides for the next free instance
                task = asyncio.get_running_loop().create_task(self._beside(run))
                self._batch_tasks.add(task)
                task.add_done_callback(self._batch_tasks.discard)

    async def _call(self, loop: asyncio.AbstractEventLoop, items: list, worker: InferWorker | None) -> tuple[bool, Any]:
        """One infer call: (True, results) or (False, what it raised); nothing escapes (the batcher re-raises
        a BaseException that is not an Exception as a fault)."""
        try:
            with running_infer(self):  # close() from within infer does not wait for it
                if worker is not None:
                    ok, out = await worker.run(loop, functools.partial(call_marked, self, self._infer), items)
                    if not ok:
                        return False, out
                else:
                    out = self._infer(items)
                if inspect.isawaitable(out):
                    out = await out
            return True, out
        except BaseException as exc:  # noqa: BLE001 - handed to _serve
            return False, exc

    def _start(self, batch: list[_Entry], pads: int = 0) -> tuple:
        """Start one batch's infer call on a free instance (registered as running before this returns)."""
        now = self._now()
        m = self.metrics
        m.batches += 1
        m.batch_sizes[len(batch)] += 1
        m.padded_batches += pads > 0
        for e in batch:
            w = (now - e.t) * 1e3
            m.total_wait_ms += w
            m.max_wait_ms = max(m.max_wait_ms, w)
        m.busy = True
        loop = asyncio.get_running_loop()
        worker = self._workers.pop() if self._threaded else None
        call = loop.create_task(self._call(loop, [e.item for e in batch] + [self.pad_item] * pads, worker))
        waiter = loop.create_future()
        key = next(self._ids)
        self._running[key] = (batch, waiter)
        call.add_done_callback(lambda _: _settle(waiter, "done"))
        return key, batch, pads, now, call, waiter, worker

    async def _beside(self, run: tuple) -> None:
        """A batch running beside the loop (several instances): a fault in it is handed to the loop."""
        loop = asyncio.get_running_loop()
        try:
            await self._finish(*run)
        except BaseException as exc:  # noqa: BLE001 - a BaseException from infer: the loop raises it (_run)
            if self._fault is None and self._serves(loop):
                self._fault = exc
        finally:
            if self._serves(loop):
                self._arrival.set()  # an instance is free

    async def _finish(self, key: int, batch: list[_Entry], pads: int, now: float, call: asyncio.Task,
                      waiter: asyncio.Future, worker: InferWorker | None) -> None:
        loop = asyncio.get_running_loop()
        timer = None if self.batch_timeout_s is None else loop.call_later(self.batch_timeout_s, _settle, waiter,
                                                                           "timeout")
        m = self.metrics
        try:
            how = await waiter
        finally:  # given up (timed out, closed, or the batcher itself stopping): cancel it, never wait for it
            if self._serves(loop):  # else its loop is gone and the next one got a full set of workers (_bind)
                if timer is not None:
                    timer.cancel()
                if not call.done():
                    call.cancel()
                    worker = InferWorker() if worker is not None else None  # its thread may be blocked for good
                if worker is not None:
                    self._workers.append(worker)
        if how == "done":
            ok, out = call.result()
            if ok:
                try:
                    results = batch_results(out, len(batch) + pads)
                except Exception as exc:
                    ok, out = False, exc
            if not ok and not isinstance(out, Exception):
                raise out  # a BaseException from infer is a fault (_run)
            if ok:
                for e, r in zip(batch, results):
                    if not e.future.done():
                        e.future.set_result(r)
                        m.completed += 1
            else:  # reaches exactly this batch's callers
                for e in batch:
                    self._fail(e, out)
        elif how == "timeout":
            m.timed_out_batches += 1
            err = TimeoutError(f"infer did not return within batch_timeout_s={self.batch_timeout_s:g} s "
                               f"(a batch of {len(batch) + pads})")
            for e in batch:
                self._fail(e, err)
        self._running.pop(key, None)  # how == "closed": close(drain=False) has failed them already
        m.busy = bool(self._running)
        if how != "closed" and callable(self._hooks[0]):  # the measured batch (and its response times, ms)
            end, ok = self._now(), how == "done" and ok
            self._hooks[0](len(batch) + pads, end - now, ok)
            if ok and callable(self._hooks[1]):
                self._hooks[1]([(end - e.t) * 1e3 for e in batch])
