"""The loads a setting is checked at: λ alone, or a range spaced evenly in log λ (the SLO optimiser's grid)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError
from ..model.problem import BatchingProblem

__all__ = ["load_grid"]


def _servers(problem: BatchingProblem) -> str:
    c = problem.instances
    return f"{c} instances do, {c}·Bmax/l(Bmax)," if c > 1 else "a server does, Bmax/l(Bmax),"


def load_grid(problem: BatchingProblem, lo: float | None = None, hi: float | None = None, points: int = 5) -> list[float]:
    """The loads (requests/ms) a setting is checked at: λ alone, or ``points`` ≥ 5 loads spaced evenly in
    log λ over [lo, hi], both ends included.  Refuses an empty or inverted range, and one reaching ρ ≥ 1."""
    if lo is None and hi is None:
        return [problem.lam]
    if lo is None or hi is None:
        raise InputError("a load range needs both ends, LO:HI")
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo > 0):
        raise InputError(f"a load range must have finite ends > 0, got {lo:g}:{hi:g}")
    if hi < lo:
        raise InputError(f"the load range {lo * 1e3:g}:{hi * 1e3:g} req/s is inverted: write it LO:HI with LO < HI")
    if hi == lo:
        raise InputError(f"the load range {lo * 1e3:g}:{hi * 1e3:g} req/s is empty; for one load give --lam or --rho")
    if not hi < problem.max_lam:
        raise InputError(
            f"the load range reaches {hi * 1e3:g} req/s, ρ = {hi / problem.max_lam:.4g} ≥ 1: no batching rule can serve "
            f"it (the most {_servers(problem)} is {problem.max_lam * 1e3:.6g} req/s)"
        )
    points = max(5, int(points))
    return [float(x) for x in np.geomspace(lo, hi, points)]
