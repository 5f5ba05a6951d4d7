"""Bounded open-loop load (Poisson or a trace) against a real server, and its comparison with the simulator.

``replay(send, arrivals_ms, scale)`` sends request i at arrivals_ms[i]·scale ms after the start (wall
time; one asyncio task per request, so a slow server never slows the sender down) and records when each
was sent and answered.  Bounded twice: by the number of arrivals and by ``max_seconds`` of wall time.
``send(i)`` is the target's own client call; it returns what the server reported for the request.

While it sends, the process's heap is frozen (:func:`frozen_heap`): a full garbage collection over the libraries'
objects (numba, ray, torch: 0.05-0.2 s) would stop the sender and every answer's timestamp with it, and land in
the measured p99 as if the server had taken it.  ``SMDP_BATCH_LOADGEN_FREEZE_GC=0`` in the environment leaves the
collector alone (to measure what it costs).

``compare(problem, rule, run)`` puts a measured run beside the simulator's prediction for **the same
stream**: the times the requests were actually sent (or, where the server reports it, reached the batcher),
the same rule, the same l(b) and ζ(b).  Both sides are summarised by one function over the same requests
(the first ``warmup`` and last ``cooldown`` shares left out, batches counted when all their requests are
inside): W̄, p95, mean batch size, the batch-size histogram, and P̄ = Σ ζ(executed size) / arrival span.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np

from ..errors import InputError

__all__ = ["Run", "replay", "frozen_heap", "summarise", "compare", "simulated_run", "fit_overhead", "instance_gap", "with_overhead", "send_lag_ms"]


@dataclass
class Run:
    """One measured (or simulated) run, times in model ms from the first arrival.

    ``arrival_ms[i]``: when request i reached the server (as recorded); ``latency_ms[i]``: its response time
    (NaN if unanswered); ``batch_of[i]``: an id shared by the requests of one batch; ``batches``: id →
    (requests, executed size).  ``overhead_ms``: per-request time outside the batcher, if measured.
    """

    arrival_ms: np.ndarray
    latency_ms: np.ndarray
    batch_of: np.ndarray
    batches: dict
    errors: int = 0
    wall_s: float = 0.0
    batch_times: dict = field(default_factory=dict)  # id → (start, end), model ms on the arrivals' clock
    notes: dict = field(default_factory=dict)


FREEZE_ENV = "SMDP_BATCH_LOADGEN_FREEZE_GC"  # "0": replay leaves the collector alone
_HEAP = {"depth": 0, "ours": False}
_HEAP_LOCK = threading.Lock()


@contextlib.contextmanager
def frozen_heap():
    """Within it, the objects alive on entry are left out of Python's garbage collections (``gc.freeze()``, after one
    ``gc.collect()``), and are put back on exit (``gc.unfreeze()``): a bounded load's sender then stops for young
    collections only, not for a full one over every library's objects.  Nested and concurrent uses (threads
    included) share one freeze, undone by the last to leave.  A heap the caller froze already, or a collector it
    disabled, is left as it is; so is every heap with ``SMDP_BATCH_LOADGEN_FREEZE_GC=0`` in the environment."""
    with _HEAP_LOCK:
        if _HEAP["depth"] == 0:
            _HEAP["ours"] = gc.isenabled() and gc.get_freeze_count() == 0 and \
                os.environ.get(FREEZE_ENV, "1").strip() != "0"
            if _HEAP["ours"]:
                gc.collect()
                gc.freeze()
        _HEAP["depth"] += 1
    try:
        yield
    finally:
        with _HEAP_LOCK:
            _HEAP["depth"] -= 1
            if _HEAP["depth"] == 0 and _HEAP["ours"]:
                gc.unfreeze()
                _HEAP["ours"] = False


async def replay(send: Callable[[int], Awaitable[object]], arrivals_ms, scale: float,
                 max_seconds: float = 60.0) -> tuple[np.ndarray, np.ndarray, list, int]:
    """Send request i at arrivals_ms[i]·scale ms (wall) after the start; return (sent_s, done_s, results, errors).

    sent_s / done_s are ``time.time()`` seconds (NaN for unsent or failed requests); results[i] is what
    ``send(i)`` returned (None on error).  Nothing is sent after ``max_seconds``; the whole call waits at most
    ``max_seconds`` + 60 s for answers.
    """
    arr = np.asarray(arrivals_ms, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(np.diff(arr) < 0):
        raise InputError("arrivals must be a non-empty sorted 1-D array of finite times in ms")
    if not (scale > 0 and math.isfinite(scale)):
        raise InputError(f"time scale must be a finite number > 0, got {scale!r}")
    at_s = (arr - arr[0]) * scale / 1000.0
    n = arr.size
    sent = np.full(n, np.nan)
    done = np.full(n, np.nan)
    results: list = [None] * n
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        sent[i] = time.time()
        try:
            results[i] = await send(i)
            done[i] = time.time()
        except Exception:  # noqa: BLE001 - counted; the run goes on
            errors += 1

    tasks = []
    with frozen_heap():
        t0 = time.perf_counter()
        for i in range(n):
            if at_s[i] > max_seconds:
                break
            delay = at_s[i] - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i)))
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=max_seconds + 60.0)
    return sent, done, results, errors


def send_lag_ms(sent_s, arrivals_ms, scale: float) -> np.ndarray:
    """How late each request was sent against its schedule (real ms, the first request's send as time 0; NaN
    where it was not sent): ``replay`` never waits for an answer, so a lag means the client's own loop fell behind
    and the server saw a thinner stream than asked."""
    sent = np.asarray(sent_s, dtype=np.float64)
    arr = np.asarray(arrivals_ms, dtype=np.float64)[: sent.size]
    return (sent - sent[0]) * 1000.0 - (arr - arr[0]) * scale


def simulated_run(problem, rule, arrival_ms: np.ndarray, seed: int = 0) -> Run:
    """The simulator's run of ``rule`` on exactly these arrival times (model ms), as a :class:`Run`."""
    from ..analysis.simulate import response_times
    from ..baselines.servers import ServerRule, table_rule

    rule = rule if isinstance(rule, ServerRule) else table_rule(rule, problem.batch_sizes)
    arr = np.asarray(arrival_ms, dtype=np.float64)
    resp = response_times(problem, rule, arr, seed=seed)
    served = int(np.isfinite(resp).sum())  # FIFO: requests 0..served-1
    done = arr[:served] + resp[:served]
    # a batch's requests are consecutive (FIFO) and complete together; the next batch ends at another time (later
    # on one instance; on several it may end earlier, on another instance)
    batch_of = np.full(arr.size, -1, dtype=np.int64)
    if served:
        starts = np.concatenate(([True], np.abs(np.diff(done)) > 1e-6))
        batch_of[:served] = np.cumsum(starts) - 1
    pad = rule.pad_map(max(rule.max_executed(), problem.bmax) + 1)
    counts = np.bincount(batch_of[:served]) if served else np.zeros(0, dtype=np.int64)
    batches = {int(k): (int(c), int(pad[c])) for k, c in enumerate(counts)}
    return Run(arr - arr[0], resp, batch_of, batches)


