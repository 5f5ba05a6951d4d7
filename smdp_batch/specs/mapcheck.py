"""Validation of a Markovian arrival process (D0, D1) for the model and the runtime (numpy only).

The model's :class:`smdp_batch.model.arrivals.MAP` and the phase-table reader both go through
:func:`check_map`, so a file and a command line are held to the same rules.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..limits import RATE_MAX, RATE_MIN

__all__ = ["PHASE_LIMIT", "check_map"]

#: Most phases of a MAP: the SMDP has m × (s_max + 2) states and m² blocks per transition.
PHASE_LIMIT = 8


def _matrix(x, name: str) -> np.ndarray:
    try:
        a = np.asarray(x)
        if a.dtype.kind not in "iuf":  # bools, strings, None, ragged rows
            raise TypeError
        a = a.astype(np.float64)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise InputError(f"{name} must be a square matrix of numbers (not booleans, strings or ragged rows)") from None
    if a.ndim == 0:
        a = a.reshape(1, 1)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise InputError(f"{name} must be a square matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise InputError(f"{name} must hold finite numbers")
    return a


def _unreachable(support: np.ndarray) -> tuple[int, int] | None:
    """A pair (i, j) with no path i → j in the directed graph ``support`` (m × m booleans), or None when
    it is strongly connected: irreducibility is a property of the zero pattern, not of the numbers."""
    m = support.shape[0]
    for forward in (True, False):
        seen = np.zeros(m, dtype=bool)
        seen[0] = True
        todo = [0]
        while todo:
            k = todo.pop()
            nxt = np.nonzero((support[k] if forward else support[:, k]) & ~seen)[0]
            seen[nxt] = True
            todo.extend(int(j) for j in nxt)
        if not seen.all():
            j = int(np.nonzero(~seen)[0][0])
            return (0, j) if forward else (j, 0)
    return None


def _stationary(D: np.ndarray) -> np.ndarray:
    """π with π·D = 0, π·1 = 1 of an irreducible generator, by the subtraction-free GTH elimination
    (Grassmann, Taksar & Heyman 1985): every π_i to full relative precision, whatever the rates' spread."""
    m = D.shape[0]
    P = D - np.diag(np.diag(D))
    for k in range(m - 1, 0, -1):
        s = P[k, :k].sum()  # > 0 for an irreducible D (the chain censored on 0..k is irreducible)
        P[:k, k] /= s
        P[:k, :k] += np.outer(P[:k, k], P[k, :k])
    pi = np.ones(m)
    for k in range(1, m):
        pi[k] = pi[:k] @ P[:k, k]
    return pi / pi.sum()


def check_map(D0, D1, max_phases: int = PHASE_LIMIT) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Validate a MAP (D1 ≥ 0, D0 ≥ 0 off the diagonal, rows of D0 + D1 summing to 0, irreducible, rates in
    range); returns (D0 with its diagonal made exact, D1, stationary phase law π, mean rate λ̄ = π·D1·1)."""
    D0 = _matrix(D0, "D0")
    D1 = _matrix(D1, "D1")
    m = D0.shape[0]
    if D1.shape != D0.shape:
        raise InputError(f"D0 and D1 must have the same shape, got {D0.shape} and {D1.shape}")
    if not 1 <= m <= max_phases:
        raise InputError(f"a MAP needs 1..{max_phases} phases, got {m}")
    if np.any(D1 < 0):
        i, j = np.argwhere(D1 < 0)[0]
        raise InputError(f"D1[{i},{j}] = {float(D1[i, j])!r} must be ≥ 0 (a rate of arrivals)")
    off = D0 - np.diag(np.diag(D0))
    if np.any(off < 0):
        i, j = np.argwhere(off < 0)[0]
        raise InputError(f"D0[{i},{j}] = {float(D0[i, j])!r} must be ≥ 0 (off the diagonal: a rate of phase changes)")
    rows = (D0 + D1).sum(axis=1)
    bad = np.nonzero(np.abs(rows) > 1e-9 * (np.abs(np.diag(D0)) + 1e-300))[0]
    if bad.size:
        i = int(bad[0])
        raise InputError(f"row {i} of D0 + D1 must sum to 0 (a generator), sums to {rows[i]:.6g}")
    big = np.abs(np.concatenate([D0.ravel(), D1.ravel()]))
    if np.any(big > RATE_MAX) or np.any((big > 0) & (big < RATE_MIN)):
        raise InputError(f"MAP rates must lie in [{RATE_MIN:g}, {RATE_MAX:g}] per ms (or be 0)")
    D0 = D0.copy()
    np.fill_diagonal(D0, -(off.sum(axis=1) + D1.sum(axis=1)))
    if np.any(np.diag(D0) >= 0):
        i = int(np.nonzero(np.diag(D0) >= 0)[0][0])
        raise InputError(f"phase {i} neither changes nor sees arrivals (D0[{i},{i}] = 0): the MAP is degenerate")
    D = D0 + D1
    pair = _unreachable((D > 0) & ~np.eye(m, dtype=bool))
    if pair is not None:
        raise InputError(f"the phase process D0 + D1 is not irreducible: phase {pair[1]} cannot be reached from phase "
                         f"{pair[0]}; give every phase a path to every other (a positive rate off the diagonal)")
    pi = _stationary(D)
    if not (np.all(np.isfinite(pi)) and np.all(pi > 0)):
        raise InputError(f"the MAP is too ill-conditioned: its stationary phase law {pi.tolist()} underflows "
                         f"(rates from {np.min(np.abs(D[D != 0])):.3g} to {np.max(np.abs(D)):.3g} /ms)")
    rate = float(pi @ D1.sum(axis=1))
    if not rate >= RATE_MIN:
        raise InputError(f"the MAP's mean arrival rate {rate:.3g} /ms is below {RATE_MIN:g}: no arrivals")
    return D0, D1, pi, rate
