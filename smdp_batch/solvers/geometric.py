"""Exponential batch times: exact policy iteration in O(S) memory (paper 004 eqs. 18–22).

With an exponential batch time of mean l(b) the arrivals during a batch of b are geometric,
p_k = (1 − q_b)·q_bᵏ with q_b = λl(b)/(1 + λl(b)) (eqs. 4–6).  On the tail boundary of
:mod:`~smdp_batch.model.truncation` (B served above s_max, each jump past s_max charged its excursion, S_o a
copy of s_max) the bias equation (eq. 20) of state s under batch a, j = s − a, is

    h(s) = c(s, a) − g·l(a) + V_a(j),   V_a(i) = (1 − q)·h(i) + q·V_a(i + 1),
    V_a(s_max + 1) = h(s_max) + Cc_a − g·Ct_a,

with c(s, a) = fixed + slope·s (eq. 11) and Cc_a, Ct_a the excursion's expected cost and time after a
geometric overshoot (mean 1/(1 − q); the truncation module's e₁ = q^{m+1}/(1 − q) and
e₂ = q^{m+1}[(1 + q)/(1 − q)² + 2s_max/(1 − q)]).  Where s and s + 1 serve the same a, row s − q·row(s+1) has
three terms,

    h(s) − q·h(s+1) − (1 − q)·h(s − a) + g·l(a)(1 − q) = c(s, a) − q·c(s+1, a),                  (T)

so the system is banded with one super-diagonal.  Doolittle's LU of (T) without pivoting (an M-matrix once
h(ref) = 0) keeps U bidiagonal, and row s of L is ℓ_s·Π γ/U_t on its window [s − a, s): a product fold that
a sliding-window aggregate keeps in O(1) per row (:func:`_sweep`).  Factor and solve: O(S) time and memory.
The general banded solver (:mod:`.banded`) needs O(S·Bmax·K), K ≈ 40·λl(Bmax) the arrival support —
2·10¹³ operations at Bmax 1 024, ρ = 0.9, where the optimal batch grows until n ≈ 1.5·10⁵.

A row whose successor serves another action (an *end*: about one per batch size) keeps its exact equation,
written as (T) plus q·(Q_a(s+1) − h(s+1)) with Q_a(s+1) a geometric sum over h (all ends' sums at once by
:func:`.geometric_sums.window_sums`): the exact operator (:func:`_matvec`) and its transpose (:func:`_rmatvec`),
which :mod:`.geometric_system` solves by GMRES with (T) as preconditioner.  The same recursion gives V_a(·) for
every allowed a in O(S·A) time and O(S) memory, with no arrival table: the residual's Q(s, π(s)) and the
improvement step's best Q(s, a), which policy iteration (:mod:`.geometric_pi`) uses — over every action
(:func:`_q_full`), or over the actions near each state's own (:func:`_q_pass` on :func:`_ranges`; its own
action alone for a residual).

Metrics (W̄, P̄, batches, Δ and the overflow share) are the gains of the same policy under their own cost
vectors (each of the form fixed + slope·s + q^{m+1}·cc), ĝ = π·c/π·y; throughput is λ (flow balance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..kernel_cache import njit
from ..model.problem import BatchingProblem
from ..model.truncation import excursion_rates
from .geometric_sums import _geo_sum

__all__ = ["Costs", "GeometricModel", "geometric_model"]

#: Values below this are set to 0 in the kernels' outputs (the decaying parts of a solve would otherwise turn
#: subnormal, and a subnormal makes each later floating-point operation on it ~100× slower).
TINY = 1e-250


@dataclass(frozen=True)
class Costs:
    """A cost per decision epoch: fixed[a] + slope[a]·s, plus q_a^{m+1}·cc[a] for the excursion past s_max."""

    fixed: np.ndarray
    slope: np.ndarray
    cc: np.ndarray


@dataclass(frozen=True)
class GeometricModel:
    """The tail-boundary SMDP of exponential batch times on states 0..s_max (action 0 waits, i ≥ 1 serves
    ``sizes[i]``); ``cost`` is the objective w1·holding + w2·energy, ``parts`` its metrics' cost vectors."""

    problem: BatchingProblem
    s_max: int
    sizes: np.ndarray  # int64 (A,), 0 first
    q: np.ndarray  # (A,) q_a; 1 for waiting
    y: np.ndarray  # (A,) l(a) ms; 1/λ for waiting
    ct: np.ndarray  # (A,) the excursion's expected time after the overshoot, per q^{m+1}
    cost: Costs
    parts: dict  # name -> Costs: "hold", "energy", "batches", "excursion", "leave", "epochs"
    tail: int  # action index of B

    # what Solution and the CLI read off a truncated model
    abstract_cost: float = 0.0
    boundary: str = "tail"
    extra = None

    @property
    def tail_action(self) -> int:
        return int(self.sizes[self.tail])


