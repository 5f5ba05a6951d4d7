"""Numerical routes from a Laplace–Stieltjes transform to what the SMDP needs (paper 004 eqs. 1, 5, 6, 11).

Arrival counts (eqs. 5–6).  The arrival count K during one batch has the probability generating
function A(z) = g̃(λ(1−z)).  Its coefficients p_k = A^{(k)}(0)/k! are recovered from N values of A on a
circle |z| = r < 1 by the discrete Cauchy integral (Abate & Whitt 1992, "Numerical inversion of
probability generating functions", Oper. Res. Lett. 12):

    p̃_k = (1/(N r^k)) Σ_{j<N} A(r ω^j) ω^{−jk},   ω = e^{2πi/N},          (one FFT)

whose aliasing error is p̃_k − p_k = Σ_{n≥1} p_{k+nN} r^{nN} ∈ [0, r^N/(1−r^N)].  Round-off adds about
ε·max|A|/r^k.  We pick r^N = tol/2 and N ≥ L·(kmax+1) with L large enough that the round-off term for
k ≤ kmax stays below tol/2.  The tail P(K > k) is inverted the same way from its own generating function
(1 − A(z))/(1 − z), so that Σ_{k≤kmax} p_k + P(K > kmax) = 1 is an independent check, not an identity.

Moments (eqs. 1 and 11).  E[G] = −g̃'(0) and E[G²] = g̃''(0) are taken from the transform on the imaginary
axis, where g̃(ih) = E[e^{−ihG}] exists for every law:

    D1(h) = −Im g̃(ih)/h      = E[G]  − h² E[G³]/6 + …
    D2(h) = 2(1 − Re g̃(ih))/h² = E[G²] − h² E[G⁴]/12 + …

both free of subtractive cancellation in the first and with only a mild one in the second, and both
even in h, so Richardson extrapolation in h² converges fast.  The extrapolation stops when two
successive diagonal entries agree to ``rtol``; if they never do, the moment is reported as not found
(an infinite second moment shows up as D2 growing without bound as h → 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError

__all__ = ["PgfInversion", "invert_pgf", "TransformMoments", "transform_moments", "check_transform"]

_EPS = np.finfo(np.float64).eps


@dataclass(frozen=True)
class PgfInversion:
    """Result of :func:`invert_pgf`: p_k and P(K > k) for k = 0..kmax, with the stated error."""

    pmf: np.ndarray
    sf: np.ndarray
    error: float  # estimated bound on |p̃_k − p_k| (aliasing + round-off), every k ≤ kmax
    radius: float
    points: int

    @property
    def tail_mass(self) -> float:
        """P(K > kmax): the mass the truncated row leaves out."""
        return float(self.sf[-1])


def _points(kmax: int, tol: float) -> tuple[int, float]:
    """Number of FFT points N (a power of 2) and radius r meeting ``tol`` for k ≤ kmax."""
    alias = math.log(2.0 / tol)  # r^N = tol/2
    # round-off C·ε·r^{−k} ≤ tol/2 for k ≤ kmax  ⇔  (kmax/N)·alias ≤ log(tol/(2Cε))
    room = math.log(tol / (2.0 * 64.0 * _EPS))
    if room <= 0.5:
        raise InputError(f"inversion tolerance {tol:g} is below what float64 round-off allows (use ≥ 1e-13)")
    n = max(64, math.ceil((kmax + 1) * alias / room))
    n = 1 << (n - 1).bit_length()
    return n, math.exp(-alias / n)


def invert_pgf(pgf: Callable[[np.ndarray], np.ndarray], kmax: int, tol: float = 1e-13) -> PgfInversion:
    """p_k (k = 0..kmax) of a probability generating function, by FFT on |z| = r (see module doc).

    ``pgf`` must accept a complex array z with |z| < 1 and return A(z) elementwise.  Raises
    :class:`InputError` if A is not a PGF of a probability law (A(1⁻) ≠ 1, non-finite values, or
    p_k < 0 beyond the round-off bound).
    """
    kmax = int(kmax)
    if kmax < 0:
        raise InputError(f"kmax must be ≥ 0, got {kmax}")
    n, r = _points(kmax, tol)
    z = r * np.exp(2j * np.pi * np.arange(n) / n)
    a = np.asarray(pgf(z), dtype=np.complex128)
    if a.shape != z.shape or not np.all(np.isfinite(a)):
        raise InputError("the transform returned non-finite or mis-shaped values on the inversion circle")
    tail_gf = (1.0 - a) / (1.0 - z)
    both = np.fft.fft(np.vstack([a, tail_gf]), axis=1)[:, : kmax + 1].real / n
    scale = r ** -np.arange(kmax + 1, dtype=np.float64)
    pmf, sf = both[0] * scale, both[1] * scale
    amax = float(np.max(np.abs(a)))
    error = r**n / (1.0 - r**n) + 64.0 * _EPS * amax * float(scale[-1])
    worst = float(pmf.min())
    if worst < -max(10.0 * error, 1e-12):
        k = int(np.argmin(pmf))
        raise InputError(
            f"the transform is not that of a probability law: inversion gives p_{k} = {worst:.3g} < 0 "
            f"(beyond the round-off bound {error:.1g})"
        )
    pmf = np.clip(pmf, 0.0, None)
    sf = np.clip(sf, 0.0, 1.0)
    return PgfInversion(pmf=pmf, sf=sf, error=error, radius=r, points=n)


@dataclass(frozen=True)
class TransformMoments:
    """E[G], E[G²] from a transform, with the Richardson error estimates (absolute)."""

    mean: float
    second: float
    mean_error: float
    second_error: float


def check_transform(lst: Callable[[np.ndarray], np.ndarray], what: str = "transform") -> None:
    """Reject callables that are not a Laplace–Stieltjes transform of a law on [0, ∞) at a glance."""
    try:
        vals = np.asarray(lst(np.array([0.0, 1e-300, 0.5, 1.0 + 1.0j], dtype=np.complex128)), dtype=np.complex128)
    except Exception as e:  # a user callable: report what it raised, on one line
        raise InputError(f"{what} could not be evaluated at complex s: {type(e).__name__}: {e}") from None
    if vals.shape != (4,) or not np.all(np.isfinite(vals)):
        raise InputError(f"{what} must return one finite value per point of a complex array s")
    g0 = vals[0] if abs(vals[0]) > 0 else vals[1]
    if abs(g0 - 1.0) > 1e-9:
        raise InputError(f"{what}: g̃(0) must equal 1 for a probability law, got {complex(g0):.12g}")
    if not (abs(vals[2].imag) < 1e-9 and 0 < vals[2].real < 1 + 1e-12):
        raise InputError(f"{what}: g̃(0.5) must be real and in (0, 1], got {complex(vals[2]):.6g}")


def transform_moments(lst: Callable[[np.ndarray], np.ndarray], rtol: float = 1e-11) -> TransformMoments:
    """E[G] = −g̃'(0) and E[G²] = g̃''(0) by Richardson extrapolation on the imaginary axis."""
    check_transform(lst)
    # characteristic time scale: the s where 1 − g̃(s) ≈ 0.1 (g̃ decreases on s > 0)
    s = 1.0
    for _ in range(200):
        drop = 1.0 - float(np.real(lst(np.array([s], dtype=np.complex128))[0]))
        if drop > 0.3:
            s /= 4.0
        elif drop < 0.03:
            s *= 4.0
        else:
            break
    else:
        raise InputError("transform: could not find its time scale (is g̃(s) < 1 for s > 0?)")
    h0 = 0.1 * s
    levels = 12
    h = h0 / 2.0 ** np.arange(levels)
    g = np.asarray(lst(1j * h), dtype=np.complex128)
    d1 = -g.imag / h
    d2 = 2.0 * (1.0 - g.real) / h**2
    mean, mean_err = _richardson(d1, rtol)
    second, second_err = _richardson(d2, rtol)
    converged = math.isfinite(second) and second_err <= 1e-6 * abs(second)
    growing = d2[levels // 2] > 0 and d2[-1] > 1.5 * d2[levels // 2]
    if growing:
        raise InputError(
            "transform: g̃''(0) grows without bound as s → 0 (infinite second moment); "
            "paper 004 §III requires a finite second moment"
        )
    if not (math.isfinite(mean) and mean > 0) or mean_err > 1e-6 * abs(mean):
        raise InputError(f"transform: the mean −g̃'(0) must be finite and > 0, got {mean!r} (± {mean_err:.1g})")
    if converged and second < mean * mean * (1.0 - 1e-9):
        raise InputError(f"transform: E[G²] = {second:.6g} < E[G]² = {mean * mean:.6g}; not a probability law")
    if not converged:
        raise InputError(
            "transform: the second moment g̃''(0) does not converge (infinite second moment?); "
            "paper 004 §III requires a finite second moment"
        )
    return TransformMoments(mean, max(second, mean * mean), mean_err, second_err)


def _richardson(d: np.ndarray, rtol: float) -> tuple[float, float]:
    """Extrapolate d(h_j), h_j = h0/2^j, error series in h²; returns (value, error estimate)."""
    best, best_err = float(d[0]), math.inf
    prev_row = [float(d[0])]
    for j in range(1, d.size):
        row = [float(d[j])]
        for k in range(1, j + 1):
            row.append(row[k - 1] + (row[k - 1] - prev_row[k - 1]) / (4.0**k - 1.0))
        err = abs(row[-1] - prev_row[-1])
        if err < best_err:
            best, best_err = row[-1], err
        if err <= rtol * abs(row[-1]):
            return row[-1], err
        prev_row = row
    return best, best_err
