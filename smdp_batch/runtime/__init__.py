"""Runtime for servers: load a policy table and batch requests by it.  Imports numpy and h5py only.

The Autopilot (a table that re-solves itself online) is :mod:`smdp_batch.runtime.autopilot`: it is not
imported here, since its default solver needs the analysis (numba, scipy), which imports this package.
"""

from .bank import AdaptivePolicy, PolicyBank, RateEstimator
from .estimators import EnergyEstimator, RateChange, ServiceEstimator
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
    "EnergyEstimator", "RateChange", "ServiceEstimator",
]
