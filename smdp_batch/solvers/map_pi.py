"""Policy iteration and exact evaluation for the MAP batching SMDP (paper 004 eqs. 20–22).

The model is :class:`smdp_batch.model.map_truncation.MapSMDP`: states (n, i), n = 0..s_max and S_o.

* **Evaluation** of a policy π solves h = ĉ_π − g·y_π + M_π·h with h(0, 0) = 0 (eq. 20) as one
  sparse linear system (the column of h(0, 0) replaced by y_π), by SuperLU.  M_π is block-banded:
  from level n it reaches levels n − Bmax … n − b + K and S_o, so it holds O(m²·S·K) entries.
  Every evaluation is certified by the residual of eq. 20.
* **Improvement**: Q((n, i), a) = ĉ((n, i), a) − g·y_a(i) + Σ_{k, j} A_k^[a](i, j)·h̄(n − a + k, j)
  + tail·h(S_o, j), for every state and action at once — for each pair of phases (i, j) one product of
  the (S × W) windows of h̄_j with the W × A filters of A^[·](i, j) (h̄ extends h past s_max by
  h(S_o)).  The current action is kept unless beaten by more than 1e-11 relative; the loop ends when
  the policy repeats (no ε), which certifies optimality on the truncation.
* **Exact metrics** of any (n, phase) policy: the stationary law μ of M_π at decision epochs and the
  renewal-reward ratios of eqs. 21–22: ĝ = μ·ĉ/μ·y, W̄ = μ·hold/(μ·y·λ̄) (Little's law with the
  MAP's mean rate λ̄), P̄ = μ·ζ/μ·y.

With m = 1 the model, hence every policy and gain, is paper 004's (tested to 1e-12).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import splu

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from ..errors import InputError, warn_not_converged
from ..model.map_truncation import MapSMDP
from .threads import single_blas

#: Column order for SuperLU (COLAMD keeps the fill of the block-banded matrix near its own size; measured
#: against NATURAL, MMD: the fastest at s_max 800, m = 2).
PERMC = "COLAMD"

__all__ = ["MapEvaluation", "MapPIResult", "evaluate_map_policy", "map_gain_bias", "map_policy_iteration", "q_values"]


@njit(cache=True)
def _transitions(pol, actions, pmf, sf, khi, wait_next, s_max, m):
    """COO entries (rows, cols, vals) of M_π for action indices pol (levels × m)."""
    L = s_max + 2
    K = pmf.shape[1] - 1
    nnz = 0
    for n in range(L):
        for i in range(m):
            ai = pol[n, i]
            if ai == 0:
                nnz += m
            else:
                base = min(n, s_max) - actions[ai]
                top = min(khi[ai - 1], s_max - base, K)
                nnz += (top + 1) * m + m
    rows = np.empty(nnz, dtype=np.int64)
    cols = np.empty(nnz, dtype=np.int64)
    vals = np.empty(nnz)
    t = 0
    for n in range(L):
        for i in range(m):
            r = n * m + i
            ai = pol[n, i]
            if ai == 0:
                nxt = min(n + 1, s_max + 1)
                for j in range(m):
                    rows[t] = r
                    cols[t] = nxt * m + j
                    vals[t] = wait_next[i, j]
                    t += 1
                continue
            base = min(n, s_max) - actions[ai]
            top = min(khi[ai - 1], s_max - base, K)
            for k in range(top + 1):
                for j in range(m):
                    rows[t] = r
                    cols[t] = (base + k) * m + j
                    vals[t] = pmf[ai - 1, k, i, j]
                    t += 1
            for j in range(m):
                rows[t] = r
                cols[t] = (s_max + 1) * m + j
                vals[t] = sf[ai - 1, top, i, j]
                t += 1
    return rows, cols, vals


def _matrix(model: MapSMDP, pol: np.ndarray) -> sparse.csc_matrix:
    b = model.blocks
    rows, cols, vals = _transitions(pol, model.actions, b.pmf, b.sf, b.khi, model.wait_next, model.s_max, model.phases)
    N = model.n_states
    return sparse.csc_matrix((vals, (rows, cols)), shape=(N, N))


def _policy_vectors(model: MapSMDP, pol: np.ndarray, costs: np.ndarray):
    L, m = pol.shape
    c = np.take_along_axis(costs, pol[:, :, None], axis=2)[:, :, 0].ravel()
    y = model.y[pol, np.arange(m)[None, :]].ravel()
    return c, y


def _factor(model: MapSMDP, pol: np.ndarray, costs: np.ndarray):
    """SuperLU of B = I − M_π with the column of h(0, 0) replaced by y_π, and (c_π, y_π, M_π).

    B solves eq. 20 (B·(g, h) = c) and gives the stationary law too: μ·(I − M) = 0 makes μ·B = (μ·y)·e₀ᵀ,
    so μ ∝ B⁻ᵀ·e₀ — one factorization for both."""
    c, y = _policy_vectors(model, pol, costs)
    if not np.all(np.isfinite(c)):
        raise InputError("the policy takes an infeasible action")
    M = _matrix(model, pol)
    N = model.n_states
    A = (sparse.identity(N, format="csc") - M).tocsc()
    A.data[A.indptr[0]:A.indptr[1]] = 0.0  # column of h(0, 0) ← y
    A = A + sparse.csc_matrix((y, (np.arange(N), np.zeros(N, dtype=np.int64))), shape=(N, N))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lu = splu(A.tocsc(), permc_spec=PERMC)
    except (RuntimeError, sparse.linalg.MatrixRankWarning, Warning):
        raise InputError("the policy's chain is multichain (singular evaluation)") from None
    return lu, c, y, M


def _eq20(model: MapSMDP, pol: np.ndarray, costs: np.ndarray):
    """(g, h, factorization) of a policy: the sparse solve of eq. 20, certified by its residual."""
    lu, c, y, M = _factor(model, pol, costs)
    x = lu.solve(c)
    g = float(x[0])
    h = x.copy()
    h[0] = 0.0
    res = np.max(np.abs(h - c + g * y - M @ h))
    if not (np.isfinite(g) and res <= 1e-7 * (1.0 + np.max(np.abs(h)) + abs(g))):
        raise InputError(f"evaluation not certified (residual {res:.3g}): a numerically multichain policy")
    return g, h.reshape(model.levels, model.phases), (lu, M)


def map_gain_bias(model: MapSMDP, pol: np.ndarray, costs: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """(g, h) of a policy (action indices, levels × m) by the sparse solve of eq. 20; h(0, 0) = 0.

    Raises InputError when the system is singular (a multichain policy) or the residual is not small.
    """
    g, h, _ = _eq20(model, pol, model.costs() if costs is None else costs)
    return g, h


def window_filters(model: MapSMDP) -> tuple[int, np.ndarray, np.ndarray]:
    """(jmin, F, tail): for each phase pair (i, j), every action's A_k^[a](i, j) in the frame t = k − a − jmin
    (F[i, j] is W × A, column 0 — waiting — empty) and the mass beyond the support, tail[i, j, a].  They depend
    on the model only, so PI builds them once (as :func:`.kernels.window_filters` for the Poisson model)."""
    b = model.blocks
    s_max, m = model.s_max, model.phases
    acts = model.actions
    A = acts.size
    khi = np.minimum(b.khi, s_max)
    jmin = int(-acts.max())
    W = int(max(1, int((khi - acts[1:]).max()))) - jmin + 1
    F = np.zeros((m, m, W, A))
    tail = np.zeros((m, m, A))
    for ai in range(1, A):
        top = int(khi[ai - 1])
        rows = np.arange(top + 1) - int(acts[ai]) - jmin
        F[:, :, rows, ai] = np.moveaxis(b.pmf[ai - 1, : top + 1], 0, 2)
        tail[:, :, ai] = b.sf[ai - 1, top]
    return jmin, F, tail


def q_values(model: MapSMDP, g: float, h: np.ndarray, costs: np.ndarray | None = None, filters=None) -> np.ndarray:
    """Q((n, i), a) = ĉ − g·y + E[h(next)] for every state and action, shape (levels, m, A); +inf where a > n.
    ``filters``: :func:`window_filters` of the model, when already built."""
    costs = model.costs() if costs is None else costs
    jmin, F, tail = window_filters(model) if filters is None else filters
    s_max, m = model.s_max, model.phases
    W, A = F.shape[2], F.shape[3]
    n = s_max + 1
    EH = np.zeros((model.levels, m, A))
    hso = h[-1]
    idx = np.arange(n + W) + jmin
    for j in range(m):
        hbar = np.where(idx < 0, 0.0, h[np.clip(idx, 0, s_max), j])
        hbar[idx > s_max] = hso[j]
        Hw = np.lib.stride_tricks.sliding_window_view(hbar, W)[:n]  # (n, W): Hw[s, t] = h̄(s + t + jmin)
        for i in range(m):
            EH[:n, i, :] += Hw @ F[i, j] + tail[i, j][None, :] * hso[j]
            EH[:n, i, 0] += model.wait_next[i, j] * np.concatenate([h[1:n, j], [hso[j]]])
    EH[n] = EH[n - 1]  # S_o acts as s_max
    EH[n, :, 0] = model.wait_next @ hso
    q = costs - g * model.y.T[None, :, :] + EH
    q[~np.isfinite(costs)] = np.inf
    return q


def _improve(pol: np.ndarray, q: np.ndarray) -> np.ndarray:
    cur = np.take_along_axis(q, pol[:, :, None], axis=2)[:, :, 0]
    best = np.argmin(q, axis=2)
    qbest = np.take_along_axis(q, best[:, :, None], axis=2)[:, :, 0]
    switch = cur - qbest > 1e-11 * (1.0 + np.abs(cur))
    return np.where(switch, best, pol)


def _starts(model: MapSMDP) -> list[np.ndarray]:
    lv = model.level()
    feas = model.actions[None, :] <= lv[:, None]
    greedy = np.where(feas, np.arange(model.actions.size)[None, :], 0).max(axis=1)
    limit = greedy.copy()
    limit[: max(1, -(-model.problem.bmax // 4))] = 0
    return [np.repeat(p[:, None], model.phases, axis=1).astype(np.int64) for p in (greedy, limit)]


@dataclass(frozen=True)
class MapPIResult:
    policy: np.ndarray  # (levels, m) batch sizes
    gain: float
    relative_values: np.ndarray  # (levels, m)
    qvalues: np.ndarray  # (levels, m, A)
    iterations: int
    converged: bool
    seconds: float
    stationary: np.ndarray | None = field(default=None, repr=False)  # μ of the policy, from its last factorization


def map_policy_iteration(model: MapSMDP, policy0: np.ndarray | None = None, max_iter: int = 200) -> MapPIResult:
    """Exact PI on the truncated MAP SMDP from ``policy0`` (batch sizes, levels × m) or the better of
    greedy and a control-limit start."""
    t0 = time.perf_counter()
    costs = model.costs()
    with single_blas():
        # one sparse LU alive at a time (SuperLU reserves ~730 bytes per matrix entry: .map_work.LU_MEMORY)
        fac = None
        if policy0 is not None:
            pol = model.action_index(policy0)
            g, h, fac = _eq20(model, pol, costs)
        else:
            best = None
            for p in _starts(model):
                fac = None
                try:
                    got = _eq20(model, p, costs)
                except InputError:
                    continue
                if best is None or got[0] < best[1]:
                    best, fac = (p, got[0], got[1]), got[2]
                del got
            if best is None:
                raise InputError("no starting policy of the MAP SMDP evaluates (s_max too small?)")
            pol, g, h = best
            if fac is None:  # the first start was the better one: its factorization was let go
                _, _, fac = _eq20(model, pol, costs)
        filters = window_filters(model)
        converged = False
        it = 0
        for it in range(1, max_iter + 1):  # noqa: B007 - the count is returned after the loop
            q = q_values(model, g, h, costs, filters)
            new = _improve(pol, q)
            if np.array_equal(new, pol):
                converged = True
                break
            changed = np.argwhere(new != pol)
            fac = None
            while True:  # a subset of improving switches still improves (see pi._improve)
                trial = pol.copy()
                trial[changed[:, 0], changed[:, 1]] = new[changed[:, 0], changed[:, 1]]
                try:
                    g, h, fac = _eq20(model, trial, costs)
                    pol = trial
                    break
                except InputError:
                    if changed.shape[0] <= 1:
                        raise InputError("policy iteration reached a multichain policy: use a larger s_max") from None
                    changed = changed[: changed.shape[0] // 2]
    if not converged:
        warn_not_converged(f"MAP policy iteration did not repeat a policy within {max_iter} iterations: NOT certified")
        q = q_values(model, g, h, costs, filters)
    try:  # the stationary law from the factorization PI already holds (one triangular solve, not a new LU)
        mu = _law(model, *fac)
    except InputError:
        mu = None
    return MapPIResult(model.actions[pol], g, h, q, it, converged, time.perf_counter() - t0, mu)


@dataclass(frozen=True)
class MapEvaluation:
    """Exact long-run metrics of one (n, phase) policy on a truncated MAP model (eqs. 21–22)."""

    avg_cost: float
    delta: float  # cost per ms contributed by the S_o level
    mean_latency_ms: float
    mean_power_w: float
    throughput: float  # requests/ms
    mean_batch_size: float
    overflow_probability: float  # μ(S_o level) at decision epochs
    stationary: np.ndarray = field(repr=False)  # (levels, m)
    s_max: int = 0

    def as_dict(self) -> dict:
        return {"avg_cost": self.avg_cost, "delta": self.delta, "mean_latency_ms": self.mean_latency_ms,
                "mean_power_w": self.mean_power_w, "throughput": self.throughput,
                "throughput_per_s": self.throughput * 1e3, "mean_batch_size": self.mean_batch_size,
                "overflow_probability": self.overflow_probability}


def _law(model: MapSMDP, lu, M) -> np.ndarray:
    """μ of M_π at decision epochs from the factorization of :func:`_factor` (μ ∝ B⁻ᵀ·e₀), checked."""
    e0 = np.zeros(model.n_states)
    e0[0] = 1.0
    mu = lu.solve(e0, trans="T")
    scale = np.max(np.abs(mu))
    if not (np.isfinite(scale) and scale > 0) or np.min(mu) < -1e-9 * scale:
        raise InputError("the policy's chain has no unique stationary law (multichain)")
    mu = np.where(mu < 0, 0.0, mu)  # round-off below 1e-9 of the largest mass
    mu /= mu.sum()
    if np.max(np.abs(mu - M.T @ mu)) > 1e-9:
        raise InputError("the stationary law is not certified (a numerically multichain policy)")
    return mu.reshape(model.levels, model.phases)


def evaluate_map_policy(model: MapSMDP, policy: np.ndarray, stationary: np.ndarray | None = None) -> MapEvaluation:
    """Exact metrics of ``policy`` (batch sizes, levels × m) on the truncated model; ``stationary``: its law μ
    when already known (:attr:`MapPIResult.stationary` of the same policy and model), else factored here."""
    pol = model.action_index(policy)
    costs = model.costs()
    if stationary is None:
        lu, _, _, M = _factor(model, pol, costs)
        stationary = _law(model, lu, M)
    mu = stationary
    m = model.phases
    cols = np.arange(m)[None, :]
    y = model.y[pol, cols]
    c = np.take_along_axis(costs, pol[:, :, None], axis=2)[:, :, 0]
    a = model.actions[pol].astype(np.float64)
    lv = model.level()[:, None]
    hold = lv * y + model.hold_fixed[pol, cols]
    T = float((mu * y).sum())
    serving = float(mu[a > 0].sum())
    lam = model.arrivals.rate
    return MapEvaluation(
        avg_cost=float((mu * c).sum()) / T,
        delta=float((mu[-1] * c[-1]).sum()) / T,
        mean_latency_ms=float((mu * hold).sum()) / T / lam,
        mean_power_w=float((mu * model.energy[pol]).sum()) / T,
        throughput=float((mu * a).sum()) / T,
        mean_batch_size=float((mu * a).sum()) / serving if serving > 0 else 0.0,
        overflow_probability=float(mu[-1].sum()),
        stationary=mu, s_max=model.s_max,
    )
