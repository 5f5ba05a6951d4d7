"""Markovian arrival processes (MAP): bursty traffic as matrices D0, D1.

A MAP with m phases has a phase process with generator D = D0 + D1; D1[i, j] ≥ 0 is the rate of
arrivals that move the phase from i to j, D0's off-diagonal entries (≥ 0) are phase changes
without an arrival, and every row of D sums to 0 (Neuts 1979; Lucantoni 1991).

* Stationary phase law π: π·D = 0, π·1 = 1; mean arrival rate λ̄ = π·D1·1 (1/ms).
* Phase just after an arrival, in the long run: π·D1 / λ̄.
* From phase i, the next arrival comes after a phase-type time with mean ((−D0)⁻¹·1)_i and leaves the
  phase j with probability ((−D0)⁻¹·D1)_{ij}.
* An MMPP is the case D1 = diag(λ_i), D0 = Q − diag(λ_i) with Q a generator; the Poisson process is
  the case m = 1, D0 = −λ, D1 = λ.

Spellings (one for ``solve`` and ``simulate``): ``poisson`` (at the scenario's λ),
``mmpp:L1,L2,R12,R21`` (two phases: rates L1, L2 /ms, leaving phase 1 at rate R12 /ms and phase 2
at R21 /ms), ``map:FILE.json`` with ``{"D0": [[…]], "D1": [[…]]}`` or an MMPP as
``{"rates": […], "generator": [[…]]}`` (what ``fit-arrivals`` writes; read by :mod:`.map_file`, which
trusts nothing in it).  Up to :data:`PHASE_LIMIT` phases.  Nothing named inside a file is opened.

Irreducibility is decided on the zero pattern of D0 + D1 (every phase reaches every other), so tiny
positive rates are irreducible; the (n, phase) SMDP is refused by :meth:`MAP.check_conditioning` when a
phase lasts so long, counted in events, that its linear systems lose their digits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..limits import ITER_LIMIT, SWITCH_RATIO_MIN, check_rate, check_requests
from ..runtime.mapcheck import PHASE_LIMIT, check_map
from .map_file import check_generator, load_map_json, numbers_only

__all__ = ["MAP", "PHASE_LIMIT", "parse_arrivals", "read_map_file"]

@dataclass(frozen=True, eq=False)
class MAP:
    """A validated Markovian arrival process; rates in 1/ms.

    >>> a = MAP.mmpp([0.5, 4.0], [0.01, 0.04])
    >>> round(a.rate, 6), a.phases
    (1.2, 2)
    >>> MAP.poisson(2.0).rate
    2.0
    """

    D0: np.ndarray
    D1: np.ndarray
    name: str = "map"

    def __post_init__(self):
        D0, D1, pi, rate = check_map(numbers_only(self.D0, "D0"), numbers_only(self.D1, "D1"), PHASE_LIMIT)
        object.__setattr__(self, "D0", D0)
        object.__setattr__(self, "D1", D1)
        object.__setattr__(self, "_pi", pi)
        object.__setattr__(self, "_rate", rate)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def poisson(cls, lam: float) -> "MAP":
        """The Poisson process at rate λ (1/ms), as a one-phase MAP."""
        numbers_only(lam, "the Poisson rate")
        lam = check_rate("the Poisson rate", lam)
        return cls(np.array([[-lam]]), np.array([[lam]]), "poisson")

    @classmethod
    def mmpp(cls, rates, switch) -> "MAP":
        """MMPP from its phase rates λ_i and either a generator Q (m × m: rows summing to 0, or a zero
        diagonal, which is then filled in) or, for two phases, the two leaving rates (R12, R21)."""
        numbers_only(rates, "MMPP rates")
        numbers_only(switch, "MMPP switching rates")
        try:
            lam = np.asarray(rates, dtype=np.float64).ravel()
            Q = np.asarray(switch, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise InputError("MMPP rates must be a list of numbers and the switching rates a square matrix (or two "
                             "leaving rates)") from None
        if lam.size > PHASE_LIMIT or Q.size > PHASE_LIMIT ** 2:
            raise InputError(f"an MMPP has 1..{PHASE_LIMIT} phases, got {lam.size} rates and {Q.size} switching rates")
        if Q.ndim == 1:
            if lam.size != 2 or Q.size != 2:
                raise InputError("an MMPP given by leaving rates needs two phases: rates L1,L2 and R12,R21")
            Q = np.array([[-Q[0], Q[0]], [Q[1], -Q[1]]])
        if Q.shape != (lam.size, lam.size):
            raise InputError(f"an MMPP with {lam.size} rates needs a {lam.size}×{lam.size} generator, got shape {Q.shape}")
        if not np.all(np.isfinite(lam)) or np.any(lam < 0):
            raise InputError(f"MMPP rates must be finite and ≥ 0, got {lam.tolist()}")
        if not np.all(np.isfinite(Q)):
            raise InputError("MMPP switching rates must be finite")
        off = Q - np.diag(np.diag(Q))
        if np.any(off < 0):
            raise InputError("MMPP switching rates must be ≥ 0")
        if np.any(np.diag(Q) != 0):
            check_generator(Q, "the MMPP generator")
        Q = off - np.diag(off.sum(axis=1))
        return cls(Q - np.diag(lam), np.diag(lam), "mmpp")

    # ------------------------------------------------------------------ derived values
    @property
    def phases(self) -> int:
        return int(self.D0.shape[0])

    @property
    def rate(self) -> float:
        """Mean arrival rate λ̄ = π·D1·1 (1/ms)."""
        return self._rate

    @property
    def stationary(self) -> np.ndarray:
        """Stationary phase law π of D0 + D1 (time-average)."""
        return self._pi.copy()

    @property
    def is_mmpp(self) -> bool:
        return bool(np.all(self.D1 == np.diag(np.diag(self.D1))))

    @property
    def phase_rates(self) -> np.ndarray:
        """Arrival rate in each phase, D1·1 (1/ms)."""
        return self.D1.sum(axis=1)

    def after_arrival(self) -> np.ndarray:
        """Long-run phase law just after an arrival, π·D1/λ̄."""
        return self._pi @ self.D1 / self._rate

    def next_arrival(self) -> tuple[np.ndarray, np.ndarray]:
        """((−D0)⁻¹·1, (−D0)⁻¹·D1): mean time to the next arrival (ms) and its phase law, from each phase."""
        inv = np.linalg.inv(-self.D0)
        return inv.sum(axis=1), inv @ self.D1

    def conditioning(self) -> float:
        """Slowest phase change over the fastest event: min_i Σ_{j≠i} D_ij / max_i (−D0)_ii (∞ for one phase)."""
        if self.phases == 1:
            return math.inf
        D = self.D0 + self.D1
        leave = (D - np.diag(np.diag(D))).sum(axis=1)
        return float(leave.min() / np.max(-np.diag(self.D0)))

    def check_conditioning(self) -> None:
        """Refuse to build the (n, phase) SMDP of a MAP whose phases last over 1/:data:`SWITCH_RATIO_MIN` events:
        its relative values grow like the inverse switching rate and the solve loses its digits (measured: W̄
        off by 1% at 10⁻⁸ and negative at 10⁻¹⁰).  Such phases are separate loads; solve each rate alone."""
        r = self.conditioning()
        if r < SWITCH_RATIO_MIN:
            D = self.D0 + self.D1
            leave = (D - np.diag(np.diag(D))).sum(axis=1)
            i, k = int(np.argmin(leave)), int(np.argmax(-np.diag(self.D0)))
            raise InputError(
                f"the MAP is too ill-conditioned to solve: phase {i} is left at {leave[i]:.3g} /ms while phase {k} has "
                f"{-self.D0[k, k]:.3g} events/ms (ratio {r:.3g} < {SWITCH_RATIO_MIN:g}); its phases are separate loads: "
                "solve each rate alone, or use faster switching rates")

    def uniformization(self) -> float:
        """q = max_i (−D0)_ii: P0 = I + D0/q and P1 = D1/q are non-negative with P0 + P1 stochastic."""
        return float(np.max(-np.diag(self.D0)))

    def scaled(self, factor: float) -> "MAP":
        """The same MAP run ``factor`` times faster (every rate × factor)."""
        return MAP(self.D0 * float(factor), self.D1 * float(factor), self.name)

    def spec(self) -> str:
        if self.phases == 1:
            return f"poisson:{_g(self.rate)}"
        if self.is_mmpp and self.phases == 2:
            r = self.phase_rates
            return f"mmpp:{_g(r[0])},{_g(r[1])},{_g(self.D0[0, 1])},{_g(self.D0[1, 0])}"
        return f"map:{self.phases} phases"

    def describe(self) -> dict:
        return {"D0": self.D0.tolist(), "D1": self.D1.tolist(), "phases": self.phases, "rate": self.rate,
                "stationary": self._pi.tolist(), "spec": self.spec()}

    def burst_ratio(self) -> float:
        """Highest over lowest phase arrival rate (inf when a phase has none)."""
        r = self.phase_rates
        return float(r.max() / r.min()) if r.min() > 0 else math.inf

    def idc(self, t: float) -> float:
        """Index of dispersion of counts Var N(t) / E N(t) over a window of t ms (stationary start).

        Var N(t) = λ̄t + 2∫₀ᵗ(t − u)·π D1 (e^{Du} − 1π) D1 1 du, in closed form with Z = (1π − D)⁻¹:
        ∫₀ᵗ (t−u)(e^{Du} − 1π) du = (t·I − (I − e^{Dt})Z)·Z − t·1π.  (1 for Poisson.)
        """
        from scipy.linalg import expm

        D = self.D0 + self.D1
        m = self.phases
        one_pi = np.outer(np.ones(m), self._pi)
        Z = np.linalg.inv(one_pi - D)
        t = float(t)
        integral = (t * np.eye(m) - (np.eye(m) - expm(D * t)) @ Z) @ Z - t * one_pi  # ∫₀ᵗ (t−u)(e^{Du} − 1π) du
        d = self.D1.sum(axis=1)
        var = self._rate * t + 2.0 * float(self._pi @ self.D1 @ integral @ d)
        return var / (self._rate * t)

    # ------------------------------------------------------------------ sampling
    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n arrival times (ms) from the stationary phase law, and the phase path.

        Returns (times, switch_times, switch_phases): the phase is switch_phases[i] on
        [switch_times[i], switch_times[i+1]) (switch_times[0] = 0).  An MMPP is drawn phase visit by
        phase visit (a Poisson count, uniform positions; for two phases the same draws as
        :func:`smdp_batch.analysis.simulate.mmpp_arrivals`); a general MAP event by event.
        """
        n = check_requests(n, "requests")
        if self.is_mmpp:
            return self._sample_mmpp(n, rng)
        return self._sample_map(n, rng)

    def _sample_mmpp(self, n, rng):
        lam = self.phase_rates
        leave = (self.D0 - np.diag(np.diag(self.D0))).sum(axis=1)
        m = self.phases
        per_cycle = float(self._pi @ (lam / np.where(leave > 0, leave, np.inf))) * m
        if per_cycle > 0 and n / per_cycle > ITER_LIMIT:
            raise InputError(
                f"the MMPP changes phase too often for its rates: {n} requests would take {n / per_cycle:.3g} phase "
                f"changes (limit {ITER_LIMIT}); raise the rates or lower the switching rates")
        jump = None
        if m > 2:
            jump = (self.D0 - np.diag(np.diag(self.D0))) / np.where(leave > 0, leave, 1.0)[:, None]
        phase = 0 if m == 2 else int(rng.choice(m, p=self._pi))
        out, sw_t, sw_p, t, count = [], [0.0], [phase], 0.0, 0
        if m == 2:  # the historical stream starts in phase 0
            sw_p = [0]
        while count < n:
            if leave[phase] <= 0:  # absorbing phase of a reducible MMPP cannot happen (irreducible), guard anyway
                raise InputError("the MMPP's phase process is absorbed")
            stay = rng.exponential(1.0 / leave[phase])
            if lam[phase] > 0:
                k = rng.poisson(lam[phase] * stay)
                if k:
                    out.append(np.sort(rng.uniform(t, t + stay, k)))
                    count += k
            t += stay
            phase = 1 - phase if m == 2 else int(rng.choice(m, p=jump[phase]))
            sw_t.append(t)
            sw_p.append(phase)
            if len(sw_t) > 4 * ITER_LIMIT:  # pragma: no cover - bounded by the estimate above
                raise InputError("MMPP arrival generation did not finish; check the rates")
        return np.concatenate(out)[:n], np.asarray(sw_t), np.asarray(sw_p, dtype=np.int64)

    def _sample_map(self, n, rng):
        m = self.phases
        out_rate = -np.diag(self.D0)
        # from phase i: event to (j, arrival?) with probability rate / out_rate[i]
        probs = np.concatenate([self.D0 - np.diag(np.diag(self.D0)), self.D1], axis=1) / out_rate[:, None]
        cum = np.cumsum(probs, axis=1)
        cum[:, -1] = 1.0
        mean_events = float(self._pi @ out_rate) / self._rate
        if n * mean_events > 4 * ITER_LIMIT:
            raise InputError(f"the MAP has {mean_events:.3g} events per arrival: {n} requests would take too many steps")
        phase = int(rng.choice(m, p=self._pi))
        times = np.empty(n)
        sw_t, sw_p = [0.0], [phase]
        t, count = 0.0, 0
        chunk = 4096
        while count < n:
            e = rng.exponential(1.0, chunk)
            u = rng.random(chunk)
            for x, v in zip(e, u):
                t += x / out_rate[phase]
                k = int(np.searchsorted(cum[phase], v, side="right"))
                to = k % m
                if k >= m:
                    times[count] = t
                    count += 1
                if to != phase:
                    sw_t.append(t)
                    sw_p.append(to)
                phase = to
                if count >= n:
                    break
        return times, np.asarray(sw_t), np.asarray(sw_p, dtype=np.int64)


