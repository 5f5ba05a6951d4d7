"""DynamicBatcher: an asyncio batcher in front of any ``infer(batch) -> results`` that follows a table.

Decision epochs are exactly those of paper 004 §IV: a request arriving at an idle server, and a batch
finishing.  At each epoch the batcher looks at the number n of requests waiting and serves the
``table.decide(n)`` oldest ones as one batch (0: wait for the next arrival).  One batch runs at a time
(the paper's single server); requests are served FIFO.  The loop has one decision point, in the spirit
of Ray Serve's ``_BatchQueue``, and every pass through it either serves a non-empty batch or awaits an
arrival or a timer: it never spins.

Guarantees (tested with 10⁵ requests, random cancellations and injected failures, and with every fault
class below):

* every submitted request ends with exactly one outcome: its result, one exception, or its caller's
  cancellation;
* a caller cancelled while waiting leaves the queue at once (it no longer counts in n; its entry is
  dropped lazily, so the queue holds at most 2·n + 32 entries); one cancelled while its batch runs
  gets nothing, and the others in the batch are unaffected;
* an exception from ``infer``, or a result list of the wrong length, reaches exactly the callers of
  that batch;
* a *fault* — ``infer`` raising a ``BaseException`` that is not an ``Exception`` (``CancelledError``,
  ``KeyboardInterrupt``, …), the decision callable raising or returning an impossible batch (not an
  int, < 0, > n), or the batcher's task being cancelled — stops the batcher: the running batch and
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
  :class:`BatcherClosed`), and ``close(drain=False)`` fails the queued callers with
  :class:`BatcherClosed`; later submissions fail with :class:`BatcherClosed`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import os
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np

from .table import PolicyTable

__all__ = ["DynamicBatcher", "BatcherClosed", "BatcherBroken", "BatcherMetrics", "batched",
           "default_max_wait_ms", "erlang_quantile_ms", "FALLBACK_MAX_WAIT_MS"]

#: Safety bound (ms) when the arrival rate or the table's waiting states are unknown.
FALLBACK_MAX_WAIT_MS = 1000.0
#: The default bound is ``BOUND_SAFETY`` × the (1 − ``BOUND_EPS``) quantile of the fill time.
BOUND_EPS = 1e-6
BOUND_SAFETY = 2.0
_SHORT = ("serve", "pad", "wait", "pad-up")
_EARLY_S = 1e-4  # asyncio may run a timer up to its clock resolution early: treat that as due


class BatcherClosed(RuntimeError):
    """The batcher was closed before this request could be served."""


class BatcherBroken(BatcherClosed):
    """The batcher stopped on a fault (its ``__cause__``); it serves nothing more."""


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
    padded_batches: int = 0  # forced batches padded to the smallest allowed size (short_batch="pad")

    @property
    def mean_wait_ms(self) -> float:
        served = sum(b * c for b, c in self.batch_sizes.items())
        return self.total_wait_ms / served if served else 0.0

    @property
    def mean_batch_size(self) -> float:
        return sum(b * c for b, c in self.batch_sizes.items()) / self.batches if self.batches else 0.0


@functools.lru_cache(maxsize=256)
def erlang_quantile_ms(k: int, lam: float, p: float) -> float:
    """Time t (ms) with P(T_k ≤ t) = p, T_k the time of the k-th arrival of a Poisson stream of rate lam
    (1/ms): T_k ~ Erlang(k, lam), and P(T_k > t) = P(Poisson(lam·t) < k).  Bisection, numpy-free."""
    if k <= 0:
        return 0.0

    def tail(x: float) -> float:  # P(Poisson(x) < k), summed in logs
        if x <= 0:
            return 1.0
        lx = math.log(x)
        logs = [j * lx - x - math.lgamma(j + 1) for j in range(k)]
        top = max(logs)
        return math.exp(top) * math.fsum(math.exp(a - top) for a in logs)

    q = 1.0 - p
    lo, hi = 0.0, float(k)
    while tail(hi) > q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tail(mid) > q else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return hi / lam


def _policy_array(table: Any) -> np.ndarray | None:
    table = getattr(table, "table", table)  # an AdaptivePolicy: its current table
    return table.policy if isinstance(table, PolicyTable) else None


def default_max_wait_ms(table: Any, lam: float | None = None) -> float:
    """The default safety bound (ms) for ``table`` at arrival rate ``lam`` (1/ms; default: the table's λ).

    Let k be the last queue length at which the table waits (for a control-limit table, k = Q − 1).
    Once a request is the oldest waiting, k further arrivals are enough for the table to serve it at the
    next epoch (FIFO: the requests behind it stay queued).  So the bound can fire for it only if those k
    arrivals take longer than the bound: with Poisson arrivals at λ that time is Erlang(k, λ), whatever
    the service times.  The bound is ``BOUND_SAFETY`` (2) × its (1 − ``BOUND_EPS``) = (1 − 10⁻⁶)
    quantile: at the table's λ it fires for far fewer than 10⁻⁶ of the waits, and still for at most
    10⁻⁶ of them if traffic runs at half the table's rate.  It costs one timer per idle wait and
    otherwise nothing.  0 if the table never waits with a request queued.

    A table whose ``meta["max_wait_ms"]`` records its timer (an SLO setting of a λ-bank built by
    :func:`smdp_batch.analysis.bands.slo_bank`) is bounded by that timer instead.

    Without a policy array (a plain callable) or without a rate (a table built in memory with no
    usable ``meta["inputs"]["lam"]`` and no ``lam`` given), the bound is ``FALLBACK_MAX_WAIT_MS`` (1 s):
    long enough for any batch-forming wait at server rates, short enough that traffic that stops
    does not strand requests.  Pass ``max_wait_ms`` for anything else.
    """
    own = getattr(table, "default_max_wait_ms", None)  # a PhasePolicy knows its phases' rates
    meta = getattr(getattr(table, "table", table), "meta", None)
    timer = meta.get("max_wait_ms") if isinstance(meta, dict) else None
    if isinstance(timer, numbers.Real) and not isinstance(timer, bool) and math.isfinite(timer) and timer >= 0:
        return float(timer)  # the table's own timer (an SLO setting, smdp_batch.analysis.bands)
    if callable(own):
        if lam is not None and (isinstance(lam, bool) or not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam > 0)):
            raise ValueError(f"lam must be a finite arrival rate > 0 (1/ms), got {lam!r}")
        return float(own(lam))
    policy = _policy_array(table)
    if lam is not None:
        if isinstance(lam, bool) or not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam > 0):
            raise ValueError(f"lam must be a finite arrival rate > 0 (1/ms), got {lam!r}")
    else:
        lam = getattr(getattr(table, "table", table), "lam", None)
        if lam is not None and not (math.isfinite(lam) and lam > 0):
            lam = None  # a table recording no usable rate: the fallback
    if policy is None or lam is None:
        return FALLBACK_MAX_WAIT_MS
    lam = float(lam)
    k = int(np.nonzero(policy == 0)[0][-1])  # policy[0] = 0 always; policy[s_max] > 0 (validated)
    return BOUND_SAFETY * erlang_quantile_ms(k, lam, 1.0 - BOUND_EPS)


class _Entry:
    __slots__ = ("item", "future", "t", "taken")

    def __init__(self, item, future, t):
        self.item, self.future, self.t, self.taken = item, future, t, False


class _Fault(Exception):
    """The decision callable misbehaved (raised, or returned an impossible batch)."""


class DynamicBatcher:
    """Serve single requests through ``infer(list_of_items) -> list_of_results`` as the table says.

    ``table``: a :class:`PolicyTable`, an :class:`~smdp_batch.runtime.bank.AdaptivePolicy` (told of every
    arrival, in ms), a path to an HDF5 table, or any callable n ↦ b (must return an int in 0..n).
    ``infer`` may be ``async def`` or a plain function returning the results (or an awaitable).
    ``max_wait_ms``: the safety bound on the oldest request's wait while the table says wait (ms);
    ``"auto"`` (default) is :func:`default_max_wait_ms` of the table (for an AdaptivePolicy, of its
    current table) at rate ``lam`` (1/ms, default the table's λ); ``None`` or ``math.inf``: no bound.
    ``short_batch``: ``"serve"``, ``"pad"`` (with ``pad_item``) or ``"wait"``, for a forced or drained
    batch with fewer requests than the smallest allowed batch size; ``"pad-up"`` (with ``pad_item``):
    every forced batch takes up to the largest size and pads to the next allowed one (module docstring).
    """

    def __init__(self, infer: Callable[[list], Any], table: PolicyTable | str | os.PathLike | Callable[[int], int],
                 max_wait_ms: float | str | None = "auto", *, lam: float | None = None,
                 short_batch: str = "serve", pad_item: Any = None):
        if not callable(infer):
            raise TypeError("infer must be callable: infer(list_of_items) -> list_of_results")
        if isinstance(table, (str, os.PathLike)):
            table = PolicyTable.load(table)
        if not (callable(table) or callable(getattr(table, "decide", None))):
            raise TypeError("table must be a PolicyTable, an AdaptivePolicy, a path or a callable n -> b")
        if short_batch not in _SHORT:
            raise ValueError(f"short_batch must be one of {_SHORT}, got {short_batch!r}")
        default_max_wait_ms(table, lam)  # checks lam
        if isinstance(max_wait_ms, str):
            if max_wait_ms != "auto":
                raise ValueError(f"max_wait_ms must be 'auto', a number ≥ 0 (ms), None or inf; got {max_wait_ms!r}")
            self._fixed_wait_s: float | None = None
        elif max_wait_ms is None or (isinstance(max_wait_ms, (int, float)) and max_wait_ms == math.inf):
            self._fixed_wait_s = math.inf
        elif isinstance(max_wait_ms, (int, float)) and not isinstance(max_wait_ms, bool) and max_wait_ms >= 0:
            self._fixed_wait_s = float(max_wait_ms) / 1e3
        else:
            raise ValueError(f"max_wait_ms must be 'auto', a number ≥ 0 (ms), None or inf; got {max_wait_ms!r}")
        self._decide = table.decide if callable(getattr(table, "decide", None)) else table
        self._observe = getattr(table, "observe_arrival", None)
        self.table = table
        self.lam = lam
        self.short_batch = short_batch
        self.pad_item = pad_item
        self._auto_cache: dict[int, tuple[Any, float]] = {}
        self._infer = infer
        self._queue: deque[_Entry] = deque()
        self._waiting = 0  # entries in the queue that are neither cancelled nor taken
        self._dead = 0  # cancelled entries still in the queue (dropped lazily)
        self._inflight: list[_Entry] = []
        self._arrival = asyncio.Event()
        self._task: asyncio.Task | None = None
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
        :class:`BatcherClosed` after ``close()``, :class:`BatcherBroken` after a fault)."""
        self._refuse_if_stopped()
        self._ensure_started()
        fut = asyncio.get_running_loop().create_future()
        entry = _Entry(item, fut, time.monotonic())
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
        Never raises the fault that broke the batcher (see :attr:`broken`)."""
        if self._closing is None:
            self._closing = bool(drain)
        if not drain:
            self._reject_queued(BatcherClosed("the batcher was closed before this request was served"))
        self._arrival.set()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: a fault is reported through ``broken``, not re-raised

    async def __aenter__(self) -> "DynamicBatcher":
        self._refuse_if_stopped()
        self._ensure_started()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close(drain=True)

    # ------------------------------------------------------------------ internals
    def _refuse_if_stopped(self) -> None:
        if self._broken is not None:
            raise BatcherBroken(f"the batcher stopped on a fault: {self._broken!r}") from self._broken
        if self._closing is not None:
            raise BatcherClosed("the batcher is closed")

    def _ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

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
        batch = []
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
            b = self._decide(n)
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

    async def _wake(self, delay_s: float | None) -> None:
        """Wait for the next arrival (or close()), or at most ``delay_s`` seconds."""
        self._arrival.clear()
        timer = None if delay_s is None else asyncio.get_running_loop().call_later(delay_s, self._arrival.set)
        try:
            await self._arrival.wait()
        finally:
            if timer is not None:
                timer.cancel()

    async def _run(self) -> None:
        try:
            await self._loop()
        except BaseException as exc:
            self._broken = exc
            broken = BatcherBroken(f"the batcher stopped on a fault: {exc!r}")
            broken.__cause__ = exc
            for e in self._inflight:
                self._fail(e, broken)
            self._inflight = []
            self._reject_queued(broken)
            self.metrics.busy = False
            if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise  # still stop the program / end the task cancelled (close() does not re-raise it)

    async def _loop(self) -> None:
        while True:
            n = self._waiting
            if n == 0:
                if self._closing is not None:
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
                    left = bound - (time.monotonic() - self._oldest().t)
                    if left > _EARLY_S:
                        await self._wake(None if bound == math.inf else left)
                        continue
                    b, pads = self._forced_batch(n)
                    if b == 0:  # overdue, but short_batch="wait": the next arrival is the next epoch
                        await self._wake(None)
                        continue
                    self.metrics.forced_batches += 1
            await self._serve(self._take(b), pads)

    async def _serve(self, batch: list[_Entry], pads: int = 0) -> None:
        now = time.monotonic()
        m = self.metrics
        m.batches += 1
        m.batch_sizes[len(batch)] += 1
        m.padded_batches += pads > 0
        for e in batch:
            w = (now - e.t) * 1e3
            m.total_wait_ms += w
            m.max_wait_ms = max(m.max_wait_ms, w)
        m.busy = True
        self._inflight = batch
        awaited = False
        try:
            out = self._infer([e.item for e in batch] + [self.pad_item] * pads)
            if inspect.isawaitable(out):
                awaited = True
                out = await out
            results = list(out)
            if len(results) != len(batch) + pads:
                raise ValueError(f"infer returned {len(results)} results for a batch of {len(batch) + pads}")
        except Exception as exc:  # reaches exactly this batch's callers; BaseException is a fault (_run)
            for e in batch:
                self._fail(e, exc)
        else:
            for e, r in zip(batch, results):
                if not e.future.done():
                    e.future.set_result(r)
                    m.completed += 1
        self._inflight = []
        m.busy = False
        if not awaited:  # a plain infer: let callers and arrivals run before the next decision
            await asyncio.sleep(0)


def batched(table: PolicyTable | str | os.PathLike | Callable[[int], int], max_wait_ms: float | str | None = "auto", *,
            lam: float | None = None, short_batch: str = "serve", pad_item: Any = None):
    """Decorator like Ray Serve's ``@serve.batch``: ``async def f(items: list) -> list`` becomes
    ``async def f(item) -> result`` served by a :class:`DynamicBatcher` following ``table``, with the
    same options (``max_wait_ms`` default ``"auto"``, ``lam``, ``short_batch``, ``pad_item``).

    One batcher per event loop (created on first call); ``f.batcher`` is the latest one.
    """
    if isinstance(table, (str, os.PathLike)):
        table = PolicyTable.load(table)
    DynamicBatcher(lambda items: items, table, max_wait_ms, lam=lam, short_batch=short_batch,
                   pad_item=pad_item)  # validate the options now, not at the first request

    def wrap(func: Callable[[list], Awaitable[list]]):
        batchers: dict[int, tuple[asyncio.AbstractEventLoop, DynamicBatcher]] = {}

        @functools.wraps(func)
        async def single(item):
            loop = asyncio.get_running_loop()
            hit = batchers.get(id(loop))
            if hit is None or hit[0] is not loop:
                for key in [k for k, (lp, _) in batchers.items() if lp.is_closed()]:
                    del batchers[key]
                bt = DynamicBatcher(func, table, max_wait_ms, lam=lam, short_batch=short_batch, pad_item=pad_item)
                hit = batchers[id(loop)] = (loop, bt)
                single.batcher = bt
            return await hit[1].submit(item)

        single.batcher = None
        return single

    return wrap