def summarise(run: Run, problem, warmup: float = 0.05, cooldown: float = 0.05) -> dict:
    """W̄, p95, p99, mean batch size, histogram and P̄ over the requests [warmup·N, (1 − cooldown)·N)."""
    n = run.arrival_ms.size
    lo, hi = int(warmup * n), n - int(cooldown * n)
    if hi - lo < 10:
        raise InputError(f"{n} requests leave {hi - lo} after the warm-up and cool-down; send more")
    lat = run.latency_ms[lo:hi]
    answered = np.isfinite(lat)
    inside: dict[int, int] = {}
    for i in range(lo, hi):
        k = int(run.batch_of[i])
        if k >= 0:
            inside[k] = inside.get(k, 0) + 1
    full = [k for k, c in inside.items() if c == run.batches[k][0]]  # batches wholly inside the window
    sizes = np.array([run.batches[k][0] for k in full], dtype=np.int64)
    executed = [run.batches[k][1] for k in full]
    energy = dict(zip(problem.batch_sizes, problem.energy_mj()))
    span = float(run.arrival_ms[hi - 1] - run.arrival_ms[lo]) or math.nan
    got = lat[answered]
    return {
        "requests": int(hi - lo), "answered": int(answered.sum()),
        "mean_latency_ms": float(got.mean()) if got.size else math.nan,
        "p95_ms": float(np.percentile(got, 95)) if got.size else math.nan,
        "p99_ms": float(np.percentile(got, 99)) if got.size else math.nan,
        "mean_batch_size": float(sizes.mean()) if sizes.size else math.nan,
        "batch_size_counts": {int(s): int(c) for s, c in zip(*np.unique(sizes, return_counts=True))},
        "mean_power_w": float(sum(energy[s] for s in executed) / span) if executed else math.nan,
        "batches": len(full),
    }


