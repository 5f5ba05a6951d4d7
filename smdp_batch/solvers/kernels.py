"""The Bellman sweep kernels over the compact truncated SMDP (:mod:`smdp_batch.model.truncation`), numba.

The expected next value Σ_j m̂(j|s,a)·h(j) (eq. 18) out of (s, a ≠ 0) is a sliding dot product of
p^[a] against h starting at s − a, plus the tail mass times h(S_o); waiting reads h(s+1).  One
family computes it everywhere:

* :func:`expected_next` — one (s, a) pair; RVI's sweep (eq. 29) and the residual of eq. 20
  (:func:`policy_residual`, which certifies every evaluation) call it; :func:`expected_next_table`
  is its (S, A) table, which the pivoting PI loop uses (near-multichain policies, where |h| is
  huge and the summation order matters);
* :func:`window_filters` + :func:`improve` — all S×A expectations as one BLAS product: every
  action's p^[a] shifted into the common frame j = next state − queue length is a column of F
  (W × A, W ≤ Bmax + K), multiplied by the S × W windows of h.  The numba PI loop and the JAX
  backend use it.

Both PI loops then apply one improvement rule, :func:`improve_step`.

Everything is O(S·A·K) per sweep, K = the arrival-count support.
"""

from __future__ import annotations

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file

__all__ = ["expected_next", "expected_next_table", "improve", "improve_step", "policy_residual", "usable_actions",
           "window_filters", "window_span"]


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
    # P and SF stop where the law's tail is exactly 0 (a compact model): P(K > m) = 0 past their columns
    tail = SF[ai, m] if m < SF.shape[1] else 0.0
    return _dot(P[ai, lo : hi + 1], h[base + lo : base + hi + 1]) + tail * h[s_max + 1]


@njit(cache=True, inline="always", fastmath={"reassoc", "contract"})
def _dot(x, z):
    """Σ x[t]·z[t] over equal-length 1-D views (non-negative indices: the loop vectorises)."""
    acc = 0.0
    for t in range(x.shape[0]):
        acc += x[t] * z[t]
    return acc


@njit(cache=True, fastmath={"reassoc", "contract"}, nogil=True)
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


@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, nogil=True, inline="always")
def policy_residual(h, g, c, py, pol_idx, P, SF, klo, khi, actions, s_max):
    """max_s |h(s) − c(s) + g·y(s) − Σ_j m̂(j|s,π(s))h(j)| — the residual of eq. 20 under π (c, y per state)."""
    worst = 0.0
    for s in range(s_max + 2):
        ai = pol_idx[s]
        r = h[s] - c[s] + g * py[s] - expected_next(h, s, ai, actions[ai], P, SF, klo, khi, s_max)
        if abs(r) > worst:
            worst = abs(r)
    return worst


def usable_actions(actions: np.ndarray, s_max: int) -> int:
    """How many of ``actions`` (ascending, waiting first) are feasible somewhere on 0..s_max (a ≤ s_max).

    The others are infeasible at every state of the truncation (a > n), so the sweeps skip them: a
    truncation shorter than Bmax (the probable-range search of :mod:`.search`) pays only for its own
    batch sizes."""
    return 1 + int(np.searchsorted(actions[1:], s_max, side="right"))


def window_span(klo: np.ndarray, khi: np.ndarray, actions: np.ndarray, s_max: int) -> tuple[int, int]:
    """(jmin, jmax): the range of next − level over every usable action's support (waiting: +1);
    W = jmax − jmin + 1."""
    Au = usable_actions(actions, s_max)
    lo = klo[1:Au] - actions[1:Au]
    hi = khi[1:Au] - actions[1:Au]
    return min(1, int(lo.min(initial=1))), max(1, int(hi.max(initial=1)))


