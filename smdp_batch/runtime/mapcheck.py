"""Validation of a Markovian arrival process (D0, D1) for the runtime and the model (numpy only).

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
        a = np.array(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a square matrix of numbers") from None
    if a.ndim == 0:
        a = a.reshape(1, 1)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise InputError(f"{name} must be a square matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise InputError(f"{name} must hold finite numbers")
    return a


def _stationary(D: np.ndarray) -> np.ndarray | None:
    """π with π·D = 0, π·1 = 1, all π_i > 0; None if D is not irreducible."""
    m = D.shape[0]
    if m == 1:
        return np.ones(1)
    A = np.vstack([D.T, np.ones((1, m))])
    rhs = np.zeros(m + 1)
    rhs[-1] = 1.0
    pi, *_ = np.linalg.lstsq(A, rhs, rcond=None)
    if not np.all(np.isfinite(pi)) or np.any(pi <= 1e-14) or np.max(np.abs(pi @ D)) > 1e-9 * np.max(np.abs(D)):
        return None
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
        raise InputError(f"D1[{i},{j}] = {D1[i, j]!r} must be ≥ 0 (a rate of arrivals)")
    off = D0 - np.diag(np.diag(D0))
    if np.any(off < 0):
        i, j = np.argwhere(off < 0)[0]
        raise InputError(f"D0[{i},{j}] = {D0[i, j]!r} must be ≥ 0 (off the diagonal: a rate of phase changes)")
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
    pi = _stationary(D0 + D1)
    if pi is None:
        raise InputError("the phase process D0 + D1 is not irreducible: give every phase a way to every other")
    rate = float(pi @ D1.sum(axis=1))
    if not rate >= RATE_MIN:
        raise InputError(f"the MAP's mean arrival rate {rate:.3g} /ms is below {RATE_MIN:g}: no arrivals")
    return D0, D1, pi, rate