def _g(x: float) -> str:
    return f"{float(x):.10g}"


def read_map_file(path: str) -> MAP:
    """A MAP from JSON: {"D0": …, "D1": …} or {"rates": […], "generator": [[…]]} (checked by :mod:`.map_file`)."""
    kind, a, b = load_map_json(path)
    try:
        return MAP(a, b, "map") if kind == "map" else MAP.mmpp(a, b)
    except InputError as e:
        raise InputError(f"MAP file {str(path)!r}: {e}") from None


#: A decimal number as ``mmpp:`` accepts it (no underscores, hex, NaN, inf or non-ASCII digits).
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_arrivals(spec: str | MAP | None, lam: float | None = None) -> MAP | None:
    """``poisson`` (→ None, or the one-phase MAP at ``lam`` when given), ``mmpp:L1,L2,R12,R21`` or ``map:FILE``."""
    if spec is None or isinstance(spec, MAP):
        return spec
    text = str(spec).strip()
    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind == "poisson" and not arg:
        return None if lam is None else MAP.poisson(lam)
    if kind == "mmpp":
        parts = [p.strip() for p in arg.split(",")] if arg else []
        vals = []
        for p in parts:
            v = float(p) if _DECIMAL.fullmatch(p) else math.nan
            if not math.isfinite(v):
                raise InputError(f"--arrivals {text!r}: {p!r} is not a finite decimal number (like 0.5 or 2e-3)")
            vals.append(v)
        if len(vals) != 4:
            raise InputError(f"--arrivals {text!r}: mmpp needs L1,L2,R12,R21 (rates /ms, switching rates /ms)")
        if min(vals[2:]) <= 0:
            raise InputError(f"--arrivals {text!r}: switching rates R12, R21 must be > 0")
        if max(vals[:2]) <= 0 or min(vals[:2]) < 0:
            raise InputError(f"--arrivals {text!r}: rates L1, L2 must be ≥ 0 and not both 0")
        for v in vals[:2]:
            check_rate("MMPP rate", v, zero_ok=True)
        for v in vals[2:]:
            check_rate("MMPP switching rate", v)
        return MAP.mmpp(vals[:2], vals[2:])
    if kind == "map" and arg:
        return read_map_file(arg)
    raise InputError(f"--arrivals {text!r} is not valid; use poisson, mmpp:L1,L2,R12,R21 or map:FILE.json")
