"""Runtime for servers: load a policy table and batch requests by it.  Imports numpy and h5py only.

The Autopilot (a table that re-solves itself online) and its estimators live one floor up, in
:mod:`smdp_batch.autopilot`: its default solver needs the analysis (numba, scipy), which imports this package.
"""

from .bank import AdaptivePolicy, PolicyBank, RateEstimator
from .batcher import BatcherBroken, BatcherClosed, BatcherMetrics, DynamicBatcher, default_max_wait_ms
from .decorate import batched
from .phase import PhaseFilter, PhasePolicy
from .phase_file import PhasePolicyFile, read_phase_policy
from .schema import FORMAT, SCHEMA_VERSION, PolicyFile, eq30, read_bank, read_policy
from .table import PolicyTable, control_limit

__all__ = [
    "AdaptivePolicy", "PolicyBank", "RateEstimator", "BatcherBroken", "BatcherClosed", "BatcherMetrics",
    "DynamicBatcher", "default_max_wait_ms",
    "FORMAT", "SCHEMA_VERSION", "PolicyFile", "PolicyTable", "batched", "control_limit", "eq30", "read_bank",
    "read_policy", "PhaseFilter", "PhasePolicy", "PhasePolicyFile", "read_phase_policy",
]

#: Names that lived here before the Autopilot got its own package (smdp_batch.autopilot).
_MOVED = frozenset({"Autopilot", "AutopilotMetrics", "Plan", "slo_plan", "EnergyEstimator", "RateChange",
                    "ServiceEstimator", "autopilot", "estimators", "plan", "solve_process", "energy_meter",
                    "autopilot_metrics"})


def __getattr__(name: str):
    """A name that moved says where to in one line (an ImportError, so ``from smdp_batch.runtime import
    Autopilot`` shows it); importing it from here would make this floor import the one above it."""
    if name in _MOVED:
        new = {"autopilot": "pilot", "autopilot_metrics": "prometheus"}.get(name, name)
        where = f"from smdp_batch.autopilot import {new}" if new[0].isupper() or new == "slo_plan" \
            else f"import smdp_batch.autopilot.{new}"
        raise ImportError(f"smdp_batch.runtime.{name} moved to smdp_batch.autopilot: {where}")
    raise AttributeError(f"module 'smdp_batch.runtime' has no attribute {name!r}")
