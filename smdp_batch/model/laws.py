"""Service-time laws of a batch, parametrised by their mean l(b) (paper 004 §III, eqs. 1, 4–6, 11).

A law describes the *shape* of the batch service time; the batch size enters only through the
mean ``l = l(b)``.  Each law exposes

* ``lst(s, l)``           the Laplace–Stieltjes transform g̃_b(s) (eq. 1), vectorised over complex s;
* ``second_moment(l)``    E[G_b²] (needed by the holding cost, eq. 11);
* ``arrival_pmf(m, kmax)`` p_k^[b] for k = 0..kmax (eq. 4) with m = λ·l(b) the mean number of
  Poisson arrivals during one batch, computed in log space so that m up to 1e3 and beyond is
  stable (no underflow to garbage);
* ``arrival_sf(m, kmax)``  P(K > k), the tail mass used for the overflow state (eq. 18),
  computed directly (no 1 − cumsum cancellation) where a closed form exists.

Closed forms (DESIGN.md §3): deterministic → Poisson, exponential → geometric, Erlang-k →
negative binomial, hyperexponential → mixture of geometrics.  General transforms and measured
laws plug in by subclassing :class:`ServiceLaw` (another issue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
from scipy import special

from ..errors import InputError

def _fmt(x: float) -> str:
    """Shortest text that round-trips a float, without a trailing '.0'."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


__all__ = [
    "ServiceLaw",
    "Deterministic",
    "Exponential",
    "Erlang",
    "HyperExponential",
    "parse_service",
]


def _check_m(m: float) -> float:
    m = float(m)
    if not (math.isfinite(m) and m > 0):
        raise InputError(f"mean arrivals per batch λ·l(b) must be finite and > 0, got {m!r}")
    return m


class ServiceLaw(ABC):
    """Base class: the shape of G_b given its mean l (ms)."""

    name: ClassVar[str] = "law"

    @abstractmethod
    def spec(self) -> str:
        """The CLI spelling of this law (round-trips through :func:`parse_service`)."""
        ...

    @abstractmethod
    def lst(self, s, l: float):
        ...

    @abstractmethod
    def second_moment(self, l: float) -> float:
        ...

    def cov(self) -> float:
        """Coefficient of variation (scale-free)."""
        return math.sqrt(max(self.second_moment(1.0) - 1.0, 0.0))

    @abstractmethod
    def log_arrival_pmf(self, m: float, k: np.ndarray) -> np.ndarray:
        ...

    def arrival_pmf(self, m: float, kmax: int) -> np.ndarray:
        """p_k for k = 0..kmax (eq. 4), float64."""
        m = _check_m(m)
        k = np.arange(kmax + 1, dtype=np.float64)
        return np.exp(self.log_arrival_pmf(m, k))

    def arrival_sf(self, m: float, kmax: int) -> np.ndarray:
        """P(K > k) for k = 0..kmax. Generic fallback: 1 − cumsum, clipped at 0."""
        p = self.arrival_pmf(m, kmax)
        return np.clip(1.0 - np.cumsum(p), 0.0, 1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServiceLaw) and other.spec() == self.spec()

    def __hash__(self) -> int:
        return hash(self.spec())


class Deterministic(ServiceLaw):
    """G_b is a point mass at l(b): g̃(s) = e^{−l s}; p_k is Poisson(m)."""

    name = "det"

    def spec(self) -> str:
        return "det"

    def lst(self, s, l):
        return np.exp(-l * np.asarray(s))

    def second_moment(self, l):
        return l * l

    def log_arrival_pmf(self, m, k):
        return k * math.log(m) - m - special.gammaln(k + 1.0)

    def arrival_sf(self, m, kmax):
        m = _check_m(m)
        return special.pdtrc(np.arange(kmax + 1), m)


class Exponential(ServiceLaw):
    """G_b exponential with mean l: g̃(s) = 1/(1 + l s); p_k geometric, p_k = (1−q) q^k, q = m/(1+m)."""

    name = "exp"

    def spec(self) -> str:
        return "exp"

    def lst(self, s, l):
        return 1.0 / (1.0 + l * np.asarray(s))

    def second_moment(self, l):
        return 2.0 * l * l

    def log_arrival_pmf(self, m, k):
        return -math.log1p(m) + k * (math.log(m) - math.log1p(m))

    def arrival_sf(self, m, kmax):
        m = _check_m(m)
        k = np.arange(kmax + 1, dtype=np.float64)
        return np.exp((k + 1.0) * (math.log(m) - math.log1p(m)))


