"""Service-time laws of a batch (paper 004 §III, eqs. 1, 4–6, 11): the base class and the closed forms.

A law is a family of *unit-mean shapes* H_b, one per batch size b; the batch time is
G_b(x) = H_b(x / l(b)), so its mean is always l(b) (ms) — the way paper 004 §VII-C keeps l(b) and
changes only the shape.  Most laws have one shape for every b; the maximum of b request times
(:class:`~smdp_batch.model.families.MaxOf`) and measured per-b profiles have a shape per b, and may
also define l(b) themselves (:meth:`ServiceLaw.natural_latency`).

Every law gives, for the batch time G_b with mean l,

* ``lst(s, l, b)``            g̃_b(s) (eq. 1), vectorised over complex s;
* ``second_moment(l, b)``     E[G_b²] (the holding cost, eq. 11);
* ``arrival(m, kmax, b)``     p_k^[b] (eq. 4) and P(K > k) for k = 0..kmax, where m = λ·l is the mean
                              number of Poisson arrivals during the batch; p_k depends on (λ, l) only
                              through m because the law is a scale family;
* ``sample(rng, l, size, b)`` batch times, for the simulator;
* ``cdf(x, l, b)``            G_b(x).

The default ``arrival`` is the general route: FFT inversion of the PGF A(z) = g̃(λ(1−z)) (eq. 5,
:mod:`smdp_batch.model.inversion`).  The closed forms override it (DESIGN.md §3): deterministic →
Poisson, exponential → geometric, gamma/Erlang → negative binomial, hyperexponential → mixture of
geometrics — in log space, stable for m up to 10³ and beyond, with tails computed directly.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import special

from ..errors import InputError
from .curves import Curve, _fmt
from .inversion import invert_pgf

__all__ = [
    "ServiceLaw",
    "Deterministic",
    "Exponential",
    "Gamma",
    "Erlang",
    "HyperExponential",
]


def _check_m(m: float) -> float:
    m = float(m)
    if not (math.isfinite(m) and m > 0):
        raise InputError(f"mean arrivals per batch λ·l(b) must be finite and > 0, got {m!r}")
    return m


def _check_l(l: float) -> float:
    l = float(l)
    if not (math.isfinite(l) and l > 0):
        raise InputError(f"mean batch time l(b) must be finite and > 0 ms, got {l!r}")
    return l


class ServiceLaw(ABC):
    """The shape of G_b given its mean l (ms) and the batch size b (see the module doc)."""

    name: ClassVar[str] = "law"

    @abstractmethod
    def spec(self) -> str:
        """The CLI spelling of this law (round-trips through :func:`parse_service` where it can)."""

    @abstractmethod
    def lst(self, s, l: float, b: int | None = None):
        """g̃_b(s) = E[e^{−sG_b}] for a batch time with mean l (eq. 1)."""

    @abstractmethod
    def second_moment(self, l: float, b: int | None = None) -> float:
        """E[G_b²] in ms² for mean l (eq. 11)."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, l: float, size: int, b: int | None = None) -> np.ndarray:
        """``size`` independent batch times (ms) with mean l."""

    def cdf(self, x, l: float, b: int | None = None) -> np.ndarray:
        """G_b(x) for mean l."""
        raise InputError(f"service law {self.spec()} has no CDF in closed form")

    def natural_latency(self) -> Curve | None:
        """l(b) defined by the law itself (e.g. the mean of the max of b request times), else None."""
        return None

    def cov(self, b: int | None = None) -> float:
        """Coefficient of variation of G_b (scale-free)."""
        return math.sqrt(max(self.second_moment(1.0, b) - 1.0, 0.0))

    def arrival(self, m: float, kmax: int, b: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(p_k, P(K > k)) for k = 0..kmax, m = λ·l(b) (eqs. 4–6).  Default: FFT inversion of eq. 5."""
        m = _check_m(m)
        inv = invert_pgf(lambda z: self.lst(m * (1.0 - z), 1.0, b), kmax)
        return inv.pmf, inv.sf

    def arrival_rows(self, ms, kmax: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(p_k, P(K > k)) of :meth:`arrival` for every m of ``ms`` at once, as two (len(ms), kmax + 1) arrays, or None
        where the law has no broadcast form (then :meth:`arrival` is called row by row)."""
        return None

    def arrival_pmf(self, m: float, kmax: int, b: int | None = None) -> np.ndarray:
        """p_k for k = 0..kmax (eq. 4), float64."""
        return self.arrival(m, kmax, b)[0]

    def arrival_sf(self, m: float, kmax: int, b: int | None = None) -> np.ndarray:
        """P(K > k) for k = 0..kmax."""
        return self.arrival(m, kmax, b)[1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServiceLaw) and other.spec() == self.spec()

    def __hash__(self) -> int:
        return hash(self.spec())


#: Up to this k the closed-form laws compute every column of a row (:meth:`_LogPmfLaw.arrival`), and so their rows
#: can be computed in one broadcast (:meth:`_LogPmfLaw.arrival_rows`).
_ROWS_KMAX = 4096


class _LogPmfLaw(ServiceLaw):
    """Closed-form laws whose p_k is computed in log space."""

    @abstractmethod
    def log_arrival_pmf(self, m: float, k: np.ndarray) -> np.ndarray:
        ...

    @abstractmethod
    def _sf(self, m: float, k: np.ndarray) -> np.ndarray:
        ...

    def _log_pmf_rows(self, ms: list[float], k: np.ndarray) -> np.ndarray:
        """log p_k for each m of ``ms`` (rows) and k (columns); subclasses broadcast it, each element the same
        operations as :meth:`log_arrival_pmf` (the terms in m alone with ``math``, per row)."""
        return np.vstack([self.log_arrival_pmf(m, k) for m in ms])

    def _sf_rows(self, ms: list[float], k: np.ndarray) -> np.ndarray:
        """P(K > k) per row of ``ms``, as :meth:`_log_pmf_rows` is to :meth:`log_arrival_pmf`."""
        return np.vstack([self._sf(m, k) for m in ms])

    def arrival_rows(self, ms, kmax):
        """:meth:`arrival` of every m in one broadcast where kmax ≤ 4096 (where :meth:`arrival` computes every k):
        the same numbers to the bit, at the cost of one row instead of one per row."""
        kmax = int(kmax)
        if kmax > _ROWS_KMAX:
            return None
        ms = [_check_m(m) for m in ms]
        k = np.arange(kmax + 1, dtype=np.float64)
        return np.exp(self._log_pmf_rows(ms, k)), np.clip(self._sf_rows(ms, k), 0.0, 1.0)

    def arrival(self, m, kmax, b=None):
        """p_k and P(K > k) elementwise, computed only up to where P(K > k) < 1e-300 (zeros beyond, as
        float64 would round them): a table for s_max = 10⁶ costs its support, not 10⁶ terms per row."""
        m = _check_m(m)
        kmax = int(kmax)
        k_hi = min(kmax, _ROWS_KMAX)
        while True:
            k = np.arange(k_hi + 1, dtype=np.float64)
            p, sf = np.exp(self.log_arrival_pmf(m, k)), np.clip(self._sf(m, k), 0.0, 1.0)
            if k_hi == kmax or sf[-1] < 1e-300:  # then p_k ≤ P(K > k − 1) < 1e-300 beyond as well
                break
            k_hi = min(kmax, 4 * k_hi)
        if k_hi == kmax:
            return p, sf
        pmf, tail = np.zeros(kmax + 1), np.zeros(kmax + 1)
        pmf[: k_hi + 1], tail[: k_hi + 1] = p, sf
        return pmf, tail


class Deterministic(_LogPmfLaw):
    """G_b is a point mass at l(b): g̃(s) = e^{−l s}; p_k is Poisson(m)."""

    name = "det"

    def spec(self) -> str:
        return "det"

    def lst(self, s, l, b=None):
        return np.exp(-l * np.asarray(s))

    def second_moment(self, l, b=None):
        return l * l

    def sample(self, rng, l, size, b=None):
        return np.full(int(size), _check_l(l))

    def cdf(self, x, l, b=None):
        return (np.asarray(x, dtype=np.float64) >= l).astype(np.float64)

    def quantile(self, u, v, b=None):
        return np.ones_like(np.asarray(u, dtype=np.float64))

    def log_arrival_pmf(self, m, k):
        return special.xlogy(k, m) - m - special.gammaln(k + 1.0)

    def _sf(self, m, k):
        return special.pdtrc(k, m)

    def _log_pmf_rows(self, ms, k):
        m = np.array(ms)[:, None]
        return special.xlogy(k, m) - m - special.gammaln(k + 1.0)

    def _sf_rows(self, ms, k):
        return special.pdtrc(k, np.array(ms)[:, None])


class Exponential(_LogPmfLaw):
    """G_b exponential with mean l: g̃(s) = 1/(1 + l s); p_k geometric, p_k = (1−q) q^k, q = m/(1+m)."""

    name = "exp"

    def spec(self) -> str:
        return "exp"

    def lst(self, s, l, b=None):
        return 1.0 / (1.0 + l * np.asarray(s))

    def second_moment(self, l, b=None):
        return 2.0 * l * l

    def sample(self, rng, l, size, b=None):
        return rng.exponential(_check_l(l), int(size))

    def cdf(self, x, l, b=None):
        return -np.expm1(-np.maximum(np.asarray(x, dtype=np.float64), 0.0) / l)

    def quantile(self, u, v, b=None):
        """Unit-mean quantile at u, given v = 1 − u exactly (for the far tail)."""
        return -np.log(v)

    def log_arrival_pmf(self, m, k):
        return -math.log1p(m) + k * (math.log(m) - math.log1p(m))

    def _sf(self, m, k):
        return np.exp((k + 1.0) * (math.log(m) - math.log1p(m)))

    @staticmethod
    def _q_rows(ms) -> np.ndarray:  # log q = log m − log(1 + m) per row, in math as the scalar form takes it
        return np.array([math.log(m) - math.log1p(m) for m in ms])[:, None]

    def _log_pmf_rows(self, ms, k):
        return np.array([-math.log1p(m) for m in ms])[:, None] + k * self._q_rows(ms)

    def _sf_rows(self, ms, k):
        return np.exp((k + 1.0) * self._q_rows(ms))


@dataclass(frozen=True, eq=False, repr=False)
class Gamma(_LogPmfLaw):
    """Gamma with shape α (any real α > 0) and mean l: g̃(s) = (1 + l s/α)^{−α}; CoV = 1/√α.

    p_k is negative binomial NB(α, α/(α+m)) — the closed form the FFT route is tested against.
    """

    shape: float = 2.0
    name: ClassVar[str] = "gamma"

    def __post_init__(self):
        a = float(self.shape)
        if not (math.isfinite(a) and a > 0):
            raise InputError(f"gamma shape α must be finite and > 0, got {self.shape!r}")

    def spec(self) -> str:
        return f"gamma:{_fmt(self.shape)}"

    def lst(self, s, l, b=None):
        return (1.0 + l * np.asarray(s) / self.shape) ** (-self.shape)

    def second_moment(self, l, b=None):
        return (1.0 + 1.0 / self.shape) * l * l

    def sample(self, rng, l, size, b=None):
        return rng.gamma(self.shape, _check_l(l) / self.shape, int(size))

    def cdf(self, x, l, b=None):
        return special.gammainc(self.shape, np.maximum(np.asarray(x, dtype=np.float64), 0.0) * self.shape / l)

    def quantile(self, u, v, b=None):
        u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
        lo = special.gammaincinv(self.shape, u)
        hi = special.gammainccinv(self.shape, v)
        return np.where(u < 0.5, lo, hi) / self.shape

    def log_arrival_pmf(self, m, j):
        r = float(self.shape)
        # NB(r, p=r/(r+m)):  Γ(j+r)/(Γ(r) j!) p^r (1−p)^j
        return (
            special.gammaln(j + r)
            - special.gammaln(r)
            - special.gammaln(j + 1.0)
            + r * (math.log(r) - math.log(r + m))
            + j * (math.log(m) - math.log(r + m))
        )

    def _sf(self, m, k):
        return special.betainc(k + 1.0, self.shape, m / (self.shape + m))

    def _log_pmf_rows(self, ms, j):
        r = float(self.shape)
        head = special.gammaln(j + r) - special.gammaln(r) - special.gammaln(j + 1.0)
        c = np.array([r * (math.log(r) - math.log(r + m)) for m in ms])[:, None]
        d = np.array([math.log(m) - math.log(r + m) for m in ms])[:, None]
        return head + c + j * d

    def _sf_rows(self, ms, k):
        return special.betainc(k + 1.0, self.shape, np.array([m / (self.shape + m) for m in ms])[:, None])


@dataclass(frozen=True, eq=False, repr=False)
class Erlang(Gamma):
    """Erlang-k with mean l (k phases of rate k/l): g̃(s) = (1 + l s/k)^{−k}; CoV = 1/√k."""

    k: int = 2
    name: ClassVar[str] = "erlang"

    def __init__(self, k: int = 2):
        if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1):
            raise InputError(f"Erlang shape k must be an integer ≥ 1, got {k!r}")
        object.__setattr__(self, "k", int(k))
        object.__setattr__(self, "shape", float(k))

    def spec(self) -> str:
        return f"erlang:{self.k}"


