"""More service-time families (paper 004 §III, eqs. 1, 4, 11): every one a unit-mean shape scaled to l(b).

* :class:`TransformLaw` — a law known only by its Laplace–Stieltjes transform (a Python callable):
  p_k by FFT inversion of eq. 5, moments by Richardson extrapolation (:mod:`.inversion`).
* :class:`Uniform`, :class:`ShiftedExponential` — closed-form p_k (incomplete gamma functions; a
  Poisson–geometric convolution).
* :class:`LogNormal` — no closed transform: p_k = ∫₀¹ Pois(k; m·Q(u)) du (eq. 4 written over the
  quantile function Q) by tanh–sinh quadrature, refined until two levels agree to 1e-13.
* :class:`Mixture` — any laws with weights and relative means.
* :class:`Empirical` — measured batch times: p_k is the average of Poisson pmfs (eq. 4 with the
  empirical measure), exact.
* :class:`MaxOf` — the batch time of b requests is the maximum of b i.i.d. request times (CDF F(x)^b),
  as for a static LLM batch that runs until its longest request ends (papers 000/003).  Its shape
  changes with b, and it defines its own l(b) = E[max of b] (:meth:`MaxOf.natural_latency`).

Tails P(K > k) are summed from the top, P(K > k) = P(K > kmax) + Σ_{k<j≤kmax} p_j, a sum of positive
terms (no cancellation), with P(K > kmax) computed directly.
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable, ClassVar, Sequence

import numpy as np
from scipy import special

from ..errors import InputError
from .curves import Curve, _fmt
from .inversion import invert_pgf, transform_moments
from .laws import Deterministic, ServiceLaw, _check_l, _check_m
from .quadrature import QuantileLaw, poisson_mixture

__all__ = [
    "TransformLaw", "Uniform", "ShiftedExponential", "LogNormal", "Mixture", "Empirical", "MaxOf", "NaturalLatency",
]

def _law(law, what: str) -> ServiceLaw:
    """A component law must be a law object; spellings go through :func:`smdp_batch.model.spec.parse_service`."""
    if not isinstance(law, ServiceLaw):
        raise InputError(
            f"{what}: a component must be a ServiceLaw object, got {law!r}; "
            f"parse a spelling with smdp_batch.model.spec.parse_service"
        )
    return law


# ----------------------------------------------------------------------------------------- general transform
class TransformLaw(ServiceLaw):
    """A law given only by its Laplace–Stieltjes transform ``lst(s)`` (vectorised over complex s).

    The callable may have any mean m₀ (found numerically); as a batch law it is rescaled to l(b):
    g̃_b(s) = lst(s·l(b)/m₀).  p_k comes from FFT inversion of eq. 5 with the error bound of
    :func:`~smdp_batch.model.inversion.invert_pgf`; E[G], E[G²] from Richardson extrapolation.
    Invalid transforms (g̃(0) ≠ 1, negative p_k beyond round-off, infinite second moment) are
    rejected with :class:`InputError`.  No sampler: a transform alone does not give draws.
    """

    name: ClassVar[str] = "lst"

    def __init__(self, lst: Callable[[np.ndarray], np.ndarray], name: str = "custom"):
        if not callable(lst):
            raise InputError(f"TransformLaw needs a callable g̃(s), got {lst!r}")
        self._fn = lst
        self.label = str(name)
        self.moments = transform_moments(lst)
        self.inversion_error = 0.0

    def spec(self) -> str:
        return f"lst:{self.label}"

    def lst(self, s, l, b=None):
        return self._fn(np.asarray(s, dtype=np.complex128) * (l / self.moments.mean))

    def second_moment(self, l, b=None):
        return self.moments.second / self.moments.mean**2 * l * l

    def sample(self, rng, l, size, b=None):
        raise InputError(
            f"service law {self.spec()} is given only by its transform and cannot be sampled; "
            "use a family (gamma, lognormal, empirical, …) for simulation"
        )

    def arrival(self, m, kmax, b=None):
        m = _check_m(m)
        inv = invert_pgf(lambda z: self.lst(m * (1.0 - z), 1.0), kmax)
        self.inversion_error = max(self.inversion_error, inv.error)
        return inv.pmf, inv.sf

    # identity semantics: two callables with the same label are different laws
    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)


# ----------------------------------------------------------------------------------------- closed forms
class Uniform(QuantileLaw):
    """Uniform with the shape of U[lo, hi] (0 ≤ lo < hi), rescaled to mean l: on [l·2lo/(lo+hi), l·2hi/(lo+hi)].

    p_k = (Q(k+1, α) − Q(k+1, β)) / (β − α) with α, β = m·(2lo, 2hi)/(lo+hi) and Q the regularised upper
    incomplete gamma function (eq. 4 integrated in closed form).
    """

    name: ClassVar[str] = "uniform"

    def __init__(self, lo: float, hi: float):
        super().__init__()
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
            raise InputError(f"uniform:A,B needs 0 ≤ A < B (finite), got A={lo!r}, B={hi!r}")
        self.lo, self.hi = lo, hi
        self.natural_mean = 0.5 * (lo + hi)

    def spec(self):
        return f"uniform:{_fmt(self.lo)},{_fmt(self.hi)}"

    def _ends(self, l):
        return l * self.lo / self.natural_mean, l * self.hi / self.natural_mean

    def raw_quantile(self, u, v, b):
        return np.where(u < 0.5, self.lo + (self.hi - self.lo) * u, self.hi - (self.hi - self.lo) * v)

    def raw_moments(self, b):
        return self.natural_mean, (self.lo**2 + self.lo * self.hi + self.hi**2) / 3.0

    def lst(self, s, l, b=None):
        a, c = self._ends(l)
        s = np.asarray(s, dtype=np.complex128)
        z = (c - a) * s
        small = np.abs(z) < 1e-8
        zz = np.where(small, 1.0, z)
        ratio = np.where(small, 1.0 - z / 2.0, -np.expm1(-zz) / zz)
        out = np.exp(-a * s) * ratio
        return out.real if np.isrealobj(s) else out

    def cdf(self, x, l, b=None):
        a, c = self._ends(l)
        return np.clip((np.asarray(x, dtype=np.float64) - a) / (c - a), 0.0, 1.0)

    def arrival(self, m, kmax, b=None):
        m = _check_m(m)
        alpha, beta = self._ends(m)
        if (beta - alpha) / beta < 1e-2:  # nearly deterministic: the difference formula cancels
            return super().arrival(m, kmax, b)
        k1 = np.arange(int(kmax) + 1, dtype=np.float64) + 1.0
        lower = special.gammainc(k1, beta) - special.gammainc(k1, alpha)
        upper = special.gammaincc(k1, alpha) - special.gammaincc(k1, beta)
        use_upper = special.gammainc(k1, alpha) > 0.5
        p = np.where(use_upper, upper, lower) / (beta - alpha)
        p = np.clip(p, 0.0, None)
        # P(K > kmax) = (1/(β−α)) ∫_α^β P(kmax+1, x) dx (P: regularised lower incomplete gamma),
        # with ∫P(n, x)dx = x·P(n, x) − n·P(n+1, x)
        n = k1[-1]
        prim = lambda x: x * special.gammainc(n, x) - n * special.gammainc(n + 1.0, x)
        top = (prim(beta) - prim(alpha)) / (beta - alpha)
        sf = max(top, 0.0) + np.concatenate([np.cumsum(p[:0:-1])[::-1], [0.0]])
        return p, np.clip(sf, 0.0, 1.0)


class ShiftedExponential(QuantileLaw):
    """A deterministic part F·l plus an exponential with mean (1−F)·l, 0 ≤ F < 1; CoV = 1 − F.

    g̃(s) = e^{−F l s}/(1 + (1−F) l s); K is Poisson(F·m) + geometric(mean (1−F)·m), p = their convolution.
    """

    name: ClassVar[str] = "shiftexp"

    def __init__(self, shift: float):
        super().__init__()
        f = float(shift)
        if not (math.isfinite(f) and 0 <= f < 1):
            raise InputError(f"shiftexp:F needs a shift fraction 0 ≤ F < 1, got {shift!r}")
        self.shift = f

    def spec(self):
        return f"shiftexp:{_fmt(self.shift)}"

    def raw_quantile(self, u, v, b):
        return self.shift - (1.0 - self.shift) * np.log(v)

    def raw_moments(self, b):
        return 1.0, 1.0 + (1.0 - self.shift) ** 2

    def lst(self, s, l, b=None):
        s = np.asarray(s)
        return np.exp(-self.shift * l * s) / (1.0 + (1.0 - self.shift) * l * s)

    def cdf(self, x, l, b=None):
        x = np.asarray(x, dtype=np.float64) - self.shift * l
        return np.where(x < 0, 0.0, -np.expm1(-np.maximum(x, 0.0) / ((1.0 - self.shift) * l)))

    def arrival(self, m, kmax, b=None):
        m = _check_m(m)
        kmax = int(kmax)
        k = np.arange(kmax + 1, dtype=np.float64)
        d, e = self.shift * m, (1.0 - self.shift) * m
        q = e / (1.0 + e)
        pois = np.exp(special.xlogy(k, d) - d - special.gammaln(k + 1.0)) if d > 0 else (k == 0).astype(float)
        geo = np.exp(-math.log1p(e) + k * (math.log(e) - math.log1p(e)))
        p = np.convolve(pois, geo)[: kmax + 1]
        # P(K > kmax) = P(Pois > kmax) + Σ_{j ≤ kmax} pois_j q^{kmax − j + 1}
        top = (special.pdtrc(kmax, d) if d > 0 else 0.0) + float(pois @ np.exp((kmax - k + 1.0) * math.log(q)))
        sf = top + np.concatenate([np.cumsum(p[:0:-1])[::-1], [0.0]])
        return p, np.clip(sf, 0.0, 1.0)


class LogNormal(QuantileLaw):
    """Lognormal with log-standard-deviation σ, mean l: G = l·exp(σZ − σ²/2); CoV = √(e^{σ²} − 1).

    No closed transform: p_k by tanh–sinh quadrature of eq. 4 over the quantile function.
    """

    name: ClassVar[str] = "lognormal"

    def __init__(self, sigma: float):
        super().__init__()
        s = float(sigma)
        if not (math.isfinite(s) and 0 < s <= 3):
            raise InputError(f"lognormal:SIGMA needs 0 < σ ≤ 3 (CoV up to 90), got {sigma!r}")
        self.sigma = s

    def spec(self):
        return f"lognormal:{_fmt(self.sigma)}"

    def raw_quantile(self, u, v, b):
        z = np.where(u < 0.5, special.ndtri(u), -special.ndtri(v))
        return np.exp(self.sigma * z - 0.5 * self.sigma**2)

    def raw_moments(self, b):
        return 1.0, math.exp(self.sigma**2)

    def cdf(self, x, l, b=None):
        x = np.maximum(np.asarray(x, dtype=np.float64), 1e-300)
        return special.ndtr((np.log(x / l) + 0.5 * self.sigma**2) / self.sigma)

    def sample(self, rng, l, size, b=None):
        return _check_l(l) * np.exp(self.sigma * rng.standard_normal(int(size)) - 0.5 * self.sigma**2)


# ----------------------------------------------------------------------------------------- combinations
class Mixture(ServiceLaw):
    """With probability w_i the batch time follows law_i with mean c_i·l (c normalised: Σ w_i c_i = 1)."""

    name: ClassVar[str] = "mix"

    def __init__(self, components: Sequence[tuple[float, ServiceLaw, float]]):
        comps = list(components)
        if not comps:
            raise InputError("mix needs at least one component (weight, law, relative mean)")
        try:
            w = np.array([float(c[0]) for c in comps])
            c = np.array([float(c[2]) for c in comps])
        except (TypeError, ValueError, IndexError):
            raise InputError("mix components must be (weight, law, relative mean) triples") from None
        if not (np.all(np.isfinite(w)) and np.all(w > 0)):
            raise InputError(f"mix weights must be finite and > 0, got {w.tolist()}")
        if not (np.all(np.isfinite(c)) and np.all(c > 0)):
            raise InputError(f"mix relative means must be finite and > 0, got {c.tolist()}")
        w = w / w.sum()
        c = c / float(w @ c)
        self.weights = tuple(float(x) for x in w)
        self.scales = tuple(float(x) for x in c)
        self.laws = tuple(_law(cc[1], "mix") for cc in comps)

    def spec(self):
        return "mix:" + ";".join(
            f"{_fmt(w)}*{law.spec()}@{_fmt(c)}" for w, law, c in zip(self.weights, self.laws, self.scales)
        )

    def _each(self):
        return zip(self.weights, self.laws, self.scales)

    def lst(self, s, l, b=None):
        return sum(w * law.lst(s, c * l, b) for w, law, c in self._each())

    def second_moment(self, l, b=None):
        return sum(w * law.second_moment(c * l, b) for w, law, c in self._each())

    def cdf(self, x, l, b=None):
        return sum(w * law.cdf(x, c * l, b) for w, law, c in self._each())

    def arrival(self, m, kmax, b=None):
        m = _check_m(m)
        p = np.zeros(int(kmax) + 1)
        sf = np.zeros_like(p)
        for w, law, c in self._each():
            pi, si = law.arrival(c * m, kmax, b)
            p += w * pi
            sf += w * si
        return p, sf

    def sample(self, rng, l, size, b=None):
        idx = rng.choice(len(self.laws), size=int(size), p=self.weights)
        out = np.empty(int(size))
        for i, (law, c) in enumerate(zip(self.laws, self.scales)):
            sel = idx == i
            out[sel] = law.sample(rng, c * l, int(sel.sum()), b)
        return out


class Empirical(ServiceLaw):
    """The empirical law of measured times (any scale), optionally weighted; rescaled to mean l.

    p_k = Σ_i w_i Pois(k; m·x_i/x̄) exactly (eq. 4 with the empirical measure).
    """

    name: ClassVar[str] = "samples"

    def __init__(self, samples, weights=None, label: str | None = None):
        x = np.asarray(samples, dtype=np.float64).ravel()
        if x.size == 0:
            raise InputError("empirical law needs at least one sample")
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            bad = x[~(np.isfinite(x) & (x >= 0))][0]
            raise InputError(f"empirical samples must be finite and ≥ 0 ms, got {bad!r}")
        w = np.full(x.size, 1.0 / x.size) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
        if w.shape != x.shape or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise InputError("empirical weights must be finite, ≥ 0, one per sample, and not all 0")
        order = np.argsort(x, kind="stable")
        self.values, self.weights = x[order], w[order] / w.sum()
        self.natural_mean = float(self.weights @ self.values)
        if not self.natural_mean > 0:
            raise InputError("empirical samples must have a mean > 0")
        self._unit = self.values / self.natural_mean
        digest = hashlib.sha1(self.values.tobytes() + self.weights.tobytes()).hexdigest()[:10]
        self.label = label or f"n={x.size},mean={self.natural_mean:.6g},sha1={digest}"

    def spec(self):
        return f"samples:{self.label}"

    def lst(self, s, l, b=None):
        return np.exp(-np.multiply.outer(np.asarray(s) * l, self._unit)) @ self.weights

    def second_moment(self, l, b=None):
        return float(self.weights @ self._unit**2) * l * l

    def cdf(self, x, l, b=None):
        idx = np.searchsorted(self._unit * l, np.asarray(x, dtype=np.float64), side="right")
        return np.concatenate([[0.0], np.cumsum(self.weights)])[idx]

    def arrival(self, m, kmax, b=None):
        return poisson_mixture(_check_m(m), self._unit, self.weights, kmax)

    def sample(self, rng, l, size, b=None):
        return _check_l(l) * self._unit[rng.choice(self._unit.size, size=int(size), p=self.weights)]

    def max_of(self, b: int) -> "Empirical":
        """The law of the max of b i.i.d. draws: atom i gets F_i^b − F_{i−1}^b (same support)."""
        cdf = np.cumsum(self.weights)
        cdf[-1] = 1.0
        w = np.diff(np.concatenate([[0.0], cdf**b]))
        return Empirical(self.values, w, label=f"max{b}({self.label})")


class NaturalLatency(Curve):
    """l(b) defined by a service law itself (:meth:`ServiceLaw.natural_latency`); spec = the law's spec."""

    def __init__(self, law: ServiceLaw, mean_of: Callable[[int], float]):
        self.law = law
        self._mean_of = mean_of

    def __call__(self, b):
        b_arr = np.asarray(b)
        return np.vectorize(lambda x: self._mean_of(int(x)), otypes=[np.float64])(b_arr)

    def spec(self):
        return self.law.spec()


