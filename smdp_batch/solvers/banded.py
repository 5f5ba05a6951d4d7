"""Linear solves for one stationary policy on the truncated SMDP (used by PI and evaluation).

Under a policy, row s of m̂ (eq. 18) is a shifted copy of p^[π(s)] plus the tail into S_o, so
A = I − M is banded on states 1..s_max — lower width ≤ Bmax, upper width ≤ the arrival
support K — bordered by two dense columns: a reference state's (its unknown h(ref) ≡ 0 is replaced by g, or
its equation by the normalisation) and S_o's.  We solve the banded block with LAPACK (gbsv) and the 2×2 border
by a Schur complement (one dgbtrf factorisation; dgbtrs solves with B or Bᵀ): O(S·Bmax·K) time and O(S·(Bmax+K)) memory, never O(S²).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dgbtrf, dgbtrs

from ..errors import InputError
from .kernels import policy_residual, policy_system_bordered
from ..model.truncation import TruncatedSMDP

_SINGULAR = "the policy's embedded chain has more than one recurrent class (singular system)"


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
    """Solve A x = rhs (or Aᵀ x = rhs), A = I − M_π with column ``ref`` replaced by col0."""
    abx, lw, uw, U, V, D = policy_system_bordered(
        pol_idx, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max,
        np.ascontiguousarray(col0, dtype=np.float64), ref,
    )
    # abx.T holds Bᵀ (lower width uw, upper lw); trans=1 solves with B itself
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

    The system is solved with h(ref) ≡ 0 for a recurrent ``ref`` (see :func:`reference_state`),
    shifted to h(0) = 0, and its residual is checked: a numerically singular (multichain)
    policy raises instead of returning garbage.
    """
    for ref in reference_states(model, pol_idx):
        try:
            x = bordered_solve(model, pol_idx, model.y[pol_idx], c, ref)
        except InputError:
            continue
        g = float(x[ref])
        x[ref] = 0.0
        h = x - x[0]
        res = policy_residual(h, g, c, pol_idx, model.P, model.SF, model.klo, model.khi, model.actions, model.y, model.s_max)
        if res <= 1e-7 * (1.0 + np.abs(h).max() + np.abs(c).max()):
            return g, h
    raise InputError(_SINGULAR)


def stationary(model: TruncatedSMDP, pol_idx: np.ndarray) -> np.ndarray:
    """Stationary law μ of the embedded chain under π (μ M = μ, Σμ = 1)."""
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