@dataclass(frozen=True, eq=False, repr=False)
class Erlang(ServiceLaw):
    """Erlang-k with mean l (k phases of rate k/l): g̃(s) = (1 + l s/k)^{−k}; p_j negative binomial."""

    k: int = 2
    name: ClassVar[str] = "erlang"

    def __post_init__(self):
        if not (isinstance(self.k, (int, np.integer)) and self.k >= 1):
            raise InputError(f"Erlang shape k must be an integer ≥ 1, got {self.k!r}")

    def spec(self) -> str:
        return f"erlang:{self.k}"

    def lst(self, s, l):
        return (1.0 + l * np.asarray(s) / self.k) ** (-self.k)

    def second_moment(self, l):
        return (1.0 + 1.0 / self.k) * l * l

    def log_arrival_pmf(self, m, j):
        r = float(self.k)
        # NB(r, p=r/(r+m)):  C(j+r−1, j) p^r (1−p)^j
        return (
            special.gammaln(j + r)
            - special.gammaln(r)
            - special.gammaln(j + 1.0)
            + r * (math.log(r) - math.log(r + m))
            + j * (math.log(m) - math.log(r + m))
        )

    def arrival_sf(self, m, kmax):
        m = _check_m(m)
        return special.nbdtrc(np.arange(kmax + 1), self.k, self.k / (self.k + m))


@dataclass(frozen=True, eq=False, repr=False)
class HyperExponential(ServiceLaw):
    """Mixture of exponentials: with probability probs[i] the mean is scales[i]·l.

    g̃(s) = Σ_i probs[i] / (1 + scales[i] l s).  The scales are normalised so that the mixture
    mean is exactly l.  Paper 004 §VII-C uses probs (2/3, 1/3), scales (0.5, 2): CoV 2.
    """

    probs: tuple[float, ...] = (2.0 / 3.0, 1.0 / 3.0)
    scales: tuple[float, ...] = (0.5, 2.0)
    name: ClassVar[str] = "hyperexp"

    def __post_init__(self):
        p = np.asarray(self.probs, dtype=float)
        c = np.asarray(self.scales, dtype=float)
        if p.ndim != 1 or p.size < 1 or p.size != c.size:
            raise InputError(
                f"hyperexp needs as many probabilities as scales, got {len(self.probs)} and {len(self.scales)}"
            )
        if not (np.all(np.isfinite(p)) and np.all(p > 0) and abs(p.sum() - 1.0) < 1e-9):
            raise InputError(f"hyperexp probabilities must be > 0 and sum to 1, got {tuple(self.probs)}")
        if not (np.all(np.isfinite(c)) and np.all(c > 0)):
            raise InputError(f"hyperexp scales must be finite and > 0, got {tuple(self.scales)}")
        mean = float(p @ c)
        object.__setattr__(self, "probs", tuple(float(x) for x in p / p.sum()))
        object.__setattr__(self, "scales", tuple(float(x) / mean for x in c))

    def spec(self) -> str:
        parts = [f"{_fmt(p)}/{_fmt(c)}" for p, c in zip(self.probs, self.scales)]
        return "hyperexp:" + ",".join(parts)

    def lst(self, s, l):
        s = np.asarray(s)
        return sum(p / (1.0 + c * l * s) for p, c in zip(self.probs, self.scales))

    def second_moment(self, l):
        return sum(p * 2.0 * (c * l) ** 2 for p, c in zip(self.probs, self.scales))

    def log_arrival_pmf(self, m, k):
        terms = [
            math.log(p) + Exponential().log_arrival_pmf(c * m, k) for p, c in zip(self.probs, self.scales)
        ]
        return special.logsumexp(np.vstack(terms), axis=0)

    def arrival_sf(self, m, kmax):
        m = _check_m(m)
        return sum(p * Exponential().arrival_sf(c * m, kmax) for p, c in zip(self.probs, self.scales))


_LAWS = "det, exp, erlang:K (integer K ≥ 1), hyperexp:P1/C1,P2/C2,… (probabilities/relative means)"


def parse_service(spec: str | ServiceLaw) -> ServiceLaw:
    """Parse a service-law spelling: ``det``, ``exp``, ``erlang:2``, ``hyperexp:0.6667/0.5,0.3333/2``."""
    if isinstance(spec, ServiceLaw):
        return spec
    if not isinstance(spec, str):
        raise InputError(f"service law must be a string such as 'det', got {spec!r}")
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind in ("det", "deterministic") and not arg:
        return Deterministic()
    if kind in ("exp", "exponential", "m") and not arg:
        return Exponential()
    if kind == "erlang":
        try:
            k = int(arg)
        except ValueError:
            raise InputError(f"service law {spec!r}: Erlang needs an integer shape, e.g. 'erlang:2'") from None
        return Erlang(k)
    if kind == "hyperexp":
        if not arg:
            return HyperExponential()
        try:
            pairs = [item.split("/") for item in arg.split(",")]
            probs = tuple(float(p) for p, _ in pairs)
            scales = tuple(float(c) for _, c in pairs)
        except ValueError:
            raise InputError(
                f"service law {spec!r}: hyperexp needs P/C pairs, e.g. 'hyperexp:0.6667/0.5,0.3333/2'"
            ) from None
        return HyperExponential(probs, scales)
    raise InputError(f"unknown service law {spec!r}; valid: {_LAWS}")
