"""The one result type every solver returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SolveResult:
    """Solution of a truncated SMDP.

    policy : batch size per state, length s_max+2 (last entry: overflow state S_o).
    gain : optimal average cost per ms, ĝ (eq. 20); for RVI the midpoint of ``gain_bracket``.
    gain_bracket : (lo, hi) bounds on the optimal gain (RVI: min/max of J_{i+1} − H_i; PI: exact).
    relative_values : h with h(s*) = 0, s* = 0 (SMDP scale, eq. 20).
    iterations : sweeps (RVI) or improvement steps (PI).
    span : final span(H_{i+1} − H_i) (RVI) or 0 (PI).
    converged : False when the iteration cap stopped the solver (a warning is raised too).
    """

    policy: np.ndarray
    gain: float
    gain_bracket: tuple[float, float]
    relative_values: np.ndarray
    iterations: int
    span: float
    converged: bool
    solver: str
    seconds: float
    eps: float | None = None
    eta: float | None = None
    backend: str = "numba"  # what computed it: "numba" or "jax"
