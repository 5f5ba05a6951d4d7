"""Paper 004's SMDP solved per bin of multi-bin batching (papers 000/003), run as per-bin tables.

Bin i receives the requests whose time lies in [l_{i−1}, l_i): Poisson with rate λ_i = λ·P(bin i).
A batch of b requests of bin i takes the maximum of b request times drawn from the bin's law, so
G_b is the max-of-b law of the in-bin distribution (:class:`~smdp_batch.model.families.MaxOf`, CDF
F_i^b) with its own mean l_i(b) = E[max of b] (for U[a, c): a + (c − a)·b/(b+1)).  Each bin's SMDP
(paper 004 eqs. 4–17, 𝓑 = 1..B) is solved exactly by policy iteration (at s_max = B + 4·λ_i·l_i(B), doubled until Δ < 1e-3; RVI if PI ever
meets a numerically multichain candidate).  With w2 = 0 (the default) the
cost is mean latency alone, the objective multi-bin batching cares about.

The SMDP of a bin assumes the server is free whenever that bin's batch ends (a server of its own).
With one bin (k = 1) the simulator reproduces the SMDP's exact latency (a test); with k bins sharing
servers (:func:`smdp_batch.llm.binsim.simulate_bins` with ``tables``) the bins compete for them, and the
simulator reports what the tables achieve there, which is what the comparisons use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..model.families import Empirical, MaxOf, Uniform
from ..model.problem import BatchingProblem
from .binsim import RequestLaw

__all__ = ["PerBinPolicy", "solve_bins", "solve_engine_bins", "engine_batch_times"]


@dataclass(frozen=True)
class PerBinPolicy:
    """Per-bin solutions: ``tables`` (k × (s_max+1), the batch size at queue length n, 0 = wait; rows
    are extended by eq. 30), ``rates`` λ_i, ``solutions`` (paper 004 :class:`Solution` per bin) and
    the model's mean latency per bin, ``latency`` (time units; exact, eq. 30 on the infinite queue)."""

    edges: np.ndarray
    rates: np.ndarray
    tables: np.ndarray
    solutions: tuple
    latency: np.ndarray

    @property
    def mean_latency(self) -> float:
        """Request-weighted mean latency if every bin had a server of its own (the SMDPs' model)."""
        return float(np.sum(self.rates * self.latency) / np.sum(self.rates))


def _bin_law(law: RequestLaw, a: float, c: float):
    if law.kind == "uniform":
        return MaxOf(Uniform(a, c))
    if law.kind == "empirical":
        v = np.asarray(law.params, dtype=np.float64)
        inside = v[(v >= a) & (v < c)] if math.isfinite(c) else v[v >= a]
        if inside.size == 0:
            return None
        return MaxOf(Empirical(inside))
    raise InputError(
        f"per-bin SMDP needs a bounded request-time law (uniform:LO,HI or a trace), got {law.spec()}; "
        "the truncated exponential of an unbounded last bin has no max-of-b family here"
    )


def _tables(sols) -> np.ndarray:
    """The bins' policies as one k × (s_max+1) array, rows extended by eq. 30 to the widest s_max; a bin
    with no solution (no requests) serves whatever comes."""
    width = max(s.s_max for s in sols if s is not None) + 1
    tables = np.zeros((len(sols), width), np.int64)
    for i, s in enumerate(sols):
        if s is None:
            tables[i, 1:] = 1
            continue
        pol = np.asarray(s.policy[: s.s_max + 1], dtype=np.int64)
        tables[i, : pol.size] = pol
        tables[i, pol.size:] = pol[-1]  # eq. 30
    return tables


def _solve_bin(prob: BatchingProblem, s_max):
    """PI at s_max (given, or B + 4·λ·l(B) doubled until Δ < 1e-3); RVI where PI meets a numerically
    multichain policy (w2 = 0 with max-of-b laws can: see the module's notes)."""
    from ..solvers import solve

    if s_max != "auto":
        return solve(prob, s_max=int(s_max))
    m = prob.bmax + int(math.ceil(4.0 * prob.lam * float(prob.latency(float(prob.bmax)))))
    for _ in range(6):
        try:
            s = solve(prob, s_max=m)
        except InputError:  # a numerically multichain / singular candidate on PI's path
            s = solve(prob, s_max=m, solver="rvi")
        if s.evaluation.delta < 1e-3:
            return s
        m *= 2
    raise InputError(f"bin SMDP at λ = {prob.lam:.6g}: no s_max ≤ {m} gives Δ < 1e-3 (load ρ = {prob.rho:.4g} too high?)")


