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
    lo = klo[ai]
    hi = khi[ai] if khi[ai] < m else m
    return _dot(P[ai, lo : hi + 1], h[base + lo : base + hi + 1]) + SF[ai, m] * h[s_max + 1]


@njit(cache=True, inline="always", fastmath={"reassoc", "contract"})
def _dot(x, z):
    """Σ x[t]·z[t] over equal-length 1-D views (non-negative indices: the loop vectorises)."""
    acc = 0.0
    for t in range(x.shape[0]):
        acc += x[t] * z[t]
    return acc


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
    for s in range(s_max + 1):
        ai = pol_idx[s]
        a = actions[ai]
        if a == 0:
            continue
        if a - klo[ai] > lw:
            lw = a - klo[ai]
        if khi[ai] - a > uw:
            uw = khi[ai] - a
    return lw, uw


@njit(cache=True)
def _put(abx, U, V, D, lw, uw, ref, last, r, c, v):
    """Scatter A[r, c] += v into the band (states 0..s_max except ref) or the border {ref, S_o}."""
    if c == ref:
        return  # column ref is replaced by col0
    rb = r == ref or r == last
    cb = c == last
    if rb and cb:
        D[0 if r == ref else 1, 1] += v
    elif rb:
        V[0 if r == ref else 1, c] += v
    elif cb:
        U[r, 1] += v
    else:
        abx[r, uw + lw + c - r] += v


@njit(cache=True)
def policy_system_bordered(pol_idx, P, SF, klo, khi, actions, s_max, col0, ref):
    """A = I − m̂(·|s, π(s)) with column ``ref`` replaced by ``col0``, split for a bordered banded solve.

    States 0..s_max form a banded block B (lower width ≤ Bmax, upper ≤ the arrival support) in
    which row and column ``ref`` are the identity; the border is {ref, S_o}: column ref (col0)
    and S_o's column (tail masses) are dense.  With ref recurrent under π, every other state
    leaks into the border, so B is non-singular.  Returns (abx, lw, uw, U, V, D): ``abx.T`` is
    LAPACK dgbtrf band storage (with fill rows) of Bᵀ — row s of B is written contiguously —
    U = A[band, border], V = A[border, band], D = A[border, border] (border order: ref, S_o).
    Rows keep the support [klo, khi] of p^[a]: the dropped mass is < 1e-18, below float64
    resolution of a row sum.
    """
    S = s_max + 2
    last = S - 1
    lw, uw = _band_widths(pol_idx, klo, khi, actions, s_max)
    abx = np.zeros((S - 1, 2 * uw + lw + 1))
    U = np.zeros((S - 1, 2))
    V = np.zeros((2, S - 1))
    D = np.zeros((2, 2))
    abx[ref, uw + lw] = 1.0
    for s in range(S):
        # column ref := col0
        if s == ref:
            D[0, 0] += col0[s]
        elif s == last:
            D[1, 0] += col0[s]
        else:
            U[s, 0] += col0[s]
        _put(abx, U, V, D, lw, uw, ref, last, s, s, 1.0)
        ai = pol_idx[s]
        a = actions[ai]
        if a == 0:
            _put(abx, U, V, D, lw, uw, ref, last, s, s + 1 if s <= s_max else s, -1.0)
            continue
        ss = s if s <= s_max else s_max
        base = ss - a
        m = s_max - base
        hi = khi[ai] if khi[ai] < m else m
        k0 = klo[ai]
        if s <= s_max and s != ref and not (base + k0 <= ref <= base + hi):
            off = uw + lw - s + base  # fast path: contiguous band writes
            row = abx[s]
            for k in range(k0, hi + 1):
                row[off + k] -= P[ai, k]
        else:
            for k in range(k0, hi + 1):
                _put(abx, U, V, D, lw, uw, ref, last, s, base + k, -P[ai, k])
        _put(abx, U, V, D, lw, uw, ref, last, s, last, -SF[ai, m])
    return abx, lw, uw, U, V, D


@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def policy_residual(h, g, c, pol_idx, P, SF, klo, khi, actions, y, s_max):
    """max_s |h(s) − c(s) + g·y(s) − Σ_j m̂(j|s,π(s))h(j)| — the residual of eq. 20 under π."""
    worst = 0.0
    for s in range(s_max + 2):
        ai = pol_idx[s]
        r = h[s] - c[s] + g * y[ai] - expected_next(h, s, ai, actions[ai], P, SF, klo, khi, s_max)
        if abs(r) > worst:
            worst = abs(r)
    return worst


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
