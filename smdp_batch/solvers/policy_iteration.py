"""Exact average-cost policy iteration for the truncated SMDP (paper 004 eq. 20; Puterman §11.4).

Evaluation solves h(s) = ĉ(s,π) − g·y(s,π) + Σ_j m̂(j|s,π)h(j) with h(s*) = 0, s* = 0, as one
linear system in (g, h) (the column of h(s*) is replaced by y).  The truncated model is unichain
under every policy (paper 004 Lemma 2), so the system is non-singular.  Improvement picks
argmin_a ĉ(s,a) − g·y(a) + Σ_j m̂(j|s,a)h(j), keeping the current action unless another is better
by more than a round-off tolerance; the loop ends when the policy repeats, which certifies
optimality of the truncated SMDP (no ε).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import scipy.linalg

from ..errors import InputError, NotConvergedWarning
from ..truncate import TruncatedSMDP
from ..kernels import expected_next_table, policy_matrix
from .result import SolveResult


def _initial_policy(model: TruncatedSMDP) -> np.ndarray:
    """Greedy (serve the largest feasible batch, eq. 16): stabilising, so a good start."""
    feas = model.feasible()
    return np.where(feas, np.arange(len(model.actions))[None, :], 0).max(axis=1).astype(np.int64)


def evaluate_gain_bias(model: TruncatedSMDP, pol_idx: np.ndarray, costs: np.ndarray | None = None):
    """(g, h) of a policy given as action indices: exact solve of eq. 20 restricted to π."""
    S = model.n_states
    M = policy_matrix(pol_idx, model.P, model.SF, model.actions, model.s_max)
    if costs is None:
        costs = model.costs()
    c = costs[np.arange(S), pol_idx]
    y = model.y[pol_idx]
    A = np.eye(S) - M
    A[:, 0] = y  # unknown h(0) ≡ 0 replaced by g
    try:
        # Degenerate truncations (policy waits in S_o, Δ huge) are nearly multichain and
        # ill-conditioned; the auto scan passes them by Δ, so the warning is noise there.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
            x = scipy.linalg.solve(A, c, check_finite=False)
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        raise InputError("policy evaluation is singular: the policy has more than one recurrent class") from None
    g = float(x[0])
    h = x.copy()
    h[0] = 0.0
    return g, h


def policy_iteration(
    model: TruncatedSMDP,
    policy0: np.ndarray | None = None,
    max_iter: int = 1000,
) -> SolveResult:
    """Solve the truncated SMDP exactly by policy iteration.

    ``policy0`` (batch sizes, length s_max+2) warm-starts the iteration; default greedy.
    """
    t0 = time.perf_counter()
    if policy0 is None:
        pol = _initial_policy(model)
    else:
        pol = model.action_index(policy0)
    costs = model.costs()
    S = model.n_states
    rows = np.arange(S)
    converged = False
    it = 0
    g, h = evaluate_gain_bias(model, pol, costs)
    for it in range(1, int(max_iter) + 1):
        EH = expected_next_table(h, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max)
        Q = costs - g * model.y[None, :] + EH
        best = Q.argmin(axis=1)
        qbest = Q[rows, best]
        qcur = Q[rows, pol]
        tol = 1e-11 * (1.0 + np.abs(qcur))
        new = np.where(qcur - qbest > tol, best, pol)
        if np.array_equal(new, pol):
            converged = True
            break
        pol = new
        g, h = evaluate_gain_bias(model, pol, costs)
    secs = time.perf_counter() - t0
    if not converged:
        warnings.warn(
            f"policy iteration did not repeat a policy within max_iter={max_iter}: result NOT certified",
            NotConvergedWarning,
            stacklevel=2,
        )
    return SolveResult(
        policy=model.actions[pol],
        gain=g,
        gain_bracket=(g, g),
        relative_values=h,
        iterations=it,
        span=0.0,
        converged=converged,
        solver="pi",
        seconds=secs,
    )