def solve_bins(lam: float, edges, law: RequestLaw, B: int = 128, *, w2: float = 0.0, s_max="auto") -> PerBinPolicy:
    """Solve each bin's SMDP (λ_i = λ·P(bin i), 𝓑 = 1..B, G_b = max of b in-bin request times)."""
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise InputError("bin edges must be an increasing sequence of at least two values")
    lam = float(lam)
    if not (math.isfinite(lam) and lam > 0):
        raise InputError(f"arrival rate λ must be finite and > 0, got {lam!r}")
    if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 1:
        raise InputError(f"batch size B must be an integer ≥ 1, got {B!r}")
    k = e.size - 1
    sols: list
    rates, sols, lats = np.zeros(k), [], np.zeros(k)
    for i in range(k):
        a, c = e[i], e[i + 1]
        p_i = law.cdf(c) - law.cdf(a) if math.isfinite(c) else 1.0 - law.cdf(a)
        if i == 0 and law.kind == "empirical":
            p_i = law.cdf(c)  # values below the first edge go to bin 0
        rates[i] = lam * p_i
        g = _bin_law(law, a, c)
        if rates[i] <= 0 or g is None:
            sols.append(None)
            continue
        prob = BatchingProblem(lam=rates[i], batch_sizes=tuple(range(1, int(B) + 1)), service=g, w2=float(w2))
        s = _solve_bin(prob, s_max)
        sols.append(s)
        lats[i] = s.deployed.mean_latency_ms
    return PerBinPolicy(edges=e, rates=rates, tables=_tables(sols), solutions=tuple(sols), latency=lats)


def engine_batch_times(model, prompts: np.ndarray, outputs: np.ndarray) -> float:
    """Run-to-completion time (s) of one batch on the LLM engine (:mod:`.engine`): padded prefill, then
    decode steps while requests remain, Σ_t (a + c·#{j : out_j ≥ t}) = a·max(out) + c·Σ out."""
    b = prompts.size
    return (model.prefill_time(b, int(prompts.max())) + model.decode_base * int(outputs.max())
            + model.decode_per_request * int(outputs.sum()))


def solve_engine_bins(lam: float, edges, prompts: np.ndarray, outputs: np.ndarray, model, B: int = 16, *,
                      samples: int = 400, seed: int = 0, w2: float = 0.0) -> PerBinPolicy:
    """Per-bin SMDPs for run-to-completion batches on the LLM engine.

    Requests are binned by output length (``edges``); for each bin and b = 1..B, ``samples`` batches of
    b requests drawn from the bin's (prompt, output) pairs give measured batch times, which become the
    bin's service law exactly as a measured profile does (:class:`~smdp_batch.model.profile.EmpiricalProfile`:
    per-b empirical laws, l(b) interpolated).  λ in requests/s; the SMDPs run in ms.
    """
    from ..model.profile import EmpiricalProfile, Profile

    e = np.asarray(edges, dtype=np.float64)
    p, o = np.asarray(prompts, np.int64), np.asarray(outputs, np.int64)
    idx = np.clip(np.searchsorted(e, o, side="right") - 1, 0, e.size - 2)
    rng = np.random.default_rng(seed)
    k = e.size - 1
    sols: list
    rates, sols, lats = np.zeros(k), [], np.zeros(k)
    for i in range(k):
        members = np.nonzero(idx == i)[0]
        rates[i] = lam * members.size / o.size
        if members.size == 0:
            sols.append(None)
            continue
        bs, lat = [], []
        for b in range(1, int(B) + 1):
            for _ in range(int(samples)):
                pick = rng.choice(members, b)
                bs.append(b)
                lat.append(1e3 * engine_batch_times(model, p[pick], o[pick]))
        lat_arr = np.asarray(lat)
        bs_arr = np.asarray(bs, np.int64)
        # l(b) must be non-decreasing: it is in expectation; sort the per-b means' sampling noise away
        means = np.array([lat_arr[bs_arr == b].mean() for b in range(1, int(B) + 1)])
        lift = np.maximum.accumulate(means) - means
        lat_arr = lat_arr + lift[bs_arr - 1]
        prof = Profile(path=f"engine-bin-{i}", batch=bs_arr, latency=lat_arr, energy=None,
                       lines=np.arange(2, bs_arr.size + 2))
        law = EmpiricalProfile(f"engine-bin-{i}", profile=prof)
        prob = BatchingProblem(lam=rates[i] / 1e3, batch_sizes=tuple(range(1, int(B) + 1)), service=law, w2=float(w2))
        s = _solve_bin(prob, "auto")
        sols.append(s)
        lats[i] = s.deployed.mean_latency_ms / 1e3
    return PerBinPolicy(edges=e, rates=rates, tables=_tables(sols), solutions=tuple(sols), latency=lats)
