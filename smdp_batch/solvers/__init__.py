"""Solvers for the truncated SMDP and exact evaluation of its policies (numba on CPU, JAX optional).

* :mod:`.solution` — :func:`solve` (one problem, automatic truncation), :class:`Solution`;
  :mod:`.batch` — :func:`solve_batch` (a grid of problems at one truncation).
* :mod:`.pi` (exact PI, the default) and :mod:`.rvi` (paper 004 Algorithm 1), on
  :mod:`.kernels` (the Bellman sweeps) and :mod:`.banded` (the linear system of one policy).
* :mod:`.evaluation` — exact metrics of any stationary policy (eqs. 21–22), deployed by eq. 30.
* :mod:`.jax_backend` — the same PI/RVI vmapped over problems (``backend="jax"``).
* :mod:`.result` — :class:`SolveResult`, what every solver returns.
"""

from .batch import solve_batch, truncate_many
from .evaluation import Evaluation, evaluate_deployed, evaluate_policy
from .pi import policy_iteration
from .result import SolveResult
from .rvi import relative_value_iteration
from .solution import BACKENDS, SOLVERS, Solution, solve, solve_truncated

__all__ = [
    "BACKENDS", "SOLVERS", "Evaluation", "Solution", "SolveResult", "evaluate_deployed", "evaluate_policy",
    "policy_iteration", "relative_value_iteration", "solve", "solve_batch", "solve_truncated", "truncate_many",
]
