"""Many geometric window sums at once, and their transpose: the end rows of exponential batch times' system.

An end row e of :mod:`.geometric`'s bias system (a state whose successor serves another batch size) needs

    V_e = Σ_{k<n_e} (1 − q_e)·q_eᵏ·h(i_e + k),

a geometric average of h over a window of n_e ≈ 41/(1 − q_e) states (the terms down to qᵏ ≈ 1e-18), one per
batch size: at Bmax 1 024, ρ = 0.9, a thousand windows of up to 38 000 states, 2·10⁷ products per operator
application, most of GMRES's time.  The windows overlap but their ratios q_e differ, so no one running sum serves
them; a block expansion does (the multipole idea).  Split the states into blocks of L = :data:`BLOCK`, centre
offsets t_r = (r − (L − 1)/2)/L ∈ [−½, ½] in block b, and write qᵏ inside a block as q^{centre}·exp(x·t_r),
x = L·ln q.  Then

    Σ_r q^{r}·h(bL + r) = q^{(L−1)/2} Σ_{m<M} xᵐ/m! · μ_m(b),     μ_m(b) = Σ_r t_rᵐ·h(bL + r),

with the moments μ shared by every window and the series cut where (|x|/2)ᴹ/M! < :data:`TAYLOR_EPS` (the
dropped tail is below that relative to Σ_r |h|, as the direct sum's own cut V_EPS = 1e-18 is).  A window costs
M per whole block inside it plus its two partial blocks summed directly: at (1 − q) = 1/920, M = 10 for 128
states.  Windows whose |x| needs more than :data:`TAYLOR_MAX` terms (short windows, (1 − q) > 1/128) are summed
directly.  The transpose (each end row's coefficient spread over its window) accumulates per block
C_m(b) += coef·q^{…}·xᵐ/m! and adds Σ_m C_m(b)·t_rᵐ once per state.

Cost: S·M for the moments (or their spreading) plus Σ_e (n_e·M/L + 2L), against Σ_e n_e — at Bmax 1 024,
ρ = 0.9, about a quarter.  Tested against the direct sums to 1e-14 relative (``tests/test_geometric_sums.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel_cache import njit

__all__ = ["BLOCK", "TAYLOR_EPS", "TAYLOR_MAX"]

#: States per block of the expansion.
BLOCK = 128
#: The expansion's series stops once its next term, (|x|/2)ᴹ/M!, is below this (relative to Σ_r |h| in the block).
TAYLOR_EPS = 1e-18
#: Windows whose series would need more terms than this are summed directly.
TAYLOR_MAX = 16


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def _geo_sum(h, i, n, qa):
    """Σ_{k<n} (1 − q)·qᵏ·h(i + k), in blocks of 32 with the powers precomputed (the inner loop vectorises)."""
    pw = np.empty(32)
    pw[0] = 1.0 - qa
    for r in range(1, 32):
        pw[r] = pw[r - 1] * qa
    q32 = qa ** 32
    acc = 0.0
    scale = 1.0
    k0 = 0
    while k0 < n:
        m = min(32, n - k0)
        blk = 0.0
        base = i + k0
        for r in range(m):
            blk += pw[r] * h[base + r]
        acc += scale * blk
        scale *= q32
        k0 += 32
    return acc


@njit(cache=True, fastmath={"reassoc", "contract"}, inline="always")
def _geo_scatter(out, i, n, qa, coef):
    """out[i + k] += coef·(1 − q)·qᵏ for k < n (the transpose of :func:`_geo_sum`)."""
    pw = np.empty(32)
    pw[0] = 1.0 - qa
    for r in range(1, 32):
        pw[r] = pw[r - 1] * qa
    q32 = qa ** 32
    scale = coef
    k0 = 0
    while k0 < n:
        m = min(32, n - k0)
        base = i + k0
        for r in range(m):
            out[base + r] += scale * pw[r]
        scale *= q32
        k0 += 32


@njit(cache=True, inline="always")
def _order(qa):
    """M, the series' terms for ratio qa (0: sum directly)."""
    if not 0.0 < qa < 1.0:
        return 0
    hx = 0.5 * BLOCK * -math.log(qa)
    term = 1.0
    for m in range(1, TAYLOR_MAX + 1):
        term *= hx / m
        if term < TAYLOR_EPS:
            return m
    return 0


@njit(cache=True, inline="always")
def _powers(M):
    """t_rᵐ for m < M, r < BLOCK (M × BLOCK)."""
    T = np.empty((M, BLOCK))
    for r in range(BLOCK):
        t = (r - 0.5 * (BLOCK - 1)) / BLOCK
        p = 1.0
        for m in range(M):
            T[m, r] = p
            p *= t
    return T