def geometric_model(problem: BatchingProblem, s_max: int, tail: int | None = None) -> GeometricModel:
    """The model of the module doc at truncation ``s_max``; ``tail`` = B (default Bmax) must drain the queue."""
    p = problem.single()
    lam, w1, w2 = p.lam, p.w1, p.w2
    sizes = np.concatenate([[0], np.asarray(p.batch_sizes, dtype=np.int64)])
    l = p.latency_ms()
    B = int(p.bmax if tail is None else tail)
    iB = int(np.searchsorted(sizes, B))
    if iB >= sizes.size or sizes[iB] != B or not lam * l[iB - 1] < B:
        raise InputError(f"the tail action must be an allowed batch size that drains the queue, got {B}")
    if not B <= s_max:
        raise InputError(f"s_max = {s_max} must be at least the tail action B = {B}")
    y = np.concatenate([[1.0 / lam], l])
    x = lam * l
    q = np.concatenate([[1.0], x / (1.0 + x)])
    energy = np.concatenate([[0.0], p.energy_mj()])
    hold_fixed = np.concatenate([[0.0], 0.5 * p.second_moments()])  # E G² = 2l² for exponential service
    # the excursion under B per q^{m+1}: E e⁺ = q^{m+1}·e1, E e⁺(e⁺ + 2s_max) = q^{m+1}·e2 (geometric overshoot)
    c_t, c_e, c_h1, c_h2 = excursion_rates(p, B)
    lB = float(l[iB - 1])
    qa = q[1:]
    e1 = np.concatenate([[0.0], 1.0 / (1.0 - qa)])
    e2 = np.concatenate([[0.0], (1.0 + qa) / (1.0 - qa) ** 2 + 2.0 * s_max / (1.0 - qa)])
    ct = c_t * e1
    hold_cc = c_h2 * e2 + c_h1 * e1
    energy_cc = c_e * e1
    zero = np.zeros(sizes.size)
    serving = (sizes > 0).astype(np.float64)
    hold = Costs(hold_fixed, y / lam, hold_cc)
    en = Costs(energy, zero, energy_cc)
    cost = Costs(w2 * energy + w1 * hold_fixed, w1 * y / lam, w2 * energy_cc + w1 * hold_cc)
    parts = {
        "hold": hold, "energy": en,
        "batches": Costs(serving, zero, ct / lB),  # the excursion's batches: its time over l(B)
        "excursion": Costs(zero, zero, cost.cc),
        "leave": Costs(zero, zero, serving),  # q^{m+1}: the chance the epoch leaves the truncation
        "epochs": Costs(np.ones(sizes.size), zero, zero),
    }
    return GeometricModel(p, int(s_max), sizes, q, y, ct, cost, parts, iB)


# ----------------------------------------------------------------------------------- kernels
@njit(cache=True, nogil=True)
def _rows(pol, sizes, q, S):
    """Per row of (T): lower column (−1: none), lower value, super value (at s+1; folded into the diagonal at
    the top), diagonal, and whether the row is an end (the next row serves another action)."""
    lc = np.full(S, -1, dtype=np.int64)
    lv = np.zeros(S)
    up = np.zeros(S)
    dg = np.ones(S)
    end = np.zeros(S, dtype=np.bool_)
    for s in range(S):
        ai = pol[s]
        a = sizes[ai]
        qa = q[ai]
        if a == 0:
            up[s] = -1.0
            continue
        lc[s] = s - a
        lv[s] = -(1.0 - qa)
        if s == S - 1:
            dg[s] -= qa
            end[s] = True
        else:
            up[s] = -qa
            end[s] = pol[s + 1] != ai
    return lc, lv, up, dg, end


@njit(cache=True, nogil=True)
def _pivots(U, ue):
    """(2, S): 1/U and γ = −ue/U, what :func:`_sweep` solves with (computed once per factorisation)."""
    piv = np.empty((2, U.size))
    for s in range(U.size):
        piv[0, s] = 1.0 / U[s]
        piv[1, s] = -ue[s] * piv[0, s]
    return piv


