"""The linear system of one stationary policy, solved in O(S·(Bmax + K)) memory (paper 004 eqs. 20–21).

Under a policy π, row s of m̂ (eq. 18) is a shifted copy of p^[π(s)] plus the tail into S_o.  Both
linear problems PI and evaluation need are A x = r with A = I − M_π and one column replaced:

* the bias equations h(s) + g·y(s) − Σ_j m̂(j|s,π)h(j) = ĉ(s,π) (eq. 20): the unknown h(ref) ≡ 0 of
  a recurrent state ``ref`` gives its column to g, whose column is y(π(s));
* the stationary law μ (μ M = μ, Σ μ = 1, for eqs. 21–22): Aᵀ with ``ref``'s equation replaced by
  the normalisation (column of ones).

:func:`assemble` writes that system once, in one storage: the states 0..s_max form a banded block
B (lower width lw ≤ Bmax, upper width uw ≤ the arrival support K; row and column ``ref`` are the
identity), bordered by the two dense columns and rows of {ref, S_o}.  Row s of B is stored
contiguously at ``ab[s, lw + t − s]`` — Doolittle's row order and, padded by uw leading columns,
LAPACK's band layout of Bᵀ.  Two solvers read it:

* :func:`evaluate_policy_banded` (numba, the PI loop's evaluation): B = I − Q with Q substochastic
  and every state leaking into the border, so B is a non-singular M-matrix and Gaussian elimination
  *without pivoting* exists with positive pivots and keeps the row envelope: O(S·lw·uw) time.  The
  2×2 border closes by a Schur complement.  Certified by the residual of eq. 20.  Where S_o waits (absorbing:
  a degenerate truncation's optimum parks there) its own row gives g and h(S_o) ≡ 0 replaces the border.
* :func:`stationary_banded` (numba): the transposed system for μ on the same no-pivot factors
  (Bᵀ = Uᵀ·Lᵀ), O(S·(lw + uw)) per solve after the factorisation.
* :func:`bordered_solve` (LAPACK ``dgbtrf``/``dgbtrs`` with partial pivoting): the fallback for
  numerically multichain policies, for either system.  Pivoting the transposed band costs
  O(S·uw²) (its lower width is uw): 0.66 s against 0.16 s for the banded path at s_max = 4 000,
  hyperexponential service at ρ = 0.9.

Never O(S²) memory.  The kernels Python calls release the GIL (``nogil``): the SLO search solves a table front on
one thread while it simulates on others.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dgbtrf, dgbtrs

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from ..errors import InputError
from ..model.truncation import TruncatedSMDP
from .kernels import policy_residual

__all__ = [
    "assemble", "band_widths", "bordered_solve", "evaluate_policy_banded", "gain_bias", "reference_state",
    "reference_states", "stationary", "stationary_banded", "NO_FACTORS",
]

_SINGULAR = "the policy's embedded chain has more than one recurrent class (singular system)"


# ------------------------------------------------------------------------------------ assembly
@njit(cache=True)
def band_widths(pol_idx, klo, khi, actions, s_max):
    """(lw, uw): lower width ≤ max(a − klo_a) ≤ Bmax, upper width ≤ max(khi_a − a, 1) under π."""
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


@njit(cache=True, inline="always")
def _sub(ab, lw, U, V, D, ref, last, s, t, v):
    """A[s, t] −= v for a transition s → t of mass v; column ``ref`` belongs to col0 and is skipped."""
    if t == ref:
        return
    if s == ref or s == last:
        r = 0 if s == ref else 1
        if t == last:
            D[r, 1] -= v
        else:
            V[r, t] -= v
    elif t == last:
        U[s, 1] -= v
    else:
        ab[s, lw + t - s] -= v


@njit(cache=True)
def assemble(pol_idx, P, SF, klo, khi, actions, s_max, col0, ref):
    """A = I − m̂(·|s, π(s)) with column ``ref`` replaced by ``col0``, split for a bordered banded solve.

    Returns (ab, lw, uw, U, V, D, ext) with border order (ref, S_o):

    * ``ab`` (n × (lw+uw+1), n = s_max+1): row s of B at ``ab[s, lw + t − s]``; row ``ref`` is e_ref;
    * ``U`` = A[band, border] (n × 2), ``V`` = A[border, band] (2 × n), ``D`` = A[border, border];
    * ``ext[s]``: the last non-zero column of band row s (the row envelope the LU keeps).

    Rows keep the support [klo, khi] of p^[a]: the dropped mass is < 1e-18, below float64
    resolution of a row sum.
    """
    S = s_max + 2
    n = s_max + 1
    last = S - 1
    lw, uw = band_widths(pol_idx, klo, khi, actions, s_max)
    ab = np.zeros((n, lw + uw + 1))
    U = np.zeros((n, 2))
    V = np.zeros((2, n))
    D = np.zeros((2, 2))
    ext = np.arange(n)
    for s in range(n):
        ab[s, lw] = 1.0
    D[1, 1] = 1.0
    for s in range(S):
        band = s < n and s != ref
        if s == ref:
            D[0, 0] += col0[s]
        elif s == last:
            D[1, 0] += col0[s]
        else:
            U[s, 0] += col0[s]
        ai = pol_idx[s]
        a = actions[ai]
        if a == 0:
            t = s + 1 if s <= s_max else s
            _sub(ab, lw, U, V, D, ref, last, s, t, 1.0)
            if band and t < n and t > ext[s]:
                ext[s] = t
            continue
        lev = s if s <= s_max else s_max
        base = lev - a
        m = s_max - base
        top = khi[ai] if khi[ai] < m else m
        k0 = klo[ai]
        L = top + 1 - k0
        Pr = P[ai, k0 : top + 1]  # targets base+k0..base+top ≤ s_max: band columns
        if band:
            row = ab[s, lw - s + base + k0 : lw - s + base + k0 + L]
        else:
            row = V[0 if s == ref else 1, base + k0 : base + k0 + L]
        for t in range(L):
            row[t] -= Pr[t]
        if base + k0 <= ref <= base + top:  # column ref belongs to col0
            if band:
                ab[s, lw - s + ref] = 0.0
            else:
                V[0 if s == ref else 1, ref] = 0.0
        if m < SF.shape[1]:  # a compact model's SF stops where P(K > m) is exactly 0
            _sub(ab, lw, U, V, D, ref, last, s, last, SF[ai, m])
        if band and base + top > ext[s]:
            ext[s] = base + top
    return ab, lw, uw, U, V, D, ext


# ------------------------------------------------------------------------------------ no-pivot LU
@njit(cache=True)
def _lu_rows(ab, lw, ext, i0):
    """In-place LU of the band without pivoting, by rows (Doolittle ikj: row i is eliminated by the rows
    k < i above it, so it stays hot); ext grows with each row's fill.  False if a pivot is not > 0.

    Rows below ``i0`` are taken as already factored: row i's factors depend only on rows 0..i, so a policy
    that differs from a factored one first at state i0 (with the same border state and band widths) keeps
    those rows and their ``ext`` (:func:`refactor_from`)."""
    n = ab.shape[0]
    for i in range(i0, n):
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
            return False
    return True


@njit(cache=True)
def _lu_solve(ab, lw, ext, X):
    """Solve B Z = X in place for the columns of X (n × c): forward with unit L, then backward with U."""
    n, c = X.shape
    for i in range(n):
        j0 = i - lw if i - lw > 0 else 0
        for k in range(j0, i):
            l = ab[i, lw + k - i]
            if l != 0.0:
                for j in range(c):
                    X[i, j] -= l * X[k, j]
    for i in range(n - 1, -1, -1):
        for t in range(i + 1, ext[i] + 1):
            u = ab[i, lw + t - i]
            for j in range(c):
                X[i, j] -= u * X[t, j]
        inv = 1.0 / ab[i, lw]
        for j in range(c):
            X[i, j] *= inv


@njit(cache=True)
def _first_serving(pol, actions, n):
    """The border state ``ref`` of the numba solvers: the first state that serves (0 if none does)."""
    for s in range(n):
        if actions[pol[s]] > 0:
            return s
    return 0


@njit(cache=True, inline="always")
def _solve_border(M, w, X):
    """The 2×2 border of a bordered banded solve: (M[:, :2] − w·Z[:, :2]) x_b = M[:, 2] − w·Z[:, 2].

    ``w`` (2 × n) holds the border rows (V for A, Uᵀ for Aᵀ), ``X`` = Z the band solves (n × c; a
    third column only when the band part has a right-hand side of its own).  M is reduced in place;
    returns (ok, x0, x1), ok False when the 2×2 is singular to 1e-14 of its scale.
    """
    n, c = X.shape
    for j in range(n):
        for r in range(2):
            v = w[r, j]
            if v != 0.0:
                for k in range(c):
                    M[r, k] -= v * X[j, k]
    d00, d01, d10, d11 = M[0, 0], M[0, 1], M[1, 0], M[1, 1]
    det = d00 * d11 - d01 * d10
    scale = (abs(d00) + abs(d01)) * (abs(d10) + abs(d11))
    if not abs(det) > 1e-14 * scale:
        return False, 0.0, 0.0
    r0, r1 = M[0, 2], M[1, 2]
    return True, (r0 * d11 - d01 * r1) / det, (d00 * r1 - d10 * r0) / det


@njit(cache=True)
def _lu_solve_t(ab, lw, ext, X):
    """Solve Bᵀ Z = X in place with B = L·U from :func:`_lu_rows`: Uᵀ W = X (forward), then Lᵀ Z = W
    (backward), both by scattering a finished row into the rows its column touches: O(n·(lw + uw))."""
    n, c = X.shape
    for i in range(n):
        inv = 1.0 / ab[i, lw]
        for j in range(c):
            X[i, j] *= inv
        for t in range(i + 1, ext[i] + 1):
            u = ab[i, lw + t - i]
            if u != 0.0:
                for j in range(c):
                    X[t, j] -= u * X[i, j]
    for i in range(n - 1, -1, -1):
        k0 = i - lw if i - lw > 0 else 0
        for k in range(k0, i):
            l = ab[i, lw + k - i]
            if l != 0.0:
                for j in range(c):
                    X[k, j] -= l * X[i, j]


@njit(cache=True, nogil=True)
def stationary_banded(pol, P, SF, klo, khi, actions, s_max, lu, lu_ext):
    """(ok, μ): the stationary law under ``pol`` (action indices) by the no-pivot LU of the band.

    μ solves Aᵀμ = e_ref with A = I − M_π whose column ``ref`` (the first serving state) is replaced
    by ones (normalisation); with the bordering of :func:`assemble`, the band part is Bᵀ, solved by
    :func:`_lu_solve_t` on B's own factors — O(S·lw·uw) instead of LAPACK's O(S·uw²) for the pivoted
    transposed band.  ok is False when a pivot is not positive, the border is singular, or μ is not
    finite or clearly negative; the caller then uses the LAPACK path.

    ``lu``, ``lu_ext``: B's factors and row envelope for this policy with the same border state, where the caller
    holds them (policy iteration's last evaluation: B does not depend on the replaced column, so they are these to
    the bit); empty arrays to factor here.
    """
    S = s_max + 2
    n = s_max + 1
    mu = np.zeros(S)
    ref = _first_serving(pol, actions, n)
    ones = np.ones(S)
    ab, lw, uw, U, V, D, ext = assemble(pol, P, SF, klo, khi, actions, s_max, ones, ref)
    if lu.shape[0] == n and lu.shape[1] == ab.shape[1]:
        ab = lu
        ext = lu_ext
    elif not _lu_rows(ab, lw, ext, 0):
        return False, mu
    # Aᵀ = [[Bᵀ, Vᵀ], [Uᵀ, Dᵀ]]; right-hand side e_ref lies in the border (r_b = (1, 0), r_in = 0)
    X = np.zeros((n, 2))
    for s in range(n):
        X[s, 0] = V[0, s]
        X[s, 1] = V[1, s]
    X[ref, 0] = 0.0
    X[ref, 1] = 0.0
    _lu_solve_t(ab, lw, ext, X)
    # (Dᵀ − Uᵀ Z) x_b = r_b with Z = Bᵀ⁻¹ Vᵀ (Z[ref] = 0: row ref of Bᵀ is e_ref)
    M = np.zeros((2, 3))
    M[0, 0], M[0, 1], M[0, 2] = D[0, 0], D[1, 0], 1.0
    M[1, 0], M[1, 1] = D[0, 1], D[1, 1]
    ok, x0, x1 = _solve_border(M, np.ascontiguousarray(U.T), X)  # one layout: one compile
    if not ok:
        return False, mu
    big = 0.0
    for s in range(n):
        mu[s] = -(X[s, 0] * x0 + X[s, 1] * x1)
    mu[ref] = x0
    mu[S - 1] = x1
    total = 0.0
    for s in range(S):
        if not np.isfinite(mu[s]):
            return False, mu
        if abs(mu[s]) > big:
            big = abs(mu[s])
        total += mu[s]
    for s in range(S):
        if mu[s] < -1e-9 * big:
            return False, mu
        if mu[s] <= 0.0:
            mu[s] = 0.0  # also turns −0.0 into 0.0
    if not total > 0.0:
        return False, mu
    s2 = 0.0
    for s in range(S):
        s2 += mu[s]
    for s in range(S):
        mu[s] /= s2
    return True, mu


@njit(cache=True, nogil=True)
def evaluate_policy_banded(pol, pc, py, P, SF, klo, khi, actions, s_max):
    """(ok, g, h) of the policy ``pol`` (action indices, length s_max+2) with costs ``pc[s]`` and sojourns
    ``py[s]`` (eq. 20).

    The border ``ref`` is the first serving state; h is normalised to h(0) = 0.  ok is False when a
    pivot is not positive, the 2×2 border is singular, the result is not finite, or the residual of
    eq. 20 exceeds 1e-7·(1 + max|h| + max|c|) — the caller then uses :func:`gain_bias`.
    """
    ok, g, h, _ = evaluate_factored(pol, pc, py, P, SF, klo, khi, actions, s_max, None)
    return ok, g, h


@njit(cache=True)
def refactor_from(ab, lw, uw, ext, ref, first, prev):
    """Take the factored rows below ``first`` from ``prev`` = (ab, lw, uw, ext, ref, X) of a policy that agrees
    with this one below ``first``; the row to factor from (0 when the border state or the band widths differ)."""
    pab, plw, puw, pext, pref, _ = prev
    if pref != ref or plw != lw or puw != uw or first <= 0:
        return 0
    k = first if first < ab.shape[0] else ab.shape[0]
    for i in range(k):
        ab[i] = pab[i]
        ext[i] = pext[i]
    return k


@njit(cache=True, inline="always")
def evaluate_factored(pol, pc, py, P, SF, klo, khi, actions, s_max, prev):
    """:func:`evaluate_policy_banded`, returning also its factors (ab, lw, uw, ext, ref, X) for the next policy
    (X: the band's solves for the border columns and the costs).

    ``prev``: None, or (factors, first) — the factors of a policy that agrees with this one on the states
    below ``first``; the rows there are not factored again (:func:`refactor_from`), and when only S_o's action
    differs (first = s_max + 1: its row is the border) the band's solves are the same and are kept too.  The
    result is the same to the bit as a full factorisation.  Inlined into each caller (numba IR), without fast-math
    flags: a kernel's last bits must not depend on what numba's cache held when it compiled
    (:mod:`smdp_batch.kernel_cache`).
    """
    S = s_max + 2
    n = s_max + 1
    last = S - 1
    h = np.zeros(S)
    # S_o waiting is absorbing (a degenerate truncation's optimum parks there): its row h(S_o) + g·y − h(S_o) = c
    # gives g at once, h(S_o) ≡ 0 is the normalisation, and B = I − Q keeps every state (ref = −1: no column
    # replaced; each state leaks into S_o, so B is a non-singular M-matrix when the chain is unichain, and a
    # second recurrent class shows as a pivot that is not positive or as the residual)
    absorbing = actions[pol[last]] == 0
    ref = -1 if absorbing else _first_serving(pol, actions, n)
    ab, lw, uw, U, V, D, ext = assemble(pol, P, SF, klo, khi, actions, s_max, py, ref)
    i0 = 0
    X = np.empty((n, 3))  # columns: g's (col0), S_o's, the right-hand side
    kept = False
    if prev is not None:
        i0 = refactor_from(ab, lw, uw, ext, ref, prev[1], prev[0])
        if i0 == n and prev[1] >= n:  # only S_o's action differs: B, U and the costs below agree
            X = prev[0][5]
            kept = True
    factors = (ab, lw, uw, ext, ref, X)
    if not kept:
        if not _lu_rows(ab, lw, ext, i0):
            return False, 0.0, h, factors
        for s in range(n):
            X[s, 0] = U[s, 0]
            X[s, 1] = U[s, 1]
            X[s, 2] = pc[s]
        if ref >= 0:
            X[ref, 0] = 0.0
            X[ref, 1] = 0.0
            X[ref, 2] = 0.0
        _lu_solve(ab, lw, ext, X)
    if absorbing:  # the band's h = z_r − z_g·g with h(S_o) = 0
        g, hso = pc[last] / py[last], 0.0
    else:  # border: (D − V Z) x_b = r_b − V z_r, x_b = (g, h(S_o))
        M = np.empty((2, 3))
        M[0, 0], M[0, 1], M[0, 2] = D[0, 0], D[0, 1], pc[ref]
        M[1, 0], M[1, 1], M[1, 2] = D[1, 0], D[1, 1], pc[last]
        ok, g, hso = _solve_border(M, V, X)
        if not ok:
            return False, 0.0, h, factors
    for s in range(n):
        h[s] = X[s, 2] - X[s, 0] * g - X[s, 1] * hso
    if ref >= 0:
        h[ref] = 0.0
    h[last] = hso
    h0 = h[0]
    hmax = 0.0
    cmax = 0.0
    for s in range(S):
        h[s] -= h0
        if not np.isfinite(h[s]):
            return False, 0.0, h, factors
        if abs(h[s]) > hmax:
            hmax = abs(h[s])
        if abs(pc[s]) > cmax:
            cmax = abs(pc[s])
    if not np.isfinite(g):
        return False, 0.0, h, factors
    res = policy_residual(h, g, pc, py, pol, P, SF, klo, khi, actions, s_max)
    if not res <= 1e-7 * (1.0 + hmax + cmax):
        return False, 0.0, h, factors
    return True, g, h, factors


# ------------------------------------------------------------------------------------ pivoting path
def reference_state(model: TruncatedSMDP, pol_idx: np.ndarray) -> int:
    """A state recurrent under π for the border: the first state that serves (0 if none does).

    Below it the policy waits, so the queue climbs through it whenever it drops below it.
    """
    return reference_states(model, pol_idx)[0]


def reference_states(model: TruncatedSMDP, pol_idx: np.ndarray) -> list[int]:
    """Border candidates, best first: the first serving state, then the first serving state at or above
    the fewest mean arrivals during a batch, m_min = min_b Σ_k k·p_k^[b].

    The first can be visited with negligible probability — when every batch lasts long enough that
    fewer than m_min arrivals are all but impossible (e.g. the max of b uniforms on [1, 20] at λ = 2:
    after any batch n ≳ 10), so a column replaced there leaves the system numerically singular.  A
    state near m_min is one the queue actually passes.
    """
    serving = np.nonzero(model.actions[pol_idx[: model.s_max + 1]] > 0)[0]
    if not serving.size:
        return [0]
    k = np.arange(model.P.shape[1], dtype=np.float64)
    m_min = float(np.min(model.P[model.actions > 0] @ k)) if np.any(model.actions > 0) else 0.0
    out = [int(serving[0])]
    later = serving[serving >= int(m_min)]
    if later.size and int(later[0]) not in out:
        out.append(int(later[0]))
    return out


def bordered_solve(
    model: TruncatedSMDP, pol_idx: np.ndarray, col0: np.ndarray, rhs: np.ndarray, ref: int, transpose: bool = False
) -> np.ndarray:
    """Solve A x = rhs (or Aᵀ x = rhs), A = I − M_π with column ``ref`` replaced by col0 (LAPACK, pivoting)."""
    ab, lw, uw, U, V, D, _ = assemble(
        pol_idx, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max,
        np.ascontiguousarray(col0, dtype=np.float64), ref,
    )
    # padded by uw leading columns, ab's transpose is dgbtrf's band storage of Bᵀ (lower width uw,
    # upper lw, uw rows of fill); trans=1 then solves with B itself
    abx = np.zeros((ab.shape[0], 2 * uw + lw + 1))
    abx[:, uw:] = ab
    lu, piv, info = dgbtrf(abx.T, uw, lw, overwrite_ab=True)
    if info != 0:
        raise InputError(_SINGULAR)
    if transpose:  # Aᵀ = [[Bᵀ, Vᵀ], [Uᵀ, Dᵀ]]
        U, V, D = V.T, U.T, D.T
    S = model.n_states
    r_in = rhs[: S - 1].copy()
    r_b = np.array([rhs[ref], rhs[S - 1]])
    r_in[ref] = 0.0
    U = U.copy()
    U[ref] = 0.0
    V = V.copy()
    V[:, ref] = 0.0
    # near-singular (numerically multichain) systems overflow; they are caught by the finiteness check
    with np.errstate(all="ignore"):
        Z, info = dgbtrs(lu, uw, lw, np.column_stack([U, r_in]), piv, trans=0 if transpose else 1)
        try:
            xb = np.linalg.solve(D - V @ Z[:, :2], r_b - V @ Z[:, 2])
        except np.linalg.LinAlgError:
            raise InputError(_SINGULAR) from None
        x = np.empty(S)
        x[: S - 1] = Z[:, 2] - Z[:, :2] @ xb
        x[ref], x[S - 1] = xb
    if not np.all(np.isfinite(x)):
        raise InputError(_SINGULAR)
    return x


def gain_bias(model: TruncatedSMDP, pol_idx: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    """Solve h = c − g·y + M h with h(0) = 0 (eq. 20 under π); returns (g, h).

    The system is solved with h(ref) ≡ 0 for a recurrent ``ref`` (see :func:`reference_states`),
    shifted to h(0) = 0, and its residual is checked: a numerically singular (multichain)
    policy raises instead of returning garbage.
    """
    py = model.sojourn_of(pol_idx)
    for ref in reference_states(model, pol_idx):
        try:
            x = bordered_solve(model, pol_idx, py, c, ref)
        except InputError:
            continue
        g = float(x[ref])
        x[ref] = 0.0
        h = x - x[0]
        res = policy_residual(h, g, c, py, pol_idx, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max)
        if res <= 1e-7 * (1.0 + np.abs(h).max() + np.abs(c).max()):
            return g, h
    raise InputError(_SINGULAR)


#: Band factors (ab, ext, ref) that are not there: what a PI loop returns when it hands none on, and what
#: :func:`stationary` passes to :func:`stationary_banded` to factor there (ref −1: never a border state).
NO_FACTORS = (np.empty((0, 0)), np.empty(0, dtype=np.int64), -1)


def stationary(model: TruncatedSMDP, pol_idx: np.ndarray, factors: tuple | None = None) -> np.ndarray:
    """Stationary law μ of the embedded chain under π (μ M = μ, Σμ = 1): the no-pivot banded solve
    (:func:`stationary_banded`), else LAPACK with pivoting (numerically multichain policies).  ``factors``: the
    band's (ab, ext, ref) from policy iteration's last evaluation of this policy (used when ref is the border state
    here, the first serving state)."""
    pol = np.ascontiguousarray(pol_idx, dtype=np.int64)
    if factors is None or factors[2] < 0 or factors[2] != _first_serving(pol, model.actions, model.s_max + 1):
        factors = NO_FACTORS
    ok, mu = stationary_banded(pol, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max, factors[0],
                               factors[1])
    if ok:
        return mu
    S = model.n_states
    refs = reference_states(model, pol_idx)
    for i, ref in enumerate(refs):
        rhs = np.zeros(S)
        rhs[ref] = 1.0
        try:
            mu = bordered_solve(model, pol_idx, np.ones(S), rhs, ref, transpose=True)
        except InputError:
            if i + 1 < len(refs):
                continue
            raise
        # an ill-conditioned border shows as clearly negative probabilities: try the next candidate
        if mu.min() >= -1e-9 * max(np.abs(mu).max(), 1e-300) or i + 1 == len(refs):
            mu = np.clip(mu, 0.0, None)
            return mu / mu.sum()
    raise InputError(_SINGULAR)
