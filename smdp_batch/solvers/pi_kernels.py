"""Numba kernels for exact policy iteration in one compiled loop (paper 004 eq. 20; Puterman §11.4).

Evaluation of a policy π solves h(s) − Σ_j m̂(j|s,π)h(j) + g·y(s,π) = ĉ(s,π) with h(ref) = 0
for a recurrent ``ref`` (the first serving state).  As in :mod:`smdp_batch.linalg`, the
unknown h(ref) is replaced by g, and the system splits into

* a banded block B on states 0..s_max (row and column ref set to the identity): row s holds the
  shifted copy of p^[π(s)], so the lower width is ≤ max(a − klo_a) ≤ Bmax and the upper width
  ≤ max(khi_a − a) — the arrival support;
* a border {ref, S_o}: the g column (y) and S_o's column (tail masses) are dense.

B = I − Q with Q substochastic, and every state leaks into the border (ref is recurrent and the
chain is unichain, paper 004 Lemma 2), so B is a non-singular M-matrix: Gaussian elimination
*without pivoting* exists with positive pivots and keeps the row envelope (no fill left of a
row's first non-zero), so the LU costs O(S·lw·uw) and memory O(S·(lw+uw)) — never O(S²).  The
2×2 border is closed by a Schur complement.  Every evaluation is certified by the residual of
eq. 20; a policy that fails (numerically multichain, or a pivot ≤ 0) is reported to the caller,
which falls back to the pivoting LAPACK path of :mod:`smdp_batch.linalg`.

Improvement picks argmin_a ĉ(s,a) − g·y(a) + Σ_j m̂(j|s,a)h(j), keeping the current action
unless another is better by more than 1e-11 relative; the loop ends when the policy repeats.
All S×A expectations come from one BLAS matrix product: every action's p^[a], shifted into a
common frame j = next state − queue length, is a column of a filter matrix F (W × A, W ≤ Bmax +
the arrival support), and row s of the window matrix is h̄(s + jmin .. s + jmax).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import _band_widths, policy_residual

#: pi_loop status codes
CONVERGED, MAX_ITER, EVAL_FAILED = 0, 1, 2


@njit(cache=True, inline="always")
def _add(ab, lw, Uo, V, D, ref, last, s, t, v):
    """A[s, t] −= v for a transition s → t of mass v (column ref is dropped: h(ref) ≡ 0)."""
    if t == ref:
        return
    if s == ref or s == last:
        r = 0 if s == ref else 1
        if t == last:
            D[r, 1] -= v
        else:
            V[r, t] -= v
    elif t == last:
        Uo[s] -= v
    else:
        ab[s, lw + t - s] -= v


@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def evaluate_policy_banded(pol, pc, P, SF, klo, khi, actions, y, s_max):
    """(ok, g, h) for the policy ``pol`` (action indices, length s_max+2) with costs ``pc[s]``.

    h is normalised to h(0) = 0.  ok is False when a pivot is not positive, the result is not
    finite, or the residual of eq. 20 exceeds 1e-7·(1 + max|h| + max|c|).
    """
    S = s_max + 2
    n = s_max + 1
    last = S - 1
    h = np.zeros(S)
    ref = 0
    for s in range(n):
        if actions[pol[s]] > 0:
            ref = s
            break
    lw, uw = _band_widths(pol, klo, khi, actions, s_max)
    W = lw + uw + 1
    ab = np.zeros((n, W))
    Ug = np.zeros(n)
    Uo = np.zeros(n)
    rin = np.zeros(n)
    V = np.zeros((2, n))
    D = np.zeros((2, 2))
    ext = np.empty(n, dtype=np.int64)  # last non-zero column of each band row (U's profile)
    for s in range(n):
        ab[s, lw] = 1.0
        ext[s] = s
    for s in range(S):
        ai = pol[s]
        a = actions[ai]
        if s == ref:
            D[0, 0] = y[ai]
        elif s == last:
            D[1, 0] = y[ai]
            D[1, 1] += 1.0
        else:
            Ug[s] = y[ai]
            rin[s] = pc[s]
        if a == 0:
            t = s + 1 if s <= s_max else s
            _add(ab, lw, Uo, V, D, ref, last, s, t, 1.0)
            if s < n and s != ref and t < n and t > ext[s]:
                ext[s] = t
            continue
        lev = s if s <= s_max else s_max
        base = lev - a
        m = s_max - base
        top = khi[ai] if khi[ai] < m else m
        k0 = klo[ai]
        L = top + 1 - k0
        Pr = P[ai, k0 : top + 1]  # targets base+k0..base+top ≤ s_max: band columns
        if s < n and s != ref:
            row = ab[s, lw - s + base + k0 : lw - s + base + k0 + L]
        else:
            row = V[0 if s == ref else 1, base + k0 : base + k0 + L]
        for t in range(L):
            row[t] -= Pr[t]
        if s < n and s != ref and base + k0 <= ref <= base + top:
            ab[s, lw - s + ref] = 0.0  # column ref is dropped: h(ref) ≡ 0
        _add(ab, lw, Uo, V, D, ref, last, s, last, SF[ai, m])
        if s < n and s != ref and base + top > ext[s]:
            ext[s] = base + top
    # ---- LU without pivoting, by rows (row i is eliminated by the rows k < i above it); the row
    # envelope is kept, and ext tracks each U row's last non-zero (its fill from rows above)
    for i in range(n):
        ri = ab[i]
        k0 = i - lw if i - lw > 0 else 0
        for k in range(k0, i):
            o = lw + k - i
            lik = ri[o]
            if lik == 0.0:
                continue
            rk = ab[k]
            lik /= rk[lw]
            ri[o] = lik
            L = ext[k] - k
            dst = ri[o + 1 : o + 1 + L]
            src = rk[lw + 1 : lw + 1 + L]
            for t in range(L):
                dst[t] -= lik * src[t]
            if ext[k] > ext[i]:
                ext[i] = ext[k]
        if not ri[lw] > 0.0:
            return False, 0.0, h
    # ---- solve B z = rhs for rhs in (Ug, Uo, rin): forward (unit L), then backward (U)
    for i in range(n):
        j0 = i - lw if i - lw > 0 else 0
        sg = Ug[i]
        so = Uo[i]
        sr = rin[i]
        for k in range(j0, i):
            l = ab[i, lw + k - i]
            if l != 0.0:
                sg -= l * Ug[k]
                so -= l * Uo[k]
                sr -= l * rin[k]
        Ug[i] = sg
        Uo[i] = so
        rin[i] = sr
    for i in range(n - 1, -1, -1):
        sg = Ug[i]
        so = Uo[i]
        sr = rin[i]
        for j in range(i + 1, ext[i] + 1):
            u = ab[i, lw + j - i]
            sg -= u * Ug[j]
            so -= u * Uo[j]
            sr -= u * rin[j]
        inv = 1.0 / ab[i, lw]
        Ug[i] = sg * inv
        Uo[i] = so * inv
        rin[i] = sr * inv
    # ---- border: (D − V Z) x_b = r_b − V z_r, x_b = (g, h(S_o))
    d00, d01, d10, d11 = D[0, 0], D[0, 1], D[1, 0], D[1, 1]
    r0 = pc[ref]
    r1 = pc[last]
    V[0, ref] = 0.0  # column ref is dropped: h(ref) ≡ 0
    V[1, ref] = 0.0
    for j in range(n):
        v0 = V[0, j]
        v1 = V[1, j]
        if v0 != 0.0:
            d00 -= v0 * Ug[j]
            d01 -= v0 * Uo[j]
            r0 -= v0 * rin[j]
        if v1 != 0.0:
            d10 -= v1 * Ug[j]
            d11 -= v1 * Uo[j]
            r1 -= v1 * rin[j]
    det = d00 * d11 - d01 * d10
    scale = (abs(d00) + abs(d01)) * (abs(d10) + abs(d11))
    if not abs(det) > 1e-14 * scale:
        return False, 0.0, h
    g = (r0 * d11 - d01 * r1) / det
    hso = (d00 * r1 - d10 * r0) / det
    for s in range(n):
        h[s] = rin[s] - Ug[s] * g - Uo[s] * hso
    h[ref] = 0.0
    h[last] = hso
    h0 = h[0]
    hmax = 0.0
    cmax = 0.0
    for s in range(S):
        h[s] -= h0
        if not np.isfinite(h[s]):
            return False, 0.0, h
        if abs(h[s]) > hmax:
            hmax = abs(h[s])
        if abs(pc[s]) > cmax:
            cmax = abs(pc[s])
    if not np.isfinite(g):
        return False, 0.0, h
    res = policy_residual(h, g, pc, pol, P, SF, klo, khi, actions, y, s_max)
    if not res <= 1e-7 * (1.0 + hmax + cmax):
        return False, 0.0, h
    return True, g, h


@njit(cache=True)
def _policy_costs(pol, costs):
    pc = np.empty(pol.shape[0])
    for s in range(pol.shape[0]):
        pc[s] = costs[s, pol[s]]
    return pc


@njit(cache=True)
def window_filters(P, SF, klo, khi, actions):
    """Every action's transition law in one frame j = next − level ∈ [jmin, jmax]; (F, tail, jmin).

    Column a of F (W × A) holds p^[a]_{j+a} over the kernels' support [klo, khi] (waiting: a 1 at
    j = +1), and tail[a] = P(K > khi) (not negligible when khi is capped at s_max), so
    Σ_j F[j−jmin, a]·h̄(s + j) + tail[a]·h(S_o) = Σ_j m̂(j|s,a) h(j) when h̄ extends h by h(S_o)
    past s_max: all mass beyond s_max lands on S_o, as in eq. 18.
    """
    A = actions.shape[0]
    jmin = 1
    jmax = 1
    for ai in range(1, A):
        if klo[ai] - actions[ai] < jmin:
            jmin = klo[ai] - actions[ai]
        if khi[ai] - actions[ai] > jmax:
            jmax = khi[ai] - actions[ai]
    F = np.zeros((jmax - jmin + 1, A))
    tail = np.zeros(A)
    F[1 - jmin, 0] = 1.0
    for ai in range(1, A):
        a = actions[ai]
        for k in range(klo[ai], khi[ai] + 1):
            F[k - a - jmin, ai] = P[ai, k]
        tail[ai] = SF[ai, khi[ai]]
    return F, tail, jmin


@njit(cache=True)
def improve(pol, g, h, costs, F, tail, jmin, y, s_max):
    """The improved policy: argmin_a Q(s,a), keeping pol[s] unless beaten by > 1e-11 relative.

    Q(s,a) = ĉ(s,a) − g·y(a) + Σ_j m̂(j|s,a)h(j); the expectations for all (s, a) come from one
    matrix product (BLAS) of the (S, W) windows of h̄ with the filters F of :func:`window_filters`
    — O(S·W·A) flops at BLAS speed, O(S·(W + A)) memory.  ``costs`` is +inf where a > s.
    """
    S = s_max + 2
    n = s_max + 1
    Wd, A = F.shape
    hbar = np.empty(n + Wd)  # hbar[i] = h̄(i + jmin): 0 left of state 0 (infeasible there), h(S_o) past s_max
    for i in range(n + Wd):
        j = i + jmin
        hbar[i] = 0.0 if j < 0 else (h[j] if j <= s_max else h[S - 1])
    Hw = np.empty((n, Wd))
    for s in range(n):
        Hw[s, :] = hbar[s : s + Wd]
    EH = Hw @ F
    hso = h[S - 1]
    for s in range(n):
        for ai in range(A):
            EH[s, ai] += tail[ai] * hso
    new = pol.copy()
    for s in range(S):
        r = s if s <= s_max else s_max
        cur = pol[s]
        qcur = costs[s, cur] - g * y[cur] + EH[r, cur]
        qbest = np.inf
        best = cur
        for ai in range(A):
            q = costs[s, ai] - g * y[ai] + EH[r, ai]
            if q < qbest:
                qbest = q
                best = ai
        if qcur - qbest > 1e-11 * (1.0 + abs(qcur)):
            new[s] = best
    return new


@njit(cache=True)
def pi_loop(starts, costs, P, SF, klo, khi, actions, y, s_max, max_iter):
    """Policy iteration from the best of ``starts`` (C × S action indices; the lowest gain).

    Returns (status, pol, g, h, iterations).  status: CONVERGED (the policy repeated), MAX_ITER,
    or EVAL_FAILED — a policy did not evaluate here; ``pol`` is then the last one that did
    (``starts[0]`` if none did, with g = NaN) and the caller finishes with the pivoting solver,
    which also handles numerically multichain switches.
    """
    F, tail, jmin = window_filters(P, SF, klo, khi, actions)
    pol = starts[0].copy()
    g = np.inf
    h = np.zeros(s_max + 2)
    for c in range(starts.shape[0]):
        ok, gc, hc = evaluate_policy_banded(starts[c], _policy_costs(starts[c], costs), P, SF, klo, khi, actions, y, s_max)
        if ok and gc < g:
            pol, g, h = starts[c].copy(), gc, hc
    if not g < np.inf:
        return EVAL_FAILED, starts[0].copy(), np.nan, h, 0
    for it in range(1, max_iter + 1):
        new = improve(pol, g, h, costs, F, tail, jmin, y, s_max)
        if not np.any(new != pol):
            return CONVERGED, pol, g, h, it
        ok, g2, h2 = evaluate_policy_banded(new, _policy_costs(new, costs), P, SF, klo, khi, actions, y, s_max)
        if not ok:
            return EVAL_FAILED, pol, g, h, it - 1
        pol, g, h = new, g2, h2
    return MAX_ITER, pol, g, h, max_iter
