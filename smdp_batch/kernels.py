"""Small numba kernels over the compact truncated SMDP (see :mod:`smdp_batch.truncate`).

The expected next value Σ_j m̂(j|s,a)·h(j) (eq. 18) out of (s, a ≠ 0) is a sliding dot product of
p^[a] against h starting at s − a, plus the tail mass times h(S_o); waiting reads h(s+1).
Everything is O(S·A·K) per sweep, K = the arrival-count support.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always", fastmath={"reassoc", "contract"})
def expected_next(h, s, ai, a, P, SF, klo, khi, s_max):
    """Σ_j m̂(j | s, a) h(j) for state index s (s_max+1 = S_o) and action a = actions[ai]."""
    if a == 0:
        return h[s + 1] if s <= s_max else h[s]
    ss = s if s <= s_max else s_max
    base = ss - a
    m = s_max - base
    hi = khi[ai] if khi[ai] < m else m
    acc = 0.0
    for k in range(klo[ai], hi + 1):
        acc += P[ai, k] * h[base + k]
    return acc + SF[ai, m] * h[s_max + 1]


@njit(cache=True, fastmath={"reassoc", "contract"})
def expected_next_table(h, P, SF, klo, khi, actions, s_max):
    """(S, A) table of Σ_j m̂(j|s,a) h(j); +inf where a is infeasible (a > s)."""
    S = s_max + 2
    A = actions.shape[0]
    out = np.full((S, A), np.inf)
    for s in range(S):
        ss = s if s <= s_max else s_max
        for ai in range(A):
            a = actions[ai]
            if a > ss:
                break
            out[s, ai] = expected_next(h, s, ai, a, P, SF, klo, khi, s_max)
    return out


@njit(cache=True)
def policy_matrix(pol_idx, P, SF, actions, s_max):
    """Dense m̂(·|s, π(s)) for a policy given as action indices, shape (S, S). Full rows (no support cut)."""
    S = s_max + 2
    M = np.zeros((S, S))
    for s in range(S):
        ai = pol_idx[s]
        a = actions[ai]
        if a == 0:
            M[s, s + 1 if s <= s_max else s] = 1.0
            continue
        ss = s if s <= s_max else s_max
        base = ss - a
        m = s_max - base
        for k in range(m + 1):
            M[s, base + k] += P[ai, k]
        M[s, s_max + 1] += SF[ai, m]
    return M


@njit(cache=True, fastmath={"reassoc", "contract"})
def rvi_loop(P, SF, klo, khi, actions, y, cfix, cslope, c_o, s_max, eta, eps, max_iter, h0, ref):
    """Relative value iteration (paper 004 Algorithm 1) on the discretized MDP (eq. 23).

    One sweep: J(s) = min_a c̃(s,a) + (η/y_a)·Σ_j m̂(j|s,a)H(j) + (1 − η/y_a)·H(s)  (eq. 29);
    H ← J − J(ref).  Stops when span(J − H) = span(H_{i+1} − H_i) < eps.
    Returns (H, policy_idx, iterations, lo, hi, converged) with [lo, hi] the bracket of
    J − H that contains the optimal gain.
    """
    S = s_max + 2
    A = actions.shape[0]
    H = h0.copy()
    J = np.empty(S)
    pol = np.zeros(S, dtype=np.int64)
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
                cost = cfix[ai] + cslope[ai] * ss
                if s == S - 1:
                    cost += c_o * y[ai]
                w = eta / y[ai]
                q = cost / y[ai] + w * expected_next(H, s, ai, a, P, SF, klo, khi, s_max) + (1.0 - w) * H[s]
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