@njit(cache=True, nogil=True)
def _flush_small(z, a, X, b, Y):
    """z − a·X − b·Y in place (the Woodbury border's correction; a = b = 0 for none), then its entries below
    1e-200·max|·| set to 0 (no subnormals); one pass each, no temporaries."""
    m = 0.0
    for i in range(z.size):
        v = z[i] - a * X[i] - b * Y[i]
        z[i] = v
        m = max(m, abs(v))
    t = 1e-200 * m
    for i in range(z.size):
        if abs(z[i]) < t:
            z[i] = 0.0
    return z


@njit(cache=True, nogil=True)
def _effective_up(up, ref):
    """The super-diagonal of B: row ``ref`` and column ``ref`` dropped (they are the identity's)."""
    u = up.copy()
    u[ref] = 0.0
    if ref > 0:
        u[ref - 1] = 0.0
    return u


@njit(cache=True, nogil=True)
def _sweep(ptr, cols, vals, ue, dg, ref, piv, f, factor, work):
    """Doolittle's LU of B (factor=True: returns the pivots U) or its forward and back solve for f, given
    ``piv`` = :func:`_pivots` of U (1/U and γ, so the sequential loops only multiply; ``dg`` is read only to
    factor).

    B has the diagonal ``dg``, the super-diagonal ``ue`` and row s's lower entries ``vals`` at ``cols``
    (CSR: ptr[s]..ptr[s+1]; none in row ``ref``, whose row and column are the identity's).  U is bidiagonal,
    and an entry ℓ at column c < s puts ℓ·(Π_{τ=c}^{t−1} γ_τ)/U_t into row s of L for t ∈ [c, s−1]
    (γ_t = −ue[t]/U_t), so U_s = dg_s + Σ ℓ·Π_{t=c}^{s−1} γ_t and the forward step needs Σ ℓ·Σ_t (Π_{τ=c}^{t−1}
    γ_τ)·y_t/U_t.  Both are the fold of (P₁, S₁)∘(P₂, S₂) = (P₁P₂, S₁ + P₁S₂) over [c, s), an associative
    operation kept by the two-stack sliding-window aggregate: suffix folds of a frozen segment [φ, β) and one
    running fold of [β, s).  Windows that move right cost O(1) amortised per row; no subtraction, so no
    cancellation.  (T) has one lower entry per row; its transpose, reversed, has one per row on average
    (:func:`~.geometric_system._transposed`).  The fold's arrays are written before they are read (a refold
    writes [lo, s) before any window reads it), so they live in ``work`` (4 × S, the caller's, reused: fresh
    arrays of this size cost a page fault per 4 KiB on every call).
    """
    S = dg.size
    z = work[0]
    fP = work[1]
    fS = work[2]
    y = work[3]
    if not factor:
        y[:] = f
    if factor:
        gam = np.empty(S)
        Uo = np.empty(S)
        inv = Uo
    else:
        inv = piv[0]
        gam = piv[1]
    phi = 0
    beta = 0
    BP = 1.0
    BS = 0.0
    for s in range(S):
        acc_u = 0.0
        acc_y = 0.0
        k0 = ptr[s]
        k1 = ptr[s + 1]
        if k1 > k0:
            lo = s
            outside = False
            for k in range(k0, k1):
                c = cols[k]
                lo = min(lo, c)
                if c < phi or c >= beta:
                    outside = True
            if outside:  # refold: suffix folds of [lo, s) and an empty running fold
                lo = min(lo, beta)
                aP = 1.0
                aS = 0.0
                for t in range(s - 1, lo - 1, -1):
                    aS = z[t] + gam[t] * aS
                    aP = gam[t] * aP
                    fP[t] = aP
                    fS[t] = aS
                phi = lo
                beta = s
                BP = 1.0
                BS = 0.0
            if factor:
                for k in range(k0, k1):
                    acc_u += vals[k] * (fP[cols[k]] * BP)
            else:
                for k in range(k0, k1):
                    c = cols[k]
                    acc_y += vals[k] * (fS[c] + fP[c] * BS)
        if factor:
            Uo[s] = 1.0 if s == ref else dg[s] + acc_u
            gam[s] = -ue[s] / Uo[s] if Uo[s] != 0.0 else 0.0
            z[s] = 0.0
        else:
            if s != ref:
                y[s] -= acc_y
            if abs(y[s]) < TINY:
                y[s] = 0.0
            z[s] = y[s] * inv[s]
        # push s onto the running fold
        BS += BP * z[s]
        BP *= gam[s]
    if factor:
        return Uo
    x = np.empty(S)
    for s in range(S - 1, -1, -1):
        v = y[s]
        if s + 1 < S:
            v -= ue[s] * x[s + 1]
        v *= inv[s]
        x[s] = v if abs(v) > TINY else 0.0  # no subnormals: they make every later dot product crawl
    return x


