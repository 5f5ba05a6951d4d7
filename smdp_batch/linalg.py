"""Linear solves for one stationary policy on the truncated SMDP (used by PI and evaluation).

Under a policy, row s of m̂ (eq. 18) is a shifted copy of p^[π(s)] plus the tail into S_o, so
A = I − M is banded on states 1..s_max — lower width ≤ Bmax, upper width ≤ the arrival
support K — bordered by two dense columns (state 0, whose unknown h(0) ≡ 0 is replaced by g or
by the normalisation, and S_o).  We solve the banded block with LAPACK (gbsv) and the 2×2 border
by a Schur complement (one dgbtrf factorisation; dgbtrs solves with B or Bᵀ): O(S·Bmax·K) time and O(S·(Bmax+K)) memory, never O(S²).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dgbtrf, dgbtrs

from .errors import InputError
from .kernels import policy_system_bordered
from .truncate import TruncatedSMDP

_SINGULAR = "the policy's embedded chain has more than one recurrent class (singular system)"


def bordered_solve(
    model: TruncatedSMDP, pol_idx: np.ndarray, col0: np.ndarray, rhs: np.ndarray, transpose: bool = False
) -> np.ndarray:
    """Solve A x = rhs (or Aᵀ x = rhs) with A = I − M_π, column 0 replaced by col0."""
    abx, lw, uw, U, V, D = policy_system_bordered(
        pol_idx, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max,
        np.ascontiguousarray(col0, dtype=np.float64),
    )
    # abx.T holds Bᵀ (lower width uw, upper lw); trans=1 solves with B itself
    lu, piv, info = dgbtrf(abx.T, uw, lw, overwrite_ab=True)
    if info != 0:
        raise InputError(_SINGULAR)
    if transpose:  # Aᵀ = [[Bᵀ, Vᵀ], [Uᵀ, Dᵀ]]
        U, V, D = V.T, U.T, D.T
    S = model.n_states
    # near-singular (numerically multichain) systems overflow; they are caught by the finiteness check
    with np.errstate(all="ignore"):
        Z, info = dgbtrs(lu, uw, lw, np.column_stack([U, rhs[1 : S - 1]]), piv, trans=0 if transpose else 1)
        try:
            xb = np.linalg.solve(D - V @ Z[:, :2], np.array([rhs[0], rhs[S - 1]]) - V @ Z[:, 2])
        except np.linalg.LinAlgError:
            raise InputError(_SINGULAR) from None
        x = np.empty(S)
        x[0], x[S - 1] = xb
        x[1 : S - 1] = Z[:, 2] - Z[:, :2] @ xb
    if not np.all(np.isfinite(x)):
        raise InputError(_SINGULAR)
    return x


def gain_bias(model: TruncatedSMDP, pol_idx: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    """Solve h = c − g·y + M h with h(0) = 0 (eq. 20 under π); returns (g, h)."""
    x = bordered_solve(model, pol_idx, model.y[pol_idx], c)
    g = float(x[0])
    x[0] = 0.0
    return g, x


def stationary(model: TruncatedSMDP, pol_idx: np.ndarray) -> np.ndarray:
    """Stationary law μ of the embedded chain under π (μ M = μ, Σμ = 1)."""
    S = model.n_states
    rhs = np.zeros(S)
    rhs[0] = 1.0
    mu = bordered_solve(model, pol_idx, np.ones(S), rhs, transpose=True)
    mu = np.clip(mu, 0.0, None)
    return mu / mu.sum()
