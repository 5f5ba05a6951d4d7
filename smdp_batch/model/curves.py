"""Per-batch-size models: mean batch latency l(b) in ms and batch energy ζ(b) in mJ (paper 004 §III).

Each model is a small immutable object with a vectorised ``__call__(b)`` and a ``spec()``
string that round-trips through :func:`smdp_batch.model.spec.parse_curve` (the CLI spelling):

* ``affine:A,C``   A·b + C          (paper's basic scenario: l = affine:0.3051,1.0524,
                                      ζ = affine:19.899,19.603)
* ``const:C``      C                (§VII-A/C, e.g. l = const:6.0859)
* ``log:A,C``      A·ln(b) + C      (§VII-C, ζ = log:105,60)
* ``table:1=V1,2=V2,…``  one value per batch size (every allowed size must be listed)
* ``csv:FILE[:monotone|interp|affine|power]``  from a measured profile (:mod:`smdp_batch.model.profile`)
* ``max:…`` / ``empirical:FILE``  l(b) defined by that service law (the mean of the max of b request
                                  times; the measured per-b means)
* ``power:SPEC``   ζ(b) = P(b)·l(b): a power curve P(b) in W (any closed form above, or ``csv:FILE``
                   with a ``power_w`` column) times the problem's l(b) in ms (W·ms = mJ)

Numbers may carry units of their quantity (``60mJ``, ``0.06J``, ``800us``, ``60W``; :mod:`.units`).

Validation of the values over the allowed batch sizes (positive, finite, l non-decreasing)
happens in :class:`smdp_batch.model.problem.BatchingProblem`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

def _fmt(x: float) -> str:
    """Shortest text that round-trips a float, without a trailing '.0'."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


__all__ = ["Curve", "Affine", "Constant", "Logarithmic", "Table", "PowerEnergy"]


def _finite(name: str, *values: float) -> tuple[float, ...]:
    out = []
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            raise InputError(f"{name}: parameters must be finite numbers, got {v!r}")
        out.append(v)
    return tuple(out)


class Curve(ABC):
    """A function of the batch size b ≥ 1."""

    @abstractmethod
    def __call__(self, b) -> np.ndarray:
        ...

    @abstractmethod
    def spec(self) -> str:
        ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


@dataclass(frozen=True, repr=False)
class Affine(Curve):
    slope: float
    intercept: float

    def __post_init__(self):
        _finite("affine", self.slope, self.intercept)

    def __call__(self, b):
        return self.slope * np.asarray(b, dtype=np.float64) + self.intercept

    def spec(self):
        return f"affine:{_fmt(self.slope)},{_fmt(self.intercept)}"


@dataclass(frozen=True, repr=False)
class Constant(Curve):
    value: float

    def __post_init__(self):
        _finite("const", self.value)

    def __call__(self, b):
        return np.full(np.shape(b), self.value, dtype=np.float64)

    def spec(self):
        return f"const:{_fmt(self.value)}"


@dataclass(frozen=True, repr=False)
class Logarithmic(Curve):
    coef: float
    intercept: float

    def __post_init__(self):
        _finite("log", self.coef, self.intercept)

    def __call__(self, b):
        return self.coef * np.log(np.asarray(b, dtype=np.float64)) + self.intercept

    def spec(self):
        return f"log:{_fmt(self.coef)},{_fmt(self.intercept)}"


@dataclass(frozen=True, repr=False)
class Table(Curve):
    """Explicit values per batch size; evaluating at an unlisted size is an error."""

    sizes: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self):
        if len(self.sizes) != len(self.values) or not self.sizes:
            raise InputError("table: need one value per listed batch size")
        _finite("table", *self.values)
        if len(set(self.sizes)) != len(self.sizes):
            raise InputError(f"table: batch sizes listed twice in {self.sizes}")

    def __call__(self, b):
        lookup = dict(zip(self.sizes, self.values))
        b_arr = np.asarray(b)
        missing = sorted({int(x) for x in b_arr.ravel()} - set(lookup))
        if missing:
            raise InputError(f"table: no value for batch size(s) {missing}; listed sizes are {sorted(lookup)}")
        return np.vectorize(lambda x: lookup[int(x)], otypes=[np.float64])(b_arr)

    def spec(self):
        return "table:" + ",".join(f"{b}={_fmt(v)}" for b, v in zip(self.sizes, self.values))


class PowerEnergy(Curve):
    """ζ(b) = P(b)·l(b) in mJ: a power curve P(b) in W while a batch is served, times the batch time l(b) in ms.

    Spelled ``power:SPEC``; :class:`smdp_batch.model.problem.BatchingProblem` binds it to its own l(b)
    (again on every ``replace``), so a changed l(b) changes ζ(b) at the same power."""

    def __init__(self, power: Curve, latency: Curve | None = None):
        if isinstance(power, PowerEnergy):
            raise InputError("power:SPEC takes a power curve in W (affine, const, log, table, csv), not another power:")
        self.power, self.latency = power, latency

    def bind(self, latency: Curve) -> "PowerEnergy":
        """The same power curve times ``latency``."""
        return PowerEnergy(self.power, latency)

    def __call__(self, b):
        if self.latency is None:
            raise InputError(f"energy {self.spec()!r} is P(b)·l(b) and needs l(b): use it in a BatchingProblem")
        return np.asarray(self.power(b), dtype=np.float64) * np.asarray(self.latency(b), dtype=np.float64)

    def __eq__(self, other):
        return isinstance(other, PowerEnergy) and other.power == self.power and other.latency == self.latency

    def __hash__(self):
        return hash(("power", self.power.spec()))

    def spec(self):
        return f"power:{self.power.spec()}"