@dataclass(frozen=True, eq=False, repr=False)
class HyperExponential(_LogPmfLaw):
    """Mixture of exponentials: with probability probs[i] the mean is scales[i]·l.

    g̃(s) = Σ_i probs[i] / (1 + scales[i] l s).  The scales are normalised so that the mixture
    mean is exactly l.  Paper 004 §VII-C uses probs (2/3, 1/3), scales (0.5, 2): squared CoV 2 (the
    paper's "CoV 2"; CoV √2).
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

    def lst(self, s, l, b=None):
        s = np.asarray(s)
        return sum(p / (1.0 + c * l * s) for p, c in zip(self.probs, self.scales))

    def second_moment(self, l, b=None):
        return sum(p * 2.0 * (c * l) ** 2 for p, c in zip(self.probs, self.scales))

    def sample(self, rng, l, size, b=None):
        idx = rng.choice(len(self.probs), size=int(size), p=self.probs)
        return rng.exponential(1.0, int(size)) * np.asarray(self.scales)[idx] * _check_l(l)

    def cdf(self, x, l, b=None):
        x = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
        return sum(p * -np.expm1(-x / (c * l)) for p, c in zip(self.probs, self.scales))

    def log_arrival_pmf(self, m, k):
        terms = [math.log(p) + Exponential().log_arrival_pmf(c * m, k) for p, c in zip(self.probs, self.scales)]
        return special.logsumexp(np.vstack(terms), axis=0)

    def _sf(self, m, k):
        return sum(p * Exponential()._sf(c * m, k) for p, c in zip(self.probs, self.scales))