class MaxOf(QuantileLaw):
    """Batch time of b requests = max of b i.i.d. request times X ~ ``base`` with mean ``request_mean`` ms.

    CDF F(x)^b; quantile Q_b(u) = Q_X(u^{1/b}).  The shape depends on b; the law's own mean
    E[max of b] = request_mean·E[max of b unit draws] is :meth:`natural_latency`.  With another l(b)
    the per-b shape is rescaled to it (as every law here).  ``request_mean`` defaults to the base's own
    scale where it has one (``uniform:A,B`` → (A+B)/2, empirical samples → their mean).
    """

    name: ClassVar[str] = "max"

    def __init__(self, base: ServiceLaw, request_mean: float | None = None):
        super().__init__()
        self.base = _law(base, "max")
        if isinstance(self.base, (MaxOf, TransformLaw, Mixture)) or not (
            hasattr(self.base, "quantile") or isinstance(self.base, Empirical)
        ):
            raise InputError(
                f"max: the request-time law {self.base.spec()} has no quantile function; valid bases: det, exp, "
                "gamma:A, erlang:K, uniform:A,B, shiftexp:F, lognormal:S, empirical samples"
            )
        if request_mean is None:
            request_mean = getattr(self.base, "natural_mean", None)
            if request_mean is None:
                raise InputError(
                    f"max:{self.base.spec()} needs the mean request time in ms: max:{self.base.spec()}@MEAN"
                )
        rm = float(request_mean)
        if not (math.isfinite(rm) and rm > 0):
            raise InputError(f"max: the mean request time must be finite and > 0 ms, got {request_mean!r}")
        self.request_mean = rm

    def spec(self):
        if getattr(self.base, "natural_mean", None) == self.request_mean:
            return f"max:{self.base.spec()}"
        return f"max:{self.base.spec()}@{_fmt(self.request_mean)}"

    def _b(self, b):
        if b is None:
            raise InputError("max-of-b law needs the batch size b")
        return int(b)

    def _atoms(self, b):
        return self.base.max_of(self._b(b)) if isinstance(self.base, Empirical) else None

    def raw_quantile(self, u, v, b):
        b = self._b(b)
        with np.errstate(divide="ignore"):  # both branches are evaluated; each is used where accurate
            lv = np.log1p(-v) / b  # log of u^{1/b}, accurate near u = 1
            lu = np.log(u) / b
        log_ub = np.where(u < 0.5, lu, lv)
        return self.base.quantile(np.exp(log_ub), -np.expm1(log_ub))

    def raw_moments(self, b):
        atoms = self._atoms(b)
        if atoms is not None:
            return atoms.natural_mean / self.base.natural_mean, float(atoms.weights @ (atoms.values / self.base.natural_mean) ** 2)
        if isinstance(self.base, Deterministic):
            return 1.0, 1.0
        return super().raw_moments(b)

    def natural_mean_of(self, b: int) -> float:
        """E[max of b request times] in ms."""
        return self.request_mean * self.raw_moments(int(b))[0]

    def natural_latency(self) -> Curve:
        return NaturalLatency(self, self.natural_mean_of)

    def _scaled(self, b):
        atoms = self._atoms(b)
        if atoms is not None:
            return atoms
        if isinstance(self.base, Deterministic):
            return self.base
        return None

    def lst(self, s, l, b=None):
        law = self._scaled(b)
        return law.lst(s, l) if law is not None else super().lst(s, l, b)

    def second_moment(self, l, b=None):
        law = self._scaled(b)
        return law.second_moment(l) if law is not None else super().second_moment(l, b)

    def arrival(self, m, kmax, b=None):
        law = self._scaled(b)
        return law.arrival(m, kmax) if law is not None else super().arrival(m, kmax, b)

    def sample(self, rng, l, size, b=None):
        b = self._b(b)
        draws = self.base.sample(rng, 1.0, int(size) * b).reshape(int(size), b).max(axis=1)
        return _check_l(l) * draws / self.raw_moments(b)[0]

    def cdf(self, x, l, b=None):
        b = self._b(b)
        scale = l / self.raw_moments(b)[0]  # x/scale is in units of the unit-mean request time
        return np.asarray(self.base.cdf(np.asarray(x, dtype=np.float64) / scale, 1.0)) ** b
