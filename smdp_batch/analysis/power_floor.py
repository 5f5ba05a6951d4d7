"""The least power any batching rule can draw on an arrival stream, and the share of the achievable saving an answer
takes.

Over a run of T ms, c instances that each draw ``P_idle`` W while they run no batch, serving batches B_1, B_2, … (a
batch of n requests served at size b ≥ n, b = n unless the server pads, taking l(b) ms and ζ(b) mJ on average), draw

    P̄ = c·P_idle + (1/T)·Σ_k (ζ(b_k) − P_idle·l(b_k))                                    (W = mJ/ms)
      = c·P_idle + λ·E_r[(ζ(b) − P_idle·l(b))/n],

E_r the average over requests of the batch each rides in (a batch of n requests is n terms of the sum over the λ·T
requests).  So no rule draws less than c·P_idle + λ·E_r[x(r)], x(r) a lower bound on what request r's batch costs
per request.  A latency bound decides how large that batch can be.  A request r that meets a bound D rode in a
batch all of whose requests arrived within w(b) = D − s_min(b) of the first of them (its response is at least the
wait since that first arrival plus the batch's time, which is at least s_min(b): l(b) for deterministic batch times,
0 otherwise).  So its batch holds at most

    M_r(b) = max over arrivals a ∈ [t_r − w(b), t_r] of the number of arrivals in [a, a + w(b)]

requests (r among them), and costs it at least min_b (ζ(b) − P_idle·l(b))/min(b, M_r(b)) (or ζ(b) − P_idle·l(b)
itself where that is negative: a batch of one).  A p-th percentile bound lets the share 1 − p/100 of requests
miss it; those are assumed to be the ones whose bound is the highest, and to ride at the cheapest cost per request
of any batch (``free``: no window).  A bound on the mean leaves out, by Markov's inequality, at most the share 1/k of
requests above k·D; the floor takes the best of k = 1.25 … 10.  With several bounds, the highest of their floors.

**Idle priced at less.**  The instances are busy Σ_k l(b_k) ≤ c·T of the run, so for any P' ≤ ``P_idle``,
P̄ = c·P' + (1/T)·Σ_k (ζ(b_k) − P'·l(b_k)) + (P_idle − P')·(c − Σ_k l(b_k)/T) ≥ c·P' + λ·E_r[(ζ(b) − P'·l(b))/n]: the
floor priced at P' is a bound too.  Where the idle power is high enough that a batch of one costs less than idling
(ζ(b) < P_idle·l(b)), the floor at ``P_idle`` lets every request ride alone, which no instance has the time for; the
floor is the higher of the two at P' = ``P_idle`` and P' = 0.

The floor is computed **on the arrival stream the settings were simulated on** (the SLO search's common random
numbers: a seeded Poisson stream, or the user's trace or MAP sample; its first :data:`FLOOR_REQUESTS` requests), so
it bounds every rule on that stream, whatever its queue discipline, timer or number of instances (contention between
instances is left out: each batch is priced at one instance's l(b) and ζ(b)).  With ``P_idle`` = 0 and no bound it is
λ·min ζ(b)/b, every request at the best energy per request.  The idle power moves the floor, and with it how much there
is to save against a default rule: that is why every answer states the idle power it used.

:func:`captured_share` is what an answer takes of the saving there is to take against a reference (Triton's
default, say): (P_reference − P_answer)/(P_reference − P_floor).

>>> from smdp_batch.model.problem import BatchingProblem
>>> p = BatchingProblem.basic(rho=0.5)
>>> free = power_floor(p, p.lam, [])[0]            # no bound: every request at ζ(32)/32
>>> abs(free / (p.lam * float(p.energy_mj()[-1]) / 32) - 1) < 0.01   # λ: the stream's own rate
True
>>> power_floor(p, p.lam, [("p99", 12.6)])[0] > free   # a p99 bound keeps batches smaller
True
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel_cache import njit
from ..model.laws import Deterministic
from ..model.problem import BatchingProblem

__all__ = ["FLOOR_REQUESTS", "MARKOV_FACTORS", "captured_share", "poisson_stream", "power_floor"]

#: the most requests the floor prices (the stream's first; the default stream is that long)
FLOOR_REQUESTS = 200_000
#: the k of Markov's inequality a bound on the mean is read at (module doc)
MARKOV_FACTORS = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


def poisson_stream(requests: int = FLOOR_REQUESTS, seed: int = 0) -> np.ndarray:
    """The SLO search's seeded stream of unit-rate arrival times (the same draws its simulations scale to each load)."""
    return np.cumsum(np.random.default_rng(seed).exponential(1.0, int(requests)))