def window_filters(P: np.ndarray, SF: np.ndarray, klo: np.ndarray, khi: np.ndarray, actions: np.ndarray,
                   s_max: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Every action's transition law in one frame j = next − level ∈ [jmin, jmax]; (F, tail, jmin).

    Column a of F (W × Au) holds p^[a]_{j+a} over the kernels' support [klo, khi] (waiting: a 1 at
    j = +1), and tail[a] = P(K > khi) (not negligible when khi is capped at s_max).  F has a column for
    each of the Au :func:`usable_actions` only: the actions above s_max are infeasible everywhere (tail 0).
    So Σ_j F[j−jmin, a]·h̄(s + j) + tail[a]·h(S_o) = Σ_j m̂(j|s,a) h(j) when h̄ extends h by h(S_o)
    past s_max: all mass beyond s_max lands on S_o, as in eq. 18.
    """
    Au = usable_actions(actions, s_max)
    jmin, jmax = window_span(klo, khi, actions, s_max)
    F = np.zeros((jmax - jmin + 1, Au))
    tail = np.zeros(actions.shape[0])
    F[1 - jmin, 0] = 1.0
    if Au > 1:  # every serving action's support at once: k ∈ [klo, khi] lands on row k − a − jmin of its column
        lo, hi, a = klo[1:Au], khi[1:Au], actions[1:Au]
        k = np.arange(int(hi.max()) + 1)
        on = (k >= lo[:, None]) & (k <= hi[:, None])
        cols = np.broadcast_to(np.arange(1, Au)[:, None], on.shape)
        F[(k[None, :] - a[:, None] - jmin)[on], cols[on]] = P[1:Au, : k.size][on]
        tail[1:Au] = SF[np.arange(1, Au), hi]
    return F, tail, jmin


@njit(cache=True, nogil=True)
def improve_step(pol, g, EH, costs, Y, s_max):
    """PI's improvement rule (Puterman §11.4): argmin_a Q(s,a), keeping pol[s] unless beaten by > 1e-11 relative.

    Q(s,a) = ĉ(s,a) − g·y(s,a) + EH[min(s, s_max), a], with EH[r, a] = Σ_j m̂(j|r,a)h(j) (S_o reads
    row s_max: the same expectations).  ``costs`` is +inf where a is infeasible; ``Y`` (S × A) the
    sojourns (:meth:`~smdp_batch.model.truncation.TruncatedSMDP.sojourn`), or (1, A) when every state shares
    them (:meth:`~smdp_batch.model.truncation.TruncatedSMDP.sojourn_rows`).
    """
    S = s_max + 2
    A = costs.shape[1]
    shared = Y.shape[0] == 1
    new = pol.copy()
    for s in range(S):
        r = s if s <= s_max else s_max
        ys = 0 if shared else s
        cur = pol[s]
        qcur = costs[s, cur] - g * Y[ys, cur] + EH[r, cur]
        qbest = np.inf
        best = cur
        for ai in range(A):
            q = costs[s, ai] - g * Y[ys, ai] + EH[r, ai]
            if q < qbest:
                qbest = q
                best = ai
        if qcur - qbest > 1e-11 * (1.0 + abs(qcur)):
            new[s] = best
    return new


#: Rows of the window matrix :func:`improve` multiplies at a time.
BLOCK = 8192


def improve(pol: np.ndarray, g: float, h: np.ndarray, costs: np.ndarray, F: np.ndarray, tail: np.ndarray,
            jmin: int, Y: np.ndarray, s_max: int) -> np.ndarray:
    """:func:`improve_step` with the expectations for all (s, a) from one matrix product (BLAS).

    The (S, W) windows of h̄ times the filters F of :func:`window_filters` — O(S·W·A) flops at
    BLAS speed, in blocks of :data:`BLOCK` rows, so memory is O(S·A + BLOCK·W) (at s_max = 10⁶ with
    exponential service the whole window matrix would be 11 GB).  Its sums are grouped differently from
    :func:`expected_next`'s: equal to round-off, which matters only where |h| is astronomically
    large (a near-multichain policy), and that is the pivoting loop's job, which uses the sliding
    :func:`expected_next_table` instead.  NumPy drives the blocks (a few per sweep); only the
    improvement rule is a kernel, so a first run compiles nothing here but :func:`improve_step`.
    """
    S = s_max + 2
    n = s_max + 1
    Wd, Au = F.shape  # the usable actions; the rest (above s_max) are +inf in ``costs``: EH stays 0 there
    # hbar[i] = h̄(i + jmin): 0 left of state 0 (infeasible there), h(S_o) past s_max
    hbar = np.full(n + Wd, h[S - 1])
    lo, hi = max(0, -jmin), S - 1 - jmin  # i of state 0 (or 0), and of S_o
    hbar[:lo] = 0.0
    hbar[lo:hi] = h[lo + jmin : S - 1]
    # row i of the (n, Wd) windows is hbar[i : i + Wd] (a view, only read: copied block by block below)
    windows = np.ndarray((n, Wd), dtype=np.float64, buffer=hbar, strides=(hbar.itemsize, hbar.itemsize))
    EH = np.empty((n, costs.shape[1]))
    EH[:, Au:] = 0.0
    Hw = np.empty((min(n, BLOCK), Wd))
    for s0 in range(0, n, BLOCK):
        m = min(n, s0 + BLOCK) - s0
        np.copyto(Hw[:m], windows[s0 : s0 + m])  # BLAS wants a contiguous block, not the strided view
        np.matmul(Hw[:m], F, out=EH[s0 : s0 + m, :Au])
    EH += tail[None, :] * h[S - 1]
    return improve_step(pol, g, EH, costs, Y, s_max)