def compare(problem, rule, run: Run, warmup: float = 0.05, cooldown: float = 0.05, seed: int = 0) -> dict:
    """Measured beside simulated (same arrival times, same rule): each metric, both values and their ratio."""
    sim = simulated_run(problem, rule, run.arrival_ms + 1e-9, seed=seed)  # strictly after 0, as the simulator's streams
    m = summarise(run, problem, warmup, cooldown)
    s = summarise(sim, problem, warmup, cooldown)
    out: dict[str, Any] = {"measured": m, "model": s}
    for k in ("mean_latency_ms", "p95_ms", "mean_batch_size", "mean_power_w"):
        out[k.replace("_ms", "").replace("mean_", "") + "_ratio"] = m[k] / s[k] if s[k] else math.nan
    return out


def _first_arrivals(run: Run) -> dict[int, float]:
    """Batch id → the arrival time (model ms) of its first request."""
    first: dict[int, float] = {}
    for i, k in enumerate(run.batch_of):
        if k >= 0 and int(k) not in first:
            first[int(k)] = float(run.arrival_ms[i])
    return first


def fit_overhead(run: Run, problem, scale: float) -> dict:
    """The server's time per batch beyond l(b)·scale, fitted as a + c·b (real ms) over back-to-back batches.

    For consecutive batches k, k+1 where batch k+1's first request had arrived before batch k ended (so the
    instance was never idle), (start of k+1 − start of k) − l(executed size of k)·scale is the time Triton or
    Ray spent on batch k besides the model's own l(b): handing the b responses back, freeing the instance,
    forming and dispatching the next batch.  Least squares over those pairs; ``pairs`` is their number.
    """
    lat = dict(zip(problem.batch_sizes, problem.latency_ms()))
    first = _first_arrivals(run)
    ks = sorted(run.batch_times, key=lambda k: run.batch_times[k][0])
    xs, ys = [], []
    for k0, k1 in zip(ks, ks[1:]):
        s0, e0 = run.batch_times[k0]
        s1, _ = run.batch_times[k1]
        if k1 in first and first[k1] < e0:
            xs.append(run.batches[k0][0])
            ys.append(((s1 - s0) - lat[run.batches[k0][1]]) * scale)
    if len(xs) < 5:
        return {"a_ms": 0.0, "c_ms": 0.0, "pairs": len(xs)}
    A = np.vstack([np.ones(len(xs)), np.asarray(xs, dtype=np.float64)]).T
    (a, c), *_ = np.linalg.lstsq(A, np.asarray(ys), rcond=None)
    return {"a_ms": float(a), "c_ms": float(c), "pairs": len(xs)}


def instance_gap(run: Run, delay_ms: float, margin_ms: float = 1.0) -> dict:
    """The time an instance stays unavailable after each batch while requests wait (model ms): over consecutive
    batches k, k + 1 of one instance (``run.notes["instance"]``) whose first request of k + 1 had been sent more
    than ``delay_ms`` + ``margin_ms`` before batch k ended (so the batcher's delay had run out and the batch
    waited for this instance), the median of (start of k + 1 − end of k): handing back k's responses, freeing
    the instance, forming and dispatching the next batch.  ``pairs`` is their number (0: ``gap_ms`` NaN)."""
    inst = run.notes.get("instance", {})
    first = _first_arrivals(run)
    by: dict[Any, list[int]] = {}
    for k in sorted(run.batch_times, key=lambda k: run.batch_times[k][0]):
        by.setdefault(inst.get(k), []).append(k)
    gaps = [run.batch_times[k1][0] - run.batch_times[k0][1] for ks in by.values() for k0, k1 in zip(ks, ks[1:])
            if k1 in first and first[k1] < run.batch_times[k0][1] - delay_ms - margin_ms]
    return {"gap_ms": float(np.median(gaps)) if gaps else math.nan, "pairs": len(gaps)}


def with_overhead(problem, a_ms: float, c_ms: float, scale: float):
    """``problem`` with l(b) + (a + c·b)/scale: the batch time the server really takes, in model ms."""
    sizes = list(problem.batch_sizes)
    lat: Any = [float(l) + (a_ms + c_ms * b) / scale for b, l in zip(sizes, problem.latency_ms())]
    lat = np.maximum.accumulate(np.maximum(lat, 1e-9))
    # λ only matters for generated arrivals; a given stream is replayed as it is (keep the problem valid)
    lam = min(problem.lam, 0.99 * sizes[-1] / lat[-1])
    return problem.replace(lam=lam, latency="table:" + ",".join(f"{b}={v:.9g}" for b, v in zip(sizes, lat)))
