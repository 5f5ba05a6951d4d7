"""Closed forms of multi-bin batching (paper 000, "Multi-Bin Batching for Increasing LLM Inference
Throughput"; paper 003 is a later version of the same paper).

Requests have i.i.d. service times; requests are put into k bins by (predicted) service time, a batch
is B requests of one bin, and it takes the *maximum* of its requests' times (Alg. 1).

* :func:`uniform_boundaries` — Lemma 4.1, eq. 3: for l ~ U[l_min, l_max] the throughput is largest
  with equal-mass (equal-width) bins.
* :func:`uniform_batch_time`, :func:`uniform_throughput` — eqs. 2, 17–20 and Theorem 4.2 (eq. 4).
* :func:`capacity` — c_max of eq. 5 (k → ∞).
* :func:`bins_for_throughput` — Theorem 4.3, eq. 6: the smallest k with Throughput_k ≥ c_max − ε.
* :func:`uniform_latency` — Lemma 5.1, eq. 7: mean latency with infinitely many servers.
* :func:`exponential_boundaries`, :func:`exponential_throughput_bound` — Lemma A.1 (eqs. 27–29) and
  Corollary A.1.1 for l ~ Exp(μ).
* :func:`batch_time`, :func:`throughput` — the same quantities for *any* continuous law and any
  boundaries, by quadrature of E[max] = a + ∫_a^b (1 − F_i(x)^B) dx per bin: the independent check
  of the closed forms, and the route for laws the paper does not treat.

Two findings, pinned by tests (``tests/test_multibin.py``):

* Eq. 8 prints E[max | bin i] = B/(B+1)·l_{i−1} + 1/(B+1)·l_i; the maximum of B uniforms on
  [l_{i−1}, l_i] has mean 1/(B+1)·l_{i−1} + B/(B+1)·l_i, as eq. 17 (and Thm 4.2) use.  The
  derivative eq. 12, hence Lemma 4.1, is the same for both.
* Eq. 60 (Corollary A.1.1) indexes the boundary sums as Σ_j log L_{k−1−j}, which reaches the
  undefined L_0 at j = k−1.  Substituting eq. 28's boundaries (Σ_j log L_{k−j}) into eq. 27 gives
  the bound; :func:`exponential_throughput_bound` does that.

Times are in the caller's unit (the paper: seconds); throughput is requests per time unit.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import integrate

from ..errors import InputError

__all__ = [
    "uniform_boundaries", "uniform_batch_time", "uniform_throughput", "capacity", "bins_for_throughput",
    "uniform_latency", "exponential_boundaries", "exponential_bound_terms", "exponential_throughput_bound",
    "batch_time", "throughput", "quantile_boundaries", "harmonic", "toy_makespan",
]


def _check_B(B) -> int:
    if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 1:
        raise InputError(f"batch size B must be an integer ≥ 1, got {B!r}")
    return int(B)


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"number of bins k must be an integer ≥ 1, got {k!r}")
    return int(k)


def _check_range(lmin, lmax) -> tuple[float, float]:
    lo, hi = float(lmin), float(lmax)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise InputError(f"service-time range needs 0 ≤ l_min < l_max (finite), got l_min={lmin!r}, l_max={lmax!r}")
    return lo, hi


# ----------------------------------------------------------------------------------------- uniform
def uniform_boundaries(k: int, lmin: float, lmax: float) -> np.ndarray:
    """Lemma 4.1, eq. 3: the k+1 bin edges l_i = l_min + (i/k)(l_max − l_min), i = 0..k."""
    k = _check_k(k)
    lo, hi = _check_range(lmin, lmax)
    return lo + (hi - lo) * np.arange(k + 1, dtype=np.float64) / k


def uniform_batch_time(k: int, B: int, lmin: float, lmax: float) -> float:
    """E[t_service,k] of eq. 20: mean batch time with k equal-mass bins, l ~ U[l_min, l_max]."""
    k, B = _check_k(k), _check_B(B)
    lo, hi = _check_range(lmin, lmax)
    mid = 0.5 * (lo + hi)
    return mid + (B / (B + 1.0) * hi + lo / (B + 1.0) - mid) / k


def uniform_throughput(k: int, B: int, lmin: float, lmax: float) -> float:
    """Theorem 4.2, eq. 4: B / E[t_service,k] (requests per time unit, one server, saturated)."""
    return _check_B(B) / uniform_batch_time(k, B, lmin, lmax)


def capacity(B: int, lmin: float, lmax: float) -> float:
    """c_max of eq. 5: B / ((l_max + l_min)/2), the k → ∞ limit of Theorem 4.2."""
    B = _check_B(B)
    lo, hi = _check_range(lmin, lmax)
    return B / (0.5 * (lo + hi))


def bins_for_throughput(eps: float, B: int, lmin: float, lmax: float) -> int:
    """Theorem 4.3, eq. 6: the smallest integer k with Throughput_k ≥ c_max − ε (0 < ε < c_max)."""
    B = _check_B(B)
    lo, hi = _check_range(lmin, lmax)
    c = capacity(B, lo, hi)
    e = float(eps)
    if not (math.isfinite(e) and 0 < e < c):
        raise InputError(f"ε must lie in (0, c_max = {c:.6g}), got {eps!r}")
    mid = 0.5 * (lo + hi)
    gap = B / (B + 1.0) * hi + lo / (B + 1.0) - mid
    k = max(1, math.ceil((c - e) * gap / (e * mid) - 1e-12))
    # eq. 6 is exact algebra; guard the ceiling against rounding at an integer boundary
    while k > 1 and uniform_throughput(k - 1, B, lo, hi) >= c - e:
        k -= 1
    while uniform_throughput(k, B, lo, hi) < c - e:
        k += 1
    return k


def uniform_latency(lam: float, k: int, B: int, lmin: float, lmax: float) -> float:
    """Lemma 5.1, eq. 7: mean latency with infinitely many servers, E[t_batch] + E[t_service,k].

    E[t_batch] = (B − 1)·k / (2λ) (eq. 64): each bin fills at rate λ/k.  A lower bound for finitely
    many servers (Remark 5.1), close at low load.
    """
    lam_v = float(lam)
    if not (math.isfinite(lam_v) and lam_v > 0):
        raise InputError(f"arrival rate λ must be finite and > 0, got {lam!r}")
    return uniform_batch_time(k, B, lmin, lmax) + (_check_B(B) - 1.0) * _check_k(k) / (2.0 * lam_v)


# ----------------------------------------------------------------------------------------- exponential
def harmonic(B: int) -> float:
    """H_B = Σ_{j≤B} 1/j (E[max of B Exp(1)] = H_B)."""
    return float(np.sum(1.0 / np.arange(1, _check_B(B) + 1, dtype=np.float64)))


def _L(k: int, B: int) -> np.ndarray:
    """L_m of eq. 29 for m = 0..k−1 (entry 0 unused): L_1 = H_B, L_m = 1 + log L_{m−1}."""
    L = np.zeros(max(k, 2))
    L[1] = harmonic(B)
    for m in range(2, k):
        L[m] = 1.0 + math.log(L[m - 1])
    return L


def exponential_boundaries(k: int, B: int, mu: float) -> np.ndarray:
    """Lemma A.1, eq. 28: edges 0 = l_0 < l_1 < … < l_{k−1} < l_k = ∞ minimising the bound eq. 27,
    l_i = (1/μ) Σ_{j≤i} log L_{k−j}."""
    k, B = _check_k(k), _check_B(B)
    mu_v = float(mu)
    if not (math.isfinite(mu_v) and mu_v > 0):
        raise InputError(f"exponential rate μ must be finite and > 0, got {mu!r}")
    L = _L(k, B)
    edges = np.zeros(k + 1)
    for i in range(1, k):
        edges[i] = edges[i - 1] + math.log(L[k - i]) / mu_v
    edges[k] = math.inf
    return edges


def exponential_bound_terms(edges: Sequence[float] | np.ndarray, B: int, mu: float) -> float:
    """The right side of eq. 27 for any edges 0 = l_0 < … < l_{k−1}, l_k = ∞: Σ_{i<k} P(bin i)·l_i +
    P(bin k)·(l_{k−1} + H_B/μ), an upper bound on E[t_service,k]."""
    B = _check_B(B)
    e = np.asarray(edges, dtype=np.float64)
    mu = float(mu)
    k = e.size - 1
    q = np.exp(-mu * e[:k])  # q_i = P(l > l_i), i = 0..k−1
    total = 0.0
    for i in range(1, k):
        total += (q[i - 1] - q[i]) * e[i]
    return total + q[k - 1] * (e[k - 1] + harmonic(B) / mu)


def exponential_throughput_bound(k: int, B: int, mu: float) -> float:
    """Corollary A.1.1: Throughput_k ≥ B / (eq. 27 at Lemma A.1's edges); exact for k = 1 (B·μ/H_B)."""
    return _check_B(B) / exponential_bound_terms(exponential_boundaries(k, B, mu), B, mu)


# ----------------------------------------------------------------------------------------- any law
def quantile_boundaries(k: int, quantile: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Equal-mass edges Q(i/k), i = 0..k, from a quantile function (predicted lengths, a trace)."""
    k = _check_k(k)
    return np.asarray(quantile(np.arange(k + 1, dtype=np.float64) / k), dtype=np.float64)


def batch_time(edges: Sequence[float], B: int, cdf: Callable[[float], float] | None = None,
               atoms: Sequence[float] | None = None) -> float:
    """E[t_service] of eq. 2 for a request-time law and edges (finite or last = ∞):
    Σ_i P(bin i)·E[max of B | bin i].  A continuous law by its ``cdf``: E[max] = a + ∫_a^b (1 − F_i^B),
    F_i the in-bin CDF; an empirical law by its equally likely ``atoms``: E[max] = Σ_j v_j (F_i(v_j)^B −
    F_i(v_{j−1})^B), exact (values below the first edge count in bin 0, as :func:`assign_bins` puts them)."""
    B = _check_B(B)
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise InputError("bin edges must be an increasing sequence of at least two values")
    if atoms is not None:
        v = np.sort(np.asarray(atoms, dtype=np.float64))
        idx = np.searchsorted(e[1:-1], v, side="right")
        total = 0.0
        for i in range(e.size - 1):
            w = v[idx == i]
            if w.size == 0:
                continue
            F = np.arange(1, w.size + 1) / w.size
            total += w.size / v.size * float(np.sum(w * (F**B - np.concatenate([[0.0], F[:-1]]) ** B)))
        return total
    if cdf is None:
        raise InputError("batch_time needs the law's cdf or its atoms")
    total = 0.0
    for a, b in zip(e[:-1], e[1:]):
        Fa = float(cdf(a))
        Fb = 1.0 if math.isinf(b) else float(cdf(b))
        p = Fb - Fa
        if p <= 0:
            continue
        tail = lambda x: 1.0 - ((float(cdf(x)) - Fa) / p) ** B  # noqa: B023 - integrated in this iteration
        val, _ = integrate.quad(tail, a, b, limit=200, epsabs=1e-12, epsrel=1e-11)
        total += p * (a + val)
    return total


def throughput(edges: Sequence[float], B: int, cdf: Callable[[float], float] | None = None,
               atoms: Sequence[float] | None = None) -> float:
    """Proposition 4.1, eq. 1: B / E[t_service] for any law and edges (one server, saturated)."""
    return _check_B(B) / batch_time(edges, B, cdf, atoms)


def toy_makespan(times: Sequence[float], B: int, edges: Sequence[float] | None = None) -> float:
    """Total execution time when requests arriving together are batched by arrival order (edges None)
    or within bins first (paper 000 §1, Fig. 1b); a partial last batch per bin is served too."""
    B = _check_B(B)
    t = np.asarray(times, dtype=np.float64)
    if edges is None:
        groups = [t]
    else:
        e = np.asarray(edges, dtype=np.float64)
        idx = np.clip(np.searchsorted(e, t, side="right") - 1, 0, e.size - 2)
        groups = [t[idx == i] for i in range(e.size - 1)]
    return float(sum(g[j:j + B].max() for g in groups for j in range(0, g.size, B)))
