"""Model builders: service laws, latency/energy curves and the batching problem."""

from .curves import Affine, Constant, Curve, Logarithmic, Table, parse_curve
from .laws import Deterministic, Erlang, Exponential, HyperExponential, ServiceLaw, parse_service
from .problem import BASIC_ENERGY, BASIC_LATENCY, BatchingProblem, batch_size_set

__all__ = [
    "Affine", "Constant", "Curve", "Logarithmic", "Table", "parse_curve",
    "Deterministic", "Erlang", "Exponential", "HyperExponential", "ServiceLaw", "parse_service",
    "BASIC_ENERGY", "BASIC_LATENCY", "BatchingProblem", "batch_size_set",
]