@njit(cache=True, nogil=True)
def _least_costs(t, ws, bs, xs, cost, size):  # pragma: no cover - compiled
    """Per pricing i (a row of ``xs``) and request r of the sorted times ``t`` (ms): ``cost[i, r]`` =
    min_j xs[i, j]/min(bs[j], M_r(ws[j])) (xs[i, j] < 0: xs[i, j]) over the sizes with ws[j] ≥ 0, ``size[i, r]`` the
    bs[j] attaining it; M_r(w) = the most arrivals any [a, a + w] holds, a an arrival in [t_r − w, t_r] (module doc):
    two pointers for the counts, a monotone deque for their running maximum, O(n) a size, shared by the pricings."""
    n = t.size
    k = xs.shape[0]
    count = np.empty(n, np.int64)
    dq = np.empty(n, np.int64)
    for i in range(k):
        for r in range(n):
            cost[i, r] = np.inf
            size[i, r] = 0.0
    for j in range(ws.size):
        w, b = ws[j], bs[j]
        if w < 0.0:
            continue
        windowed = False
        for i in range(k):
            if xs[i, j] < 0.0:  # a batch of one: no window needed
                for r in range(n):
                    if xs[i, j] < cost[i, r]:
                        cost[i, r], size[i, r] = xs[i, j], b
            else:
                windowed = True
        if not windowed:
            continue
        hi = 0
        for a in range(n):  # count[a] = arrivals in [t_a, t_a + w]
            if hi < a:
                hi = a
            while hi + 1 < n and t[hi + 1] <= t[a] + w:
                hi += 1
            count[a] = hi - a + 1
        head = 0
        tail = 0
        for r in range(n):  # the deque holds a's of [t_r − w, t_r] with falling counts
            while tail > head and count[dq[tail - 1]] <= count[r]:
                tail -= 1
            dq[tail] = r
            tail += 1
            while t[dq[head]] < t[r] - w:
                head += 1
            m = count[dq[head]]
            for i in range(k):
                x = xs[i, j]
                if x >= 0.0:
                    c = x / (b if b < m else m)
                    if c < cost[i, r]:
                        cost[i, r], size[i, r] = c, b


def power_floor(problem: BatchingProblem, lam: float, bounds, idle_power_w: float = 0.0,
                unit_arrivals: np.ndarray | None = None) -> tuple[float, int | None]:
    """``(P_floor W, the median size of the batches it prices)`` at ``lam`` requests/ms on ``unit_arrivals`` (a sorted
    unit-rate stream, scaled to ``lam``; default :func:`poisson_stream`), under ``bounds``: ``[(metric, limit ms)]``,
    metric ``"mean"`` or ``"p<q>"`` (module doc).  ``(nan, None)`` when no batch size finishes within a bound."""
    unit = poisson_stream() if unit_arrivals is None else np.asarray(unit_arrivals, dtype=np.float64)
    t = (unit - unit[0]) / lam
    n = min(t.size, FLOOR_REQUESTS)  # the requests priced: the stream's first (a long stream's memory stays bounded)
    rate = (n - 1) / t[n - 1] if n > 1 and t[n - 1] > 0 else lam  # their own rate (requests/ms)
    sizes = np.asarray(problem.batch_sizes, dtype=np.float64)
    lat = np.asarray(problem.latency_ms(), dtype=np.float64)
    cases = [(float(limit), 1.0 - float(m[1:]) / 100.0) for m, limit in bounds if m != "mean"]
    cases += [(k * float(limit), 1.0 / k) for m, limit in bounds if m == "mean" for k in MARKOV_FACTORS]
    s_min = lat if isinstance(problem.service, Deterministic) else np.zeros_like(lat)
    if any(np.all(limit < s_min) for limit, _ in cases):  # no size finishes within a bound
        return math.nan, None
    priced = [float(idle_power_w), *([0.0] if idle_power_w > 0 else [])]  # any P' ≤ P_idle: a bound too
    xs = np.asarray(problem.energy_mj(), dtype=np.float64)[None, :] - np.asarray(priced)[:, None] * lat[None, :]
    frees = []  # per pricing: the cheapest cost per request of any batch (no window), and its size
    for x in xs:
        j = int(np.argmin(np.where(x >= 0, x / sizes, x)))
        frees.append((float(min(x[j] / sizes[j], x[j])), int(sizes[j])))
    at = list(frees)  # per pricing: (E_r of the least cost, the median size it prices); with no bound, ``free``
    for limit, share in cases:
        # the arrivals the first n requests' windows reach (a request's batch lies within the bound of it)
        m = int(np.searchsorted(t, t[n - 1] + limit, side="right"))
        cost, size = np.empty((len(priced), m)), np.empty((len(priced), m))
        _least_costs(t[:m], limit - s_min, sizes, xs, cost, size)
        drop = int(math.floor(share * n))  # the costliest share may miss the bound and ride at ``free``
        for i, (free, _) in enumerate(frees):
            c, z = cost[i, :n], size[i, :n]
            kept = np.argpartition(c, n - drop - 1)[: n - drop] if drop else slice(None)
            mean = (float(np.sum(c[kept])) + drop * free) / n
            if mean > at[i][0]:
                at[i] = (mean, int(np.median(z[kept])))
    floors = [(problem.instances * p + rate * e, b) for p, (e, b) in zip(priced, at)]
    best = max(floors, key=lambda f: f[0])
    return float(best[0]), best[1]


def captured_share(reference_w: float, answer_w: float, floor_w: float) -> float | None:
    """(P_reference − P_answer)/(P_reference − P_floor): the share of the achievable saving the answer takes;
    None where there is nothing to save (the reference at the floor) or a figure is not finite."""
    room = reference_w - floor_w
    if not all(math.isfinite(x) for x in (reference_w, answer_w, floor_w)) or room <= 0:
        return None
    return (reference_w - answer_w) / room
