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

Sampling (:meth:`MAP.sample`): one phase is the Poisson process; more phases are walked event by event
by a compiled loop (time and memory O(requests + phase changes), the work bounded before any draw by
:data:`SAMPLE_CHANGES_LIMIT`), except a two-phase MMPP with few phase changes, drawn visit by visit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from ..errors import InputError
from ..limits import SWITCH_RATIO_MIN, check_rate, check_requests
from ..specs.mapcheck import PHASE_LIMIT, check_map
from .map_file import check_generator, load_map_json, numbers_only

__all__ = ["MAP", "PHASE_LIMIT", "SAMPLE_CHANGES_LIMIT", "parse_arrivals", "read_map_file"]

#: Most phase changes :meth:`MAP.sample` draws for one stream (≈ 1 s and 160 MB of phase path per 10⁷).
SAMPLE_CHANGES_LIMIT = 50_000_000

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
    if TYPE_CHECKING:  # set by __post_init__; not fields at run time
        _pi: np.ndarray = field(init=False)
        _rate: float = field(init=False)

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
    def events_per_arrival(self) -> float:
        """Mean events (arrivals and phase changes) per arrival, π·(−diag D0)/λ̄: the sampler's work per request."""
        return float(self._pi @ -np.diag(self.D0)) / self._rate

    def changes_per_arrival(self) -> float:
        """Mean phase changes per arrival, π·(D − diag D)·1/λ̄ with D = D0 + D1: the phase path's length per request."""
        D = self.D0 + self.D1
        return float(self._pi @ (D - np.diag(np.diag(D))).sum(axis=1)) / self._rate

    def check_sampling(self, n: int) -> None:
        """Refuse, before any draw, a stream of n requests whose phase path exceeds :data:`SAMPLE_CHANGES_LIMIT`
        changes (its events are the arrivals and at most as many phase changes)."""
        per = self.changes_per_arrival()
        if n * per > SAMPLE_CHANGES_LIMIT:
            raise InputError(
                f"the MAP changes phase {per:.3g} times per arrival (mean switching rate {per * self._rate:.3g} /ms, "
                f"mean arrival rate {self._rate:.3g} /ms): {n} requests would take {n * per:.3g} phase changes to "
                f"sample (limit {SAMPLE_CHANGES_LIMIT:.3g}); use --requests ≤ {int(SAMPLE_CHANGES_LIMIT / per)} or "
                "slower switching rates")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n arrival times (ms) from the stationary phase law, and the phase path.

        Returns (times, switch_times, switch_phases): the phase is switch_phases[i] on
        [switch_times[i], switch_times[i+1]) (switch_times[0] = 0).  One phase: the Poisson process
        (exponential gaps in bulk).  More: event by event (each event an arrival, a phase change or both,
        :meth:`events_per_arrival` of them per arrival), from exponentials and uniforms drawn in fixed chunks
        and walked by a compiled loop (about 1 s per 10⁷ events): memory O(n + phase changes), whatever the
        switching rates.  A two-phase MMPP that changes phase at most ``_VISITS_LIMIT`` times keeps its
        visit-by-visit stream (:meth:`_sample_visits`).  The work is refused, before any draw, beyond
        :data:`SAMPLE_CHANGES_LIMIT` phase changes (:meth:`check_sampling`).
        """
        n = check_requests(n, "requests")
        if self.phases == 1:
            x = rng.exponential(1.0 / self._rate, n)
            return np.cumsum(x, out=x), np.zeros(1), np.zeros(1, dtype=np.int64)
        self.check_sampling(n)
        if self.phases == 2 and self.is_mmpp:
            changes = float(self._pi @ (self.D0 - np.diag(np.diag(self.D0))).sum(axis=1)) / self._rate * n
            if changes <= _VISITS_LIMIT:
                return self._sample_visits(n, rng)
        m = self.phases
        out_rate = -np.diag(self.D0)
        # from phase i, event k < m: phase change to k without an arrival; k ≥ m: an arrival, to phase k − m
        cum = np.cumsum(np.concatenate([self.D0 - np.diag(np.diag(self.D0)), self.D1], axis=1) / out_rate[:, None], axis=1)
        cum[:, -1] = 1.0
        changes = self.changes_per_arrival()
        phase = int(np.searchsorted(np.cumsum(self._pi)[:-1], rng.random(), side="right"))
        times = np.empty(n)
        cap = int(n * changes * 1.05) + 1024  # phase changes stored: grown if the stream needs more
        sw_t, sw_p = np.zeros(cap), np.zeros(cap, dtype=np.int64)
        sw_p[0] = phase
        state = np.array([0.0, float(phase), 0.0, 1.0])  # time (ms), phase, arrivals so far, path entries so far
        while state[2] < n:
            size = _CHUNK
            if state[3] + size > sw_t.size:
                grow = max(int(state[3]) + size, int(sw_t.size * 1.25))
                sw_t, sw_p = np.resize(sw_t, grow), np.resize(sw_p, grow)
            _walk(cum, out_rate, m, rng.exponential(1.0, size), rng.random(size), state, times, sw_t, sw_p)
        k = int(state[3])
        return times, sw_t[:k], sw_p[:k]

    def _sample_visits(self, n: int, rng: np.random.Generator):
        """A two-phase MMPP phase visit by phase visit from phase 0 (an exponential stay, a Poisson count,
        sorted uniform positions: the stream of earlier versions, which tests and examples quote).  A visit
        holding far more arrivals than the stream still needs draws only those: the first order statistics
        of its count, as exponential gaps over a Gamma-distributed rest, so memory stays O(n)."""
        lam = self.phase_rates
        leave = (self.D0 - np.diag(np.diag(self.D0))).sum(axis=1)
        out, sw_t, sw_p, t, count, phase = [], [0.0], [0], 0.0, 0, 0
        while count < n:
            stay = rng.exponential(1.0 / leave[phase])
            if lam[phase] > 0:
                mu = lam[phase] * stay  # numpy's Poisson stops at ~1e19; far before, the normal law is exact enough
                k = int(rng.poisson(mu)) if mu < 1e15 else max(0, round(rng.normal(mu, math.sqrt(mu))))
                need = n - count
                if k > need + _VISIT_EXTRA:
                    g = rng.exponential(1.0, need + 1)
                    g[-1] = rng.gamma(k - need + 1.0)  # the k + 1 − need gaps after the last one needed
                    s_ = np.cumsum(g)
                    out.append(t + stay * (s_[:-1] / s_[-1]))
                    count += need
                elif k:
                    out.append(np.sort(rng.uniform(t, t + stay, k)))
                    count += k
            t += stay
            phase = 1 - phase
            sw_t.append(t)
            sw_p.append(phase)
        return np.concatenate(out)[:n], np.asarray(sw_t), np.asarray(sw_p, dtype=np.int64)


#: Events drawn per chunk by :meth:`MAP.sample` (a fixed size: a stream's first k times are those of n ≥ k).
_CHUNK = 1 << 18
#: Two-phase MMPPs expected to change phase at most this often are drawn visit by visit (≈ 5 µs a visit).
_VISITS_LIMIT = 200_000
#: Arrivals a visit may draw beyond those still needed before it draws the needed ones alone.
_VISIT_EXTRA = 1 << 20


@njit(cache=True)
def _walk(cum, out_rate, m, e, u, state, times, sw_t, sw_p):  # pragma: no cover - compiled
    """Walk the MAP's events with exponentials ``e`` and uniforms ``u`` from ``state`` = (time ms, phase, arrivals,
    path entries), storing arrival times and phase changes (room for ``e.size`` more); stops when ``times`` is full."""
    t, phase, count, ns = state[0], int(state[1]), int(state[2]), int(state[3])
    n, K = times.size, cum.shape[1]
    for i in range(e.size):
        t += e[i] / out_rate[phase]
        row = cum[phase]
        k = 0
        while k < K - 1 and row[k] <= u[i]:
            k += 1
        to = k - m if k >= m else k
        if k >= m:
            times[count] = t
            count += 1
        if to != phase:
            sw_t[ns] = t
            sw_p[ns] = to
            ns += 1
            phase = to
        if count >= n:
            break
    state[0], state[1], state[2], state[3] = t, phase, count, ns


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
