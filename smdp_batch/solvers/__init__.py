"""Solvers for the truncated SMDP: exact policy iteration and relative value iteration (numba or JAX)."""

from .batch import solve_batch, truncate_many
from .policy_iteration import policy_iteration
from .result import SolveResult
from .rvi import relative_value_iteration
from .solve import BACKENDS, SOLVERS, Solution, solve, solve_truncated

__all__ = [
    "BACKENDS", "SOLVERS", "Solution", "SolveResult", "policy_iteration", "relative_value_iteration", "solve",
    "solve_batch", "solve_truncated", "truncate_many",
]
