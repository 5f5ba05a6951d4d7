"""smdp-batch: provably optimal dynamic-batching policies for batch-serving systems.

Implements paper 004 (Xu, Zhou, Niu, "SMDP-Based Dynamic Batching for Improving
Responsiveness and Energy Efficiency of Batch Services"): the batching SMDP, its finite-state
approximation with an abstract overflow cost (eqs. 18–22), the discretized MDP (eqs. 23–26),
relative value iteration (eqs. 27–30) and exact policy iteration, exact evaluation of any
stationary policy, and HDF5 policy tables.
"""

from importlib import import_module

from .errors import InputError, PolicyFileError

__version__ = "0.1.0"

# Heavy parts (scipy, numba) load on first use, so that ``import smdp_batch.runtime`` in a server
# costs numpy and h5py only (PEP 562).
_LAZY = {
    "BatchingProblem": ".model", "Evaluation": ".solvers", "evaluate_policy": ".solvers",
    "Solution": ".solvers", "SolveResult": ".solvers", "solve": ".solvers", "solve_batch": ".solvers",
    "TruncatedSMDP": ".model", "truncate": ".model",
    "MAP": ".model.arrivals", "MapSolution": ".solvers.map_solution", "map_problem": ".solvers.map_solution",
    "solve_map": ".solvers.map_solution",
}

__all__ = [
    "BatchingProblem", "Evaluation", "InputError", "PolicyFileError", "Solution", "SolveResult",
    "TruncatedSMDP", "evaluate_policy", "solve", "solve_batch", "truncate", "__version__",
    "MAP", "MapSolution", "map_problem", "solve_map",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
