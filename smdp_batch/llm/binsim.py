"""Request-level simulator of multi-bin batching (paper 000 Alg. 1; paper 003 §6.2).

Requests arrive (Poisson with rate λ, or all at once for λ = ∞, or a given array), each with its own
service time; a request goes to the bin of its *predicted* time (the true bin, or a neighbour with
probability ``error`` — paper 003 §6.2's symmetric error model: with probability p the request lands in
one of the adjacent bins, chosen uniformly among those that exist).  A batch's time is the maximum of
its requests' times (Alg. 1 line 10).  Two batching rules:

* **fixed**: a bin emits a batch as soon as it holds B requests ("first completed batch, first
  served"), or — with a finite ``max_wait`` — when its oldest request has waited that long (a partial
  batch, paper 000 §3).  Batches queue FIFO by completion time for ``servers`` identical servers
  (0 = infinitely many, Assumption 5.1).
* **table**: one policy table per bin, n ↦ b (paper 004's SMDP solved per bin, :mod:`.perbin`).
  Whenever a server is free, every bin consults its table with its queue length; among bins whose
  table serves, the one whose oldest request is oldest is served (FIFO across bins).

At the end of the stream, partial batches are served (``flush=True``), so every request completes and
throughput = requests / (last completion − first arrival), as paper 000 measures it ("the time taken to
process all the requests").  Both kernels are numba; a run is a pure function of its seed.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from ..errors import InputError
from ..analysis.simulate import _is_number, poisson_arrivals

__all__ = ["RequestLaw", "parse_request_law", "assign_bins", "perturb_bins", "BinSimResult", "simulate_bins",
           "poisson_times"]


# ----------------------------------------------------------------------------------------- request laws
@dataclass(frozen=True)
class RequestLaw:
    """A request's service-time law: ``uniform`` (lo, hi), ``exp`` (rate μ) or ``empirical`` (values)."""

    kind: str
    params: tuple

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "uniform":
            return rng.uniform(self.params[0], self.params[1], n)
        if self.kind == "exp":
            return rng.exponential(1.0 / self.params[0], n)
        return rng.choice(np.asarray(self.params, dtype=np.float64), n)

    def cdf(self, x: float) -> float:
        if self.kind == "uniform":
            lo, hi = self.params
            return float(min(max((x - lo) / (hi - lo), 0.0), 1.0))
        if self.kind == "exp":
            return float(-math.expm1(-self.params[0] * max(x, 0.0)))
        v = np.sort(np.asarray(self.params, dtype=np.float64))
        return float(np.searchsorted(v, x, side="right") / v.size)

    def quantile(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=np.float64)
        if self.kind == "uniform":
            lo, hi = self.params
            return lo + (hi - lo) * u
        if self.kind == "exp":
            with np.errstate(divide="ignore"):
                return -np.log1p(-u) / self.params[0]
        return np.quantile(np.asarray(self.params, dtype=np.float64), u)

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return 0.5 * (self.params[0] + self.params[1])
        if self.kind == "exp":
            return 1.0 / self.params[0]
        return float(np.mean(self.params))

    def spec(self) -> str:
        if self.kind == "empirical":
            return f"empirical ({len(self.params)} values)"
        return f"{self.kind}:" + ",".join(f"{p:g}" for p in self.params)


def parse_request_law(spec: str) -> RequestLaw:
    """``uniform:LO,HI`` | ``exp:MU`` (rate) | ``trace:FILE[:COLUMN]`` (a CSV column of service times)."""
    if isinstance(spec, RequestLaw):
        return spec
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    kind = kind.lower()
    try:
        if kind == "uniform":
            lo, hi = (float(v) for v in rest.split(","))
            if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
                raise ValueError
            return RequestLaw("uniform", (lo, hi))
        if kind == "exp":
            mu = float(rest)
            if not (math.isfinite(mu) and mu > 0):
                raise ValueError
            return RequestLaw("exp", (mu,))
    except ValueError:
        raise InputError(f"request-time law {text!r}: use uniform:LO,HI with 0 ≤ LO < HI, or exp:MU with rate MU > 0") from None
    if kind == "trace":
        path, _, column = rest.partition(":")
        return RequestLaw("empirical", tuple(_read_column(path, column or None)))
    raise InputError(f"unknown request-time law {text!r}; valid: uniform:LO,HI | exp:MU | trace:FILE[:COLUMN]")


def _read_column(path: str, column: str | None) -> list[float]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise InputError(f"trace {path!r} is empty")
    head = [h.strip() for h in rows[0]]
    col, body = 0, rows
    if column is not None or not _is_number(head[0]):
        name = column or head[0]
        if name not in head:
            raise InputError(f"trace {path!r} has no column {name!r}; columns: {', '.join(head)}")
        col, body = head.index(name), rows[1:]
    vals = []
    for i, r in enumerate(body):
        v = float(r[col]) if col < len(r) and _is_number(r[col]) else math.nan
        if not (math.isfinite(v) and v >= 0):
            raise InputError(f"trace {path!r} row {i + 1}: service time must be a finite number ≥ 0, got {r!r}")
        vals.append(v)
    if not vals:
        raise InputError(f"trace {path!r} has no values")
    return vals


