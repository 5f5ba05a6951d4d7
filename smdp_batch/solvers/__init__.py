"""Solvers for the truncated SMDP: exact policy iteration and relative value iteration."""

from .policy_iteration import policy_iteration
from .result import SolveResult
from .rvi import relative_value_iteration
from .solve import SOLVERS, Solution, solve, solve_truncated

__all__ = ["SOLVERS", "Solution", "SolveResult", "policy_iteration", "relative_value_iteration", "solve", "solve_truncated"]