@njit(cache=True, inline="always")
def _plan(starts, counts, qs, size):
    """Per window: M (0: direct), and the whole blocks [b1, b2) inside it (b2 ≤ the blocks within ``size``)."""
    E = starts.size
    order = np.zeros(E, dtype=np.int64)
    b1 = np.zeros(E, dtype=np.int64)
    b2 = np.zeros(E, dtype=np.int64)
    nb = size // BLOCK
    for e in range(E):
        M = _order(qs[e])
        lo = (starts[e] + BLOCK - 1) // BLOCK
        hi = min((starts[e] + counts[e]) // BLOCK, nb)
        if M > 0 and hi - lo >= 2:
            order[e], b1[e], b2[e] = M, lo, hi
    return order, b1, b2


@njit(cache=True, fastmath={"reassoc", "contract"}, nogil=True)
def window_sums(h, starts, counts, qs):
    """V_e = Σ_{k<n_e} (1 − q_e)·q_eᵏ·h(i_e + k) for every window e (module doc); i_e + n_e ≤ h.size."""
    E = starts.size
    out = np.empty(E)
    order, b1, b2 = _plan(starts, counts, qs, h.size)
    M = 0
    for e in range(E):
        M = max(M, order[e])
    mom = np.zeros((h.size // BLOCK, M))
    if M > 0:
        T = _powers(M)
        used = np.zeros(h.size // BLOCK, dtype=np.bool_)
        for e in range(E):
            used[b1[e]:b2[e]] = True
        for b in range(used.size):
            if used[b]:
                base = b * BLOCK
                for m in range(M):
                    acc = 0.0
                    for r in range(BLOCK):
                        acc += T[m, r] * h[base + r]
                    mom[b, m] = acc
    for e in range(E):
        i, n, qa, Me = starts[e], counts[e], qs[e], order[e]
        if Me == 0:
            out[e] = _geo_sum(h, i, n, qa)
            continue
        lo, hi = b1[e] * BLOCK, b2[e] * BLOCK
        acc = _geo_sum(h, i, lo - i, qa)
        x = BLOCK * math.log(qa)
        c = np.empty(Me)
        c[0] = 1.0
        for m in range(1, Me):
            c[m] = c[m - 1] * x / m
        qL = qa ** BLOCK
        scale = (1.0 - qa) * qa ** (lo - i + 0.5 * (BLOCK - 1))
        for b in range(b1[e], b2[e]):
            blk = 0.0
            for m in range(Me):
                blk += c[m] * mom[b, m]
            acc += scale * blk
            scale *= qL
        out[e] = acc + qa ** (hi - i) * _geo_sum(h, hi, i + n - hi, qa)
    return out


@njit(cache=True, nogil=True)
def window_scatter(out, starts, counts, qs, coefs):
    """out[i_e + k] += coef_e·(1 − q_e)·q_eᵏ for k < n_e and every window e: the transpose of :func:`window_sums`."""
    E = starts.size
    order, b1, b2 = _plan(starts, counts, qs, out.size)
    M = 0
    for e in range(E):
        M = max(M, order[e])
    C = np.zeros((out.size // BLOCK, M))
    used = np.zeros(out.size // BLOCK, dtype=np.bool_)
    for e in range(E):
        i, n, qa, Me, coef = starts[e], counts[e], qs[e], order[e], coefs[e]
        if Me == 0:
            _geo_scatter(out, i, n, qa, coef)
            continue
        lo, hi = b1[e] * BLOCK, b2[e] * BLOCK
        _geo_scatter(out, i, lo - i, qa, coef)
        x = BLOCK * math.log(qa)
        qL = qa ** BLOCK
        scale = coef * (1.0 - qa) * qa ** (lo - i + 0.5 * (BLOCK - 1))
        for b in range(b1[e], b2[e]):
            used[b] = True
            cm = scale
            for m in range(Me):
                C[b, m] += cm
                cm *= x / (m + 1)
            scale *= qL
        _geo_scatter(out, hi, i + n - hi, qa, coef * qa ** (hi - i))
    if M > 0:
        T = _powers(M)
        for b in range(used.size):
            if used[b]:
                base = b * BLOCK
                for m in range(M):
                    cb = C[b, m]
                    if cb != 0.0:
                        for r in range(BLOCK):
                            out[base + r] += cb * T[m, r]