# ----------------------------------------------------------------------------------------- bins
def assign_bins(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of each time: bin i holds edges[i] ≤ t < edges[i+1] (values outside go to the end bins)."""
    e = np.asarray(edges, dtype=np.float64)
    return np.searchsorted(e[1:-1], np.asarray(times, dtype=np.float64), side="right").astype(np.int64)


def perturb_bins(bins: np.ndarray, k: int, error: float, rng: np.random.Generator) -> np.ndarray:
    """Paper 003 §6.2: with probability ``error`` move a request to an adjacent bin (uniformly among
    the neighbours that exist); k = 1 has no neighbour, so nothing moves."""
    p = float(error)
    if not (math.isfinite(p) and 0 <= p <= 1):
        raise InputError(f"prediction error probability must lie in [0, 1], got {error!r}")
    out = np.asarray(bins, dtype=np.int64).copy()
    if k == 1 or p == 0:
        return out
    move = rng.random(out.size) < p
    up = rng.random(out.size) < 0.5
    step = np.where(up, 1, -1)
    step = np.where(out == 0, 1, np.where(out == k - 1, -1, step))
    out[move] += step[move]
    return out


def poisson_times(lam: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n Poisson arrival times with rate λ (λ = ∞: all at time 0)."""
    lam = float(lam)
    if math.isinf(lam) and lam > 0:
        return np.zeros(n)
    if not (math.isfinite(lam) and lam > 0):
        raise InputError(f"arrival rate λ must be > 0 (or inf: all at once), got {lam!r}")
    return poisson_arrivals(lam, n, rng)


# ----------------------------------------------------------------------------------------- kernels
@njit(cache=True)
def _form_fixed(arr, order, starts, B, max_wait, flush_time):
    """Batches of the fixed rule: (member start in ``order``, size, ready time), per bin, in bin order."""
    n = order.size
    bstart = np.empty(n, np.int64)
    bsize = np.empty(n, np.int64)
    bready = np.empty(n)
    nb_ = 0
    for i in range(starts.size - 1):
        j = starts[i]
        end = starts[i + 1]
        while j < end:
            full = j + B - 1
            deadline = arr[order[j]] + max_wait
            if full < end and arr[order[full]] <= deadline:
                size = B
                ready = arr[order[full]]
            else:  # a partial batch: its oldest request times out, or the stream ends
                size = 0
                while j + size < end and size < B and arr[order[j + size]] <= deadline:
                    size += 1
                ready = deadline if j + size < end else min(deadline, flush_time)
            bstart[nb_] = j
            bsize[nb_] = size
            bready[nb_] = ready
            nb_ += 1
            j += size
    return bstart[:nb_], bsize[:nb_], bready[:nb_]


@njit(cache=True)
def _serve_fifo(order, x, bstart, bsize, bready, servers, done):
    """FIFO service of batches (sorted by ready time) on ``servers`` servers (0: infinitely many)."""
    m = bready.size
    idx = np.argsort(bready, kind="mergesort")
    free = np.zeros(max(servers, 1))
    busy = 0.0
    for q in range(m):
        b = idx[q]
        t = 0.0
        for r in range(bsize[b]):
            t = max(t, x[order[bstart[b] + r]])
        start = bready[b]
        if servers > 0:
            s = 0
            for u in range(servers):
                if free[u] < free[s]:
                    s = u
            start = max(start, free[s])
            free[s] = start + t
        busy += t
        for r in range(bsize[b]):
            done[order[bstart[b] + r]] = start + t
    return busy


@njit(cache=True)
def _table_loop(arr, x, bins, order, starts, tables, smax, servers, flush, done, sizes_out):
    """Shared servers, per-bin tables; returns (busy time, number of batches)."""
    n = arr.size
    k = starts.size - 1
    head = starts[:-1].copy()  # next unserved position of each bin in ``order``
    cnt = np.zeros(k, np.int64)  # arrived, unserved
    free = np.zeros(servers)
    nxt = 0
    t = 0.0 if n == 0 else arr[0]
    busy = 0.0
    batches = 0
    served = 0
    while served < n:
        while nxt < n and arr[nxt] <= t:
            cnt[bins[nxt]] += 1
            nxt += 1
        progressed = False
        for s in range(servers):
            if free[s] > t:
                continue
            best = -1
            bsz = 0
            for i in range(k):
                c = cnt[i]
                if c == 0:
                    continue
                a = tables[i, min(c, smax)]
                if a <= 0 and nxt >= n and flush:
                    a = c  # end of stream: serve what is left
                if a <= 0:
                    continue
                if best < 0 or arr[order[head[i]]] < arr[order[head[best]]]:
                    best = i
                    bsz = min(a, c)
            if best < 0:
                break
            t_b = 0.0
            for r in range(bsz):
                t_b = max(t_b, x[order[head[best] + r]])
            for r in range(bsz):
                done[order[head[best] + r]] = t + t_b
            free[s] = t + t_b
            head[best] += bsz
            cnt[best] -= bsz
            served += bsz
            busy += t_b
            sizes_out[batches] = bsz
            batches += 1
            progressed = True
        if progressed:
            continue
        # advance to the next event: an arrival or a server becoming free
        t_next = math.inf
        if nxt < n:
            t_next = arr[nxt]
        for s in range(servers):
            if free[s] > t and free[s] < t_next:
                t_next = free[s]
        if not math.isfinite(t_next):
            break  # nothing will change: the tables wait forever (flush=False)
        t = t_next
    return busy, batches


# ----------------------------------------------------------------------------------------- driver
@dataclass(frozen=True)
class BinSimResult:
    """Outcome of one run: per-request ``latency`` (time units), ``throughput`` (requests per unit),
    ``utilization`` (busy share of the servers, finite servers only), batch count and mean size."""

    latency: np.ndarray
    throughput: float
    utilization: float
    batches: int
    mean_batch: float
    served: int

    @property
    def mean_latency(self) -> float:
        return float(np.mean(self.latency))

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latency, q))

    def slo_attainment(self, slo: float) -> float:
        return float(np.mean(self.latency <= slo))


