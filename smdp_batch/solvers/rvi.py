"""Relative value iteration on the discretized MDP (paper 004 §V-B/C, eqs. 23–29, Algorithm 1).

The SMDP 𝒫̂ is turned into a discrete-time MDP by eq. 23 with c̃ = ĉ/y and
Σ_j m̃(j|s,a)H(j) = (η/y)·Σ_j m̂(j|s,a)H(j) + (1 − η/y)·H(s); η is a fixed fraction of its bound
(eqs. 24–25) — the larger η, the faster RVI converges.  Reference state s* = 0.  The loop runs
in one numba kernel (:func:`rvi_loop`) whose expectations are the sliding dot products of
:func:`smdp_batch.solvers.kernels.expected_next`.  The optimal gain of the discretized model equals the SMDP's
(Puterman Prop. 11.4.5) and lies in [min, max] of J_{i+1} − H_i; η·H solves eq. 20.
"""

from __future__ import annotations

import time

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from ..errors import InputError, warn_not_converged
from ..model.problem import BatchingProblem
from ..model.truncation import TruncatedSMDP, truncate
from .kernels import expected_next
from .jit import warm_up
from .result import SolveResult

#: Default η as a fraction of the bound of eq. 25 (DESIGN.md §3).
ETA_FRACTION = 0.99


@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def rvi_loop(P, SF, klo, khi, actions, y, cfix, cslope, c_o, s_max, eta, eps, max_iter, h0, ref):
    """Relative value iteration (paper 004 Algorithm 1) on the discretized MDP (eq. 23).

    One sweep: J(s) = min_a c̃(s,a) + (η/y_a)·Σ_j m̂(j|s,a)H(j) + (1 − η/y_a)·H(s)  (eq. 29), the
    expectation by :func:`~smdp_batch.solvers.kernels.expected_next`; H ← J − J(ref).  Stops when
    span(J − H) = span(H_{i+1} − H_i) < eps.  Returns (H, policy_idx, iterations, lo, hi,
    converged) with [lo, hi] the bracket of J − H that contains the optimal gain.

    ``P``/``SF`` may be compact (columns past the arrival support are 0 and not stored); expected_next is
    inlined here, so numba's on-disk cache of this kernel must be refreshed whenever it changes.
    """
    S = s_max + 2
    A = actions.shape[0]
    H = h0.copy()
    J = np.empty(S)
    pol = np.zeros(S, dtype=np.int64)
    w = eta / y
    invy = 1.0 / y
    lo = 0.0
    hi = 0.0
    for it in range(1, max_iter + 1):
        lo = np.inf
        hi = -np.inf
        for s in range(S):
            ss = s if s <= s_max else s_max
            best = np.inf
            besta = 0
            for ai in range(A):
                a = actions[ai]
                if a > ss:
                    break
                cost = cfix[ai] + cslope[ai] * ss  # eq. 19: waiting has cfix = 0
                if s == S - 1:
                    cost += c_o * y[ai]
                q = cost * invy[ai] + w[ai] * expected_next(H, s, ai, a, P, SF, klo, khi, s_max) + (1.0 - w[ai]) * H[s]
                if q < best:
                    best = q
                    besta = ai
            J[s] = best
            pol[s] = besta
            d = best - H[s]
            if d < lo:
                lo = d
            if d > hi:
                hi = d
        jref = J[ref]
        for s in range(S):
            H[s] = J[s] - jref
        if hi - lo < eps:
            return H, pol, it, lo, hi, True
    return H, pol, max_iter, lo, hi, False


def relative_value_iteration(
    model: TruncatedSMDP,
    eps: float = 0.01,
    max_iter: int = 100_000,
    eta_fraction: float = ETA_FRACTION,
    h0: np.ndarray | None = None,
) -> SolveResult:
    """Solve the truncated SMDP by RVI; stop when span(H_{i+1} − H_i) < eps.

    Returns the ε-optimal policy of Algorithm 1 step 4.  Warns with :class:`NotConvergedWarning`
    and sets ``converged=False`` when ``max_iter`` sweeps were not enough.
    """
    if not (np.isfinite(eps) and eps > 0):
        raise InputError(f"eps must be > 0, got {eps!r}")
    if model.extra is not None:
        raise InputError("RVI solves eq. 19's overflow boundary only; this model has the tail boundary (use solver='pi')")
    if not (0 < eta_fraction < 1):
        raise InputError(f"eta_fraction must lie in (0, 1), got {eta_fraction!r}")
    if int(max_iter) < 1:
        raise InputError(f"max_iter must be ≥ 1, got {max_iter!r}")
    eta = eta_fraction * model.eta_bound()
    S = model.n_states
    H0 = np.zeros(S) if h0 is None else np.asarray(h0, dtype=np.float64) / eta
    if H0.shape != (S,):
        raise InputError(f"h0 must have {S} entries, got shape {H0.shape}")
    warm_up_rvi()
    t0 = time.perf_counter()
    H, pol, it, lo, hi, ok = rvi_loop(
        model.P, model.SF, model.klo, model.khi, model.actions, model.y,
        model.cost_fixed, model.cost_slope, model.abstract_cost, model.s_max,
        eta, float(eps), int(max_iter), H0, 0,
    )
    secs = time.perf_counter() - t0
    if not ok:
        warn_not_converged(
            f"RVI stopped at max_iter={max_iter} with span {hi - lo:.3g} ≥ eps={eps:g}: the policy is NOT "
            "certified ε-optimal (raise max_iter, or use solver='pi')")
    return SolveResult(
        policy=model.actions[pol],
        gain=0.5 * (lo + hi),
        gain_bracket=(float(lo), float(hi)),
        relative_values=eta * H,
        iterations=int(it),
        span=float(hi - lo),
        converged=bool(ok),
        solver="rvi",
        seconds=secs,
        eps=float(eps),
        eta=float(eta),
    )


#: Cold compile of :func:`rvi_loop` (s), on top of PI's (the truncation scan runs PI), 2-core development machine.
COLD_SECONDS = 2.0


def warm_up_rvi() -> float:
    """Load or compile RVI's kernel once per process (:mod:`.jit`); the seconds it took."""
    def run():
        relative_value_iteration(truncate(BatchingProblem(lam=0.5, batch_sizes=(1, 2), latency="affine:1,1"), 4), eps=1.0)

    return warm_up("rvi", (rvi_loop,), run, COLD_SECONDS)