#: Terms of V_a's sum below this weight are dropped (relative to the largest, 1 − q); 41/(1 − q) terms at most.
V_EPS = 1e-18


@njit(cache=True, inline="always")
def _v_terms(i, qa, s_max):
    """(n, nmax): the terms of V_a(i)'s sum kept (those with qᵏ ≥ :data:`V_EPS`) and the terms up to s_max; the
    excursion's term q^nmax·(h(s_max) + Cc − g·Ct) counts only when n = nmax (else it is below V_EPS too)."""
    nmax = s_max - i + 1
    kcut = int(math.log(V_EPS) / math.log(qa)) + 1 if qa > 0.0 else 1
    return min(nmax, kcut), nmax


@njit(cache=True, inline="always")
def _v_at(h, g, i, qa, cc, ct, s_max):
    """V_a(i) for i ≤ s_max + 1 (module doc): Σ_k (1 − q)qᵏ·h(i + k) up to s_max, then the excursion's
    term, over the terms :func:`_v_terms` keeps."""
    n, nmax = _v_terms(i, qa, s_max)
    acc = _geo_sum(h, i, n, qa)
    if n < nmax:
        return acc
    return acc + qa ** nmax * (h[s_max] + cc - g * ct)


@njit(cache=True, nogil=True)
def _end_windows(pol, sizes, q, end, s_max):
    """The end rows (in order) and their V_a windows: row, start i = s + 1 − a, terms kept n, ratio q, and
    whether the window reaches s_max (then the excursion's term counts, :func:`_v_terms`)."""
    E = 0
    for s in range(s_max + 1):
        if end[s]:
            E += 1
    rows = np.empty(E, dtype=np.int64)
    starts = np.empty(E, dtype=np.int64)
    counts = np.empty(E, dtype=np.int64)
    qs = np.empty(E)
    full = np.zeros(E, dtype=np.bool_)
    e = 0
    for s in range(s_max + 1):
        if end[s]:
            ai = pol[s]
            i = s + 1 - sizes[ai]
            n, nmax = _v_terms(i, q[ai], s_max)
            rows[e], starts[e], counts[e], qs[e], full[e] = s, i, n, q[ai], n == nmax
            e += 1
    return rows, starts, counts, qs, full


@njit(cache=True, nogil=True)
def _matvec(x, V, win, pol, sizes, q, y, ct, lc, lv, up, dg, end, ref, lam_inv):
    """The exact system's operator on x (x[ref] = g, h(ref) = 0): rows (T), and at ends
    (T) − q·(Q_a(s+1) − h(s+1)) without its constant part.  ``win`` = :func:`_end_windows`, V the ends' window
    sums over x (:func:`.window_sums`, computed by the caller), here corrected for h(ref) = 0."""
    S = x.size
    s_max = S - 1
    g = x[ref]
    h = x
    starts, counts, full = win[1], win[2], win[4]
    out = np.empty(S)
    e = 0
    for s in range(S):
        ai = pol[s]
        hs = h[s] if s != ref else 0.0
        v = dg[s] * hs
        if s + 1 < S:
            v += up[s] * (h[s + 1] if s + 1 != ref else 0.0)
        c = lc[s]
        if c >= 0:
            v += lv[s] * (h[c] if c != ref else 0.0)
        v += g * (y[ai] * (1.0 - q[ai]) if sizes[ai] > 0 else lam_inv)
        if end[s]:
            qa = q[ai]
            i = starts[e]
            Ve = V[e]
            if i <= ref < i + counts[e]:  # the sum took x[ref] = g for h(ref) = 0
                Ve -= (1.0 - qa) * qa ** (ref - i) * g
            if full[e]:
                Ve += qa ** (s_max - i + 1) * ((h[s_max] if s_max != ref else 0.0) - g * ct[ai])
            e += 1
            t = s + 1 if s + 1 < S else s_max
            v -= qa * (-g * y[ai] + Ve - (h[t] if t != ref else 0.0))
        out[s] = v if abs(v) > TINY else 0.0
    return out