def simulate_bins(
    arrivals: np.ndarray,
    times: np.ndarray,
    bins: np.ndarray,
    k: int,
    B: int = 128,
    *,
    servers: int = 1,
    max_wait: float = math.inf,
    tables: np.ndarray | None = None,
    flush: bool = True,
    warmup: float = 0.0,
) -> BinSimResult:
    """Serve ``arrivals`` (sorted) with service ``times`` in ``bins`` (0..k−1) under the fixed rule (B,
    ``max_wait``) or per-bin ``tables`` (k × (s_max+1) int: the batch size at queue length n, 0 = wait;
    n > s_max uses row s_max, eq. 30).  ``servers`` = 0 means infinitely many (fixed rule only).
    ``warmup``: share of the first requests left out of the latency statistics."""
    arr = np.ascontiguousarray(arrivals, dtype=np.float64)
    x = np.ascontiguousarray(times, dtype=np.float64)
    bn = np.ascontiguousarray(bins, dtype=np.int64)
    n = arr.size
    if x.shape != arr.shape or bn.shape != arr.shape or n == 0:
        raise InputError("arrivals, times and bins must be non-empty arrays of one length")
    if np.any(np.diff(arr) < 0):
        raise InputError("arrival times must be sorted")
    if np.any(~np.isfinite(x)) or np.any(x < 0):
        raise InputError("service times must be finite and ≥ 0")
    if bn.min() < 0 or bn.max() >= k:
        raise InputError(f"bin indices must lie in 0..{k - 1}")
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 0:
        raise InputError(f"servers must be an integer ≥ 0 (0 = infinitely many), got {servers!r}")
    order = np.argsort(bn, kind="stable")
    starts = np.searchsorted(bn[order], np.arange(k + 1)).astype(np.int64)
    done = np.full(n, np.nan)
    if tables is None:
        if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 1:
            raise InputError(f"batch size B must be an integer ≥ 1, got {B!r}")
        w = float(max_wait)
        if not (w > 0):
            raise InputError(f"max_wait must be > 0 (inf: wait for full batches), got {max_wait!r}")
        flush_time = arr[-1] if flush else math.inf
        bstart, bsize, bready = _form_fixed(arr, order, starts, int(B), w, flush_time)
        keep = np.isfinite(bready)
        busy = _serve_fifo(order, x, bstart[keep], bsize[keep], bready[keep], int(servers), done)
        nbatch, mean_b = int(keep.sum()), float(bsize[keep].mean()) if keep.any() else 0.0
    else:
        tab = np.ascontiguousarray(tables, dtype=np.int64)
        if tab.ndim != 2 or tab.shape[0] != k or tab.shape[1] < 2:
            raise InputError(f"tables must be a k × (s_max+1) integer array with k = {k}")
        if servers < 1:
            raise InputError("per-bin tables need a finite number of servers (≥ 1)")
        sizes = np.zeros(n, np.int64)
        busy, nbatch = _table_loop(arr, x, bn, order, starts, tab, tab.shape[1] - 1, int(servers), bool(flush), done, sizes)
        mean_b = float(sizes[:nbatch].mean()) if nbatch else 0.0
    ok = np.isfinite(done)
    lat = (done - arr)[ok]
    first = int(math.floor(float(warmup) * n))
    lat_stats = (done - arr)[first:][ok[first:]]
    span = float(np.max(done[ok]) - arr[0]) if ok.any() else math.nan
    util = busy / (span * servers) if servers > 0 and span > 0 else math.nan
    return BinSimResult(
        latency=lat_stats if lat_stats.size else lat, throughput=ok.sum() / span if span > 0 else math.inf,
        utilization=float(util), batches=nbatch, mean_batch=mean_b, served=int(ok.sum()),
    )
