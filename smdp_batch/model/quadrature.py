"""Tanh–sinh quadrature of eq. 4 for laws given by a quantile function (paper 004 eqs. 4, 11).

p_k = ∫₀¹ Pois(k; m·Q(u)) du and the moments ∫ Q(u)^j du are integrated on the tanh–sinh rule,
refined level by level until two levels agree (1e-13 absolute on every p_k, 1e-14 relative on the
moments).  :class:`QuantileLaw` is the base of the families of :mod:`.families` that have no closed
transform (lognormal, max of b request times) and of those whose closed forms it checks; its
per-law cache of nodes, moments and arrival laws is bounded (:class:`_BoundedCache`).
"""

from __future__ import annotations

import math
from abc import abstractmethod

import numpy as np
from scipy import special

from ..errors import InputError
from .laws import ServiceLaw, _check_l, _check_m

__all__ = ["QUAD_TOL", "QuantileLaw", "poisson_mixture"]

#: Accuracy to which the quadrature routes refine p_k (absolute, every k).
QUAD_TOL = 1e-13


def poisson_mixture(m: float, x: np.ndarray, w: np.ndarray, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """p_k = Σ_i w_i Pois(k; m·x_i) and P(K > k) for k = 0..kmax (x ≥ 0, w ≥ 0; a law when Σw = 1,
    and linear in w, so partial sums over node sets add).

    Each node's Poisson terms are summed only over μ ± (16·√μ + 16), μ = m·x_i (nodes sorted by μ,
    in chunks of 16 sharing one window): outside it every term is below 1e-36 of the node's peak
    (checked over μ ∈ [1e-6, 1e5]), far below QUAD_TOL and the 1e-18 support cut of the arrival
    table, and the work is Σ window sizes instead of nodes × kmax (±40√μ windows in chunks of 64
    cost 3.5× more for the same p_k to 1e-15 relative on lognormal:1).
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    keep = w > 0
    x, w = x[keep], w[keep]
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    kmax = int(kmax)
    lgk_all = special.gammaln(np.arange(kmax + 1, dtype=np.float64) + 1.0)
    p = np.zeros(kmax + 1)
    mu = m * x
    spread = 16.0 * np.sqrt(mu) + 16.0
    lo_all = np.clip(np.floor(mu - spread), 0, kmax + 1).astype(np.int64)
    hi_all = np.clip(np.ceil(mu + spread), -1, kmax).astype(np.int64)
    step = 16
    for i in range(0, x.size, step):
        lo, hi = int(lo_all[i : i + step].min()), int(hi_all[i : i + step].max())
        if hi < lo:
            continue  # every node of the chunk puts its mass beyond kmax (counted in ``top``)
        k = np.arange(lo, hi + 1, dtype=np.float64)
        mx = mu[i : i + step, None]
        p[lo : hi + 1] += w[i : i + step] @ np.exp(special.xlogy(k, mx) - mx - lgk_all[lo : hi + 1])
    top = float(w @ special.pdtrc(float(kmax), mu))
    sf = top + np.concatenate([np.cumsum(p[:0:-1])[::-1], [0.0]])
    return p, np.clip(sf, 0.0, float(w.sum()))


#: Half-width of the tanh–sinh grid in t: 3.5 = 7/2, so for h = 2^-L (L ≥ 1) the grid ends on a node
#: and the even nodes of level L are exactly the nodes of level L − 1 (the refinement reuses them).
#: At t = 3.5 the nodes sit 1 − u = e^{−π·sinh 3.5} ≈ 2.6e-23 from the ends; their weights are ~1e-21.
T_MAX = 3.5


def _tanh_sinh_level(h: float, odd_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes u, 1−u and weights/h of the tanh–sinh rule on (0, 1) at step h (odd multiples only if asked)."""
    n = int(math.ceil(T_MAX / h))
    j = np.arange(-n, n + 1)
    if odd_only:
        j = j[j % 2 != 0]
    t = j * h
    e = math.pi * np.sinh(t)
    u = special.expit(e)
    v = special.expit(-e)
    return u, v, math.pi * np.cosh(t) * u * v


class _BoundedCache(dict):
    """Quadrature nodes, moments and arrival laws per batch size, oldest evicted first.

    Bounded in entries and in bytes, so a law used at thousands of batch sizes (``multibin --batch
    5000``) or large kmax stays within memory; :meth:`put` returns the value it stored.
    """

    MAX_ENTRIES = 4096
    MAX_BYTES = 256 << 20

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    @staticmethod
    def _size(value) -> int:
        items = value if isinstance(value, tuple) else (value,)
        return sum(getattr(v, "nbytes", 8) for v in items)

    def put(self, key, value):
        size = self._size(value)
        while self and (len(self) >= self.MAX_ENTRIES or self.nbytes + size > self.MAX_BYTES):
            oldest = next(iter(self))
            self.nbytes -= self._size(self.pop(oldest))
        self[key] = value
        self.nbytes += size
        return value


class QuantileLaw(ServiceLaw):
    """A law given by the quantile function of its shape; eq. 4 and the moments by tanh–sinh quadrature.

    Subclasses give ``raw_quantile(u, v, b)`` at any scale (v = 1 − u exactly, for far tails); the
    shape is normalised to unit mean here.  Closed forms may override any method.
    """

    def __init__(self):
        self._cache = _BoundedCache()

    @abstractmethod
    def raw_quantile(self, u: np.ndarray, v: np.ndarray, b: int | None) -> np.ndarray:
        ...

    def _nodes(self, b, h: float):
        key = ("nodes", b, h)
        if key not in self._cache:
            u, v, w = _tanh_sinh_level(h, odd_only=False)
            return self._cache.put(key, (self.raw_quantile(u, v, b), w * h))
        return self._cache[key]

    def raw_moments(self, b: int | None) -> tuple[float, float]:
        """(E[X], E[X²]) of the raw law, by tanh–sinh refined to 1e-14 relative."""
        key = ("moments", b)
        if key not in self._cache:
            prev = None
            for level in range(2, 12):
                x, w = self._nodes(b, 2.0**-level)
                cur = np.array([w @ x, w @ (x * x)])
                if prev is not None and np.all(np.abs(cur - prev) <= 1e-14 * np.abs(cur)):
                    break
                prev = cur
            else:
                raise InputError(f"service law {self.spec()}: its moments do not converge (infinite variance?)")
            if not (np.all(np.isfinite(cur)) and cur[0] > 0):
                raise InputError(f"service law {self.spec()}: mean must be finite and > 0, got {cur[0]!r}")
            return self._cache.put(key, (float(cur[0]), float(cur[1])))
        return self._cache[key]

    def quantile(self, u, v, b: int | None = None) -> np.ndarray:
        """Quantile of the unit-mean shape at u (v = 1 − u)."""
        return self.raw_quantile(np.asarray(u, float), np.asarray(v, float), b) / self.raw_moments(b)[0]

    def second_moment(self, l, b=None):
        m1, m2 = self.raw_moments(b)
        return m2 / (m1 * m1) * l * l

    def sample(self, rng, l, size, b=None):
        u = rng.random(int(size))
        return _check_l(l) * self.quantile(u, 1.0 - u, b)

    def lst(self, s, l, b=None):
        """g̃(s) = ∫₀¹ e^{−s·l·Q(u)} du by tanh–sinh at step 1/256 (accurate for |s|·l up to ~10²)."""
        x, w = self._nodes(b, 2.0**-8)
        s = np.asarray(s)
        x = x / self.raw_moments(b)[0]
        return np.exp(-np.multiply.outer(s * l, x)) @ w

    def _odd_nodes(self, b, h: float):
        """The nodes level h adds to level 2h (odd multiples of h), with their weights·h."""
        u, v, w = _tanh_sinh_level(h, odd_only=True)
        return self.raw_quantile(u, v, b), w * h

    def arrival(self, m, kmax, b=None):
        """Eq. 4 by tanh–sinh: level L's sums are half of level L−1's plus its odd nodes (each node
        summed once), refined until two levels agree to QUAD_TOL on every p_k."""
        m = _check_m(m)
        key = ("arrival", m, int(kmax), b)
        if key not in self._cache:
            mean = self.raw_moments(b)[0]
            x, w = self._nodes(b, 2.0**-3)
            p_raw, sf_raw = poisson_mixture(m / mean, x, w, kmax)
            w_sum = float(w.sum())
            prev = p_raw / w_sum
            for level in range(4, 14):
                x, w = self._odd_nodes(b, 2.0**-level)
                p_odd, sf_odd = poisson_mixture(m / mean, x, w, kmax)
                p_raw, sf_raw, w_sum = 0.5 * p_raw + p_odd, 0.5 * sf_raw + sf_odd, 0.5 * w_sum + float(w.sum())
                cur = p_raw / w_sum
                if np.max(np.abs(cur - prev)) <= QUAD_TOL:
                    break
                prev = cur
            else:
                raise InputError(f"service law {self.spec()}: quadrature of eq. 4 did not converge at λ·l = {m:g}")
            return self._cache.put(key, (cur, np.clip(sf_raw / w_sum, 0.0, 1.0)))
        return self._cache[key]
