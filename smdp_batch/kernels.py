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
def _band_widths(pol_idx, klo, khi, actions, s_max):
    lw = 0
    uw = 1
    for s in range(1, s_max + 1):
        a = actions[pol_idx[s]]
        if a == 0:
            continue
        if a - klo[pol_idx[s]] > lw:
            lw = a - klo[pol_idx[s]]
        if khi[pol_idx[s]] - a > uw:
            uw = khi[pol_idx[s]] - a
    return lw, uw


@njit(cache=True)
def _put(abx, U, V, D, lw, uw, n_states, r, c, v):
    last = n_states - 1
    rb = r == 0 or r == last
    cb = c == 0 or c == last
    if rb and cb:
        D[1 if r == last else 0, 1 if c == last else 0] += v
    elif rb:
        V[1 if r == last else 0, c - 1] += v
    elif cb:
        U[r - 1, 1 if c == last else 0] += v
    else:
        abx[r - 1, uw + lw + c - r] += v


@njit(cache=True)
def policy_system_bordered(pol_idx, P, SF, klo, khi, actions, s_max, col0):
    """I − m̂(·|s, π(s)) with column 0 replaced by ``col0``, split for a bordered banded solve.

    States 1..s_max form a banded block B (lower width lw ≤ Bmax, upper uw ≤ the arrival
    support); state 0's column (replaced by col0) and S_o (tail masses) are the border.
    Returns (abx, lw, uw, U, V, D): ``abx.T`` is LAPACK dgbtrf band storage (with fill rows) of
    Bᵀ — row s of B is written contiguously — and U = A[interior, border],
    V = A[border, interior], D = A[border, border].  Rows keep the support [klo, khi] of p^[a]:
    the dropped mass is < 1e-18, below float64 resolution of a row sum.
    """
    S = s_max + 2
    n = S - 2
    lw, uw = _band_widths(pol_idx, klo, khi, actions, s_max)
    abx = np.zeros((n, 2 * uw + lw + 1))
    U = np.zeros((n, 2))
    V = np.zeros((2, n))
    D = np.zeros((2, 2))
    for s in range(S):
        _put(abx, U, V, D, lw, uw, S, s, 0, col0[s])
        if s != 0:
            _put(abx, U, V, D, lw, uw, S, s, s, 1.0)
        ai = pol_idx[s]
        a = actions[ai]
        if a == 0:
            _put(abx, U, V, D, lw, uw, S, s, s + 1 if s <= s_max else s, -1.0)
            continue
        ss = s if s <= s_max else s_max
        base = ss - a
        m = s_max - base
        hi = khi[ai] if khi[ai] < m else m
        k0 = klo[ai]
        if 1 <= s <= s_max:  # interior row: contiguous band writes, border columns aside
            if base + k0 == 0:
                k0 += 1
            off = uw + lw - s + base
            row = abx[s - 1]
            for k in range(k0, hi + 1):
                row[off + k] -= P[ai, k]
        else:
            for k in range(k0, hi + 1):
                if base + k != 0:
                    _put(abx, U, V, D, lw, uw, S, s, base + k, -P[ai, k])
        _put(abx, U, V, D, lw, uw, S, s, S - 1, -SF[ai, m])
    return abx, lw, uw, U, V, D


@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def rvi_loop(P, SF, klo, khi, actions, y, cfix, cslope, c_o, s_max, eta, eps, max_iter, h0, ref):
    """Relative value iteration (paper 004 Algorithm 1) on the discretized MDP (eq. 23).

    One sweep: J(s) = min_a c̃(s,a) + (η/y_a)·Σ_j m̂(j|s,a)H(j) + (1 − η/y_a)·H(s)  (eq. 29);
    H ← J − J(ref).  Stops when span(J − H) = span(H_{i+1} − H_i) < eps.
    Returns (H, policy_idx, iterations, lo, hi, converged) with [lo, hi] the bracket of
    J − H that contains the optimal gain.  Waiting (action 0) is handled outside the inner
    sliding dot product, which runs over the support [klo, khi] of p^[a].
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
        hso = H[S - 1]
        for s in range(S):
            ss = s if s <= s_max else s_max
            # wait
            cost = cslope[0] * ss
            if s == S - 1:
                cost += c_o * y[0]
            nxt = H[s + 1] if s <= s_max else H[s]
            best = cost * invy[0] + w[0] * nxt + (1.0 - w[0]) * H[s]
            besta = 0
            for ai in range(1, A):
                a = actions[ai]
                if a > ss:
                    break
                base = ss - a
                m = s_max - base
                top = khi[ai] if khi[ai] < m else m
                acc = 0.0
                Prow = P[ai]
                for k in range(klo[ai], top + 1):
                    acc += Prow[k] * H[base + k]
                acc += SF[ai, m] * hso
                cost = cfix[ai] + cslope[ai] * ss
                if s == S - 1:
                    cost += c_o * y[ai]
                q = cost * invy[ai] + w[ai] * acc + (1.0 - w[ai]) * H[s]
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