@njit(cache=True, nogil=True)
def _rmatvec(w, win, pol, sizes, q, y, ct, lc, lv, up, dg, end, ref, lam_inv):
    """The transpose of :func:`_matvec`'s operator on w, but for the ends' geometric runs: each row's coefficients
    scattered into its columns, the g coefficients gathered into entry ref; returns it and the coefficient of each
    end's window, which the caller spreads by :func:`.window_scatter` (entry ref then reset: h(ref) = 0 is no
    unknown)."""
    S = w.size
    s_max = S - 1
    starts, full = win[1], win[4]
    oh = np.zeros(S)
    og = 0.0
    coefs = np.zeros(starts.size)
    e = 0
    for s in range(S):
        ws = w[s]
        ai = pol[s]
        if end[s]:
            e += 1
        if ws == 0.0:
            continue
        oh[s] += dg[s] * ws
        if s + 1 < S:
            oh[s + 1] += up[s] * ws
        if lc[s] >= 0:
            oh[lc[s]] += lv[s] * ws
        og += ws * (y[ai] * (1.0 - q[ai]) if sizes[ai] > 0 else lam_inv)
        if end[s]:
            qa = q[ai]
            coef = -qa * ws
            coefs[e - 1] = coef
            og -= coef * y[ai]
            if full[e - 1]:
                t = coef * qa ** (s_max - starts[e - 1] + 1)
                oh[s_max] += t
                og -= t * ct[ai]
            oh[s + 1 if s + 1 < S else s_max] -= coef
    oh[ref] = og
    for s in range(S):
        if abs(oh[s]) < TINY:
            oh[s] = 0.0
    return oh, coefs


@njit(cache=True, nogil=True)
def _rhs(pol, sizes, q, fixed, slope, cc, end, S):
    """The exact system's right-hand side for the cost fixed + slope·s + q^{m+1}·cc."""
    s_max = S - 1
    f = np.empty(S)
    for s in range(S):
        ai = pol[s]
        c0 = fixed[ai] + slope[ai] * s
        if sizes[ai] == 0:
            f[s] = c0
            continue
        qa = q[ai]
        c1 = fixed[ai] + slope[ai] * (s + 1)
        f[s] = c0 - qa * c1
        if end[s]:  # V_a(s + 1 − a)'s constant: the excursion's cost, where its term is kept
            n, nmax = _v_terms(s + 1 - sizes[ai], qa, s_max)
            f[s] += qa * (c1 + (qa ** nmax * cc[ai] if n == nmax else 0.0))
    return f


@njit(cache=True, nogil=True)
def _q_pass(h, g, pol, sizes, q, y, fixed, slope, cc, ct, s_max, tail, lo, hi):
    """Q(s, π(s)) and the best Q(s, a) with its action, over the allowed a (a ≤ s; B alone at s_max) and, for
    action index ai, the states lo[ai]..hi[ai] only (:func:`_ranges`; the whole of them for a full improvement).
    Each V_a(·) runs by its recursion down that range, started at its top from s_max or by :func:`_v_at`'s sum,
    whichever is shorter: O(Σ ranges + starts) time, O(S) memory (no S × A table).  Q(s, π(s)) is exact where
    π(s)'s range holds s (every range of :func:`_ranges` holds its own action's states)."""
    S = s_max + 1
    A = sizes.size
    qcur = np.full(S, np.inf)
    qbest = np.full(S, np.inf)
    best = pol.copy()
    for ai in range(A):
        a = sizes[ai]
        top = min(hi[ai], s_max)
        bot = max(lo[ai], a)
        if top < bot:
            continue
        if a == 0:
            for s in range(bot, min(top, S - 2) + 1):
                v = fixed[ai] + slope[ai] * s - g * y[ai] + h[s + 1]
                if pol[s] == ai:
                    qcur[s] = v
                if v < qbest[s]:
                    qbest[s] = v
                    best[s] = ai
            continue
        if top == s_max and ai != tail:
            top -= 1  # s_max serves B alone
        qa = q[ai]
        j0 = top - a + 1  # V_a(j0) starts the recursion
        n, nmax = _v_terms(j0, qa, s_max)
        if nmax <= n + 64:  # from s_max: the recursion's own start, exact
            V = h[s_max] + cc[ai] - g * ct[ai]
            for j in range(s_max, j0 - 1, -1):
                V = (1.0 - qa) * h[j] + qa * V
        else:
            V = _v_at(h, g, j0, qa, cc[ai], ct[ai], s_max)
        base = fixed[ai] - g * y[ai]
        sl = slope[ai]
        for s in range(top, bot - 1, -1):
            V = (1.0 - qa) * h[s - a] + qa * V
            v = base + sl * s + V
            if pol[s] == ai:
                qcur[s] = v
            if v < qbest[s]:
                qbest[s] = v
                best[s] = ai
    return qcur, qbest, best


