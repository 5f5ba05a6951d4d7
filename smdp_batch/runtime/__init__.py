"""Runtime for servers: load a policy table and batch requests by it.  Imports numpy and h5py only."""

from .bank import AdaptivePolicy, PolicyBank, RateEstimator
from .batcher import BatcherClosed, BatcherMetrics, DynamicBatcher, batched
from .table import PolicyTable, control_limit, eq30

__all__ = ["AdaptivePolicy", "PolicyBank", "RateEstimator", "BatcherClosed", "BatcherMetrics", "DynamicBatcher", "PolicyTable", "batched", "control_limit", "eq30"]
