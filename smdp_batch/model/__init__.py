"""Model builders: service laws, latency/energy curves and the batching problem."""

from .curves import Affine, Constant, Curve, Logarithmic, Table
from .laws import Deterministic, Erlang, Exponential, HyperExponential, ServiceLaw
from .problem import BASIC_ENERGY, BASIC_LATENCY, BatchingProblem, batch_size_set
from .spec import parse_curve, parse_service
from .truncation import ArrivalTable, TruncatedSMDP, arrival_table, truncate

__all__ = [
    "Affine", "Constant", "Curve", "Logarithmic", "Table", "parse_curve",
    "Deterministic", "Erlang", "Exponential", "HyperExponential", "ServiceLaw", "parse_service",
    "BASIC_ENERGY", "BASIC_LATENCY", "BatchingProblem", "batch_size_set",
    "ArrivalTable", "TruncatedSMDP", "arrival_table", "truncate",
]