@njit(cache=True, fastmath={"contract", "nnan", "ninf", "nsz"}, nogil=True)
def _q_full(h, g, pol, sizes, q, y, fixed, slope, cc, ct, s_max, tail):
    """:func:`_q_pass` over every action (a full improvement), state by state from s_max down with every
    V_a(s − a) kept in one array: the inner loop runs over the actions and vectorises (with consecutive sizes
    h(s − a) is a contiguous run of h reversed), where :func:`_q_pass` runs one long sequential recursion per
    action: 2× faster at Bmax 1 024.  The same recursions, so the same values up to fused multiply–adds, and the
    same choice among equal Q (the least action index)."""
    S = s_max + 1
    A = sizes.size
    qcur = np.empty(S)
    qbest = np.empty(S)
    best = pol.copy()
    nA = A  # the actions with a ≤ s are 0..nA − 1 (sizes ascending)
    while nA > 1 and sizes[nA - 1] > s_max:
        nA -= 1
    V = np.zeros(nA)  # V[ai] = V_a(s − a + 1) on entry to state s
    p = np.zeros(nA)
    base = np.zeros(nA)
    consecutive = True
    for ai in range(1, nA):
        qa = q[ai]
        v = h[s_max] + cc[ai] - g * ct[ai]
        for j in range(s_max, s_max - sizes[ai], -1):
            v = (1.0 - qa) * h[j] + qa * v
        V[ai] = v
        p[ai] = 1.0 - qa
        base[ai] = fixed[ai] - g * y[ai]
        consecutive = consecutive and sizes[ai] == ai
    hr = h[::-1].copy() if consecutive else np.empty(0)  # hr[s_max − s + a] = h(s − a)
    Q = np.empty(nA)
    for s in range(s_max, -1, -1):
        while nA > 1 and sizes[nA - 1] > s:
            nA -= 1
        fs = float(s)
        if consecutive:
            off = s_max - s
            for ai in range(1, nA):
                v = p[ai] * hr[off + ai] + q[ai] * V[ai]
                V[ai] = v
                Q[ai] = base[ai] + slope[ai] * fs + v
        else:
            for ai in range(1, nA):
                v = p[ai] * h[s - sizes[ai]] + q[ai] * V[ai]
                V[ai] = v
                Q[ai] = base[ai] + slope[ai] * fs + v
        if s == s_max:  # B alone
            qbest[s] = qcur[s] = Q[tail]
            best[s] = tail
            continue
        Q[0] = fixed[0] + slope[0] * fs - g * y[0] + h[s + 1]
        m = Q[0]
        for ai in range(1, nA):
            m = min(m, Q[ai])
        bi = 0
        while Q[bi] != m:
            bi += 1
        qbest[s] = m
        best[s] = bi
        qcur[s] = Q[pol[s]]
    return qcur, qbest, best


@njit(cache=True, nogil=True)
def _ranges(pol, A, width, s_max):
    """(lo, hi) per action index for :func:`_q_pass`: the states whose action index is within ``width`` of it
    (their hull; waiting, index 0, only within ``width`` of it too); width < 0: every state (a full improvement)."""
    lo = np.full(A, s_max + 1, dtype=np.int64)
    hi = np.full(A, -1, dtype=np.int64)
    if width < 0:
        lo[:] = 0
        hi[:] = s_max
        return lo, hi
    first = np.full(A, s_max + 1, dtype=np.int64)
    last = np.full(A, -1, dtype=np.int64)
    for s in range(s_max + 1):
        ai = pol[s]
        first[ai] = min(first[ai], s)
        last[ai] = max(last[ai], s)
    for ai in range(A):
        if last[ai] < 0:
            continue
        for bi in range(max(ai - width, 0), min(ai + width, A - 1) + 1):
            lo[bi] = min(lo[bi], first[ai])
            hi[bi] = max(hi[bi], last[ai])
    return lo, hi
