"""smdp-batch: provably optimal dynamic-batching policies for batch-serving systems.

Implements paper 004 (Xu, Zhou, Niu, "SMDP-Based Dynamic Batching for Improving
Responsiveness and Energy Efficiency of Batch Services"): the batching SMDP, its finite-state
approximation with an abstract overflow cost (eqs. 18–22), the discretized MDP (eqs. 23–26),
relative value iteration (eqs. 27–30) and exact policy iteration, exact evaluation of any
stationary policy, and HDF5 policy tables.
"""

from .errors import InputError, PolicyFileError
from .evaluate import Evaluation, evaluate_policy
from .model import BatchingProblem
from .solvers import Solution, SolveResult, solve
from .truncate import TruncatedSMDP, truncate

__version__ = "0.1.0"

__all__ = [
    "BatchingProblem", "Evaluation", "InputError", "PolicyFileError", "Solution", "SolveResult",
    "TruncatedSMDP", "evaluate_policy", "solve", "truncate", "__version__",
]
