"""Online estimators for the Autopilot: the arrival rate with change points, batch times and batch energy.

numpy only; every estimator holds O(1) state (or O(|𝓑|) for the per-size ones), whatever the number of
observations, and is thread-safe (one lock each).  An observation that is not a finite number in range
(NaN, ±inf, a negative time or duration, an unknown batch size, a non-number, a gap beyond 1/RATE_MIN, a batch
beyond an hour or 10⁹ mJ: :mod:`smdp_batch.limits`) is ignored and counted in ``rejected``; nothing raises on a
bad reading, since a server's measurement path must never stop serving.  One reading moves an estimate by a
bounded amount: a gap is clipped at ``clip`` mean gaps, a batch time or energy more than ``READING_CLIP`` (10)×
away from its size's estimate is taken at that bound (``clipped``), and λ̂ stays within the rate limits.

**Arrival rate with change points** (:class:`RateChange`).  Under Poisson arrivals at rate λ (1/ms) the
gaps X_i are i.i.d. Exp(λ).  The estimate is the maximum-likelihood λ̂ = n / Σ X_i over the gaps since the
last change point, with exponential forgetting once n reaches ``memory`` (each old gap's weight is then
multiplied by 1 − 1/``memory`` per new gap: an average over the last ≈ ``memory`` gaps).  Its band is the
exact Gamma interval 2λΣX ~ χ²(2n), the χ² quantiles taken by the Wilson–Hilferty cube-root rule.
Changes are found by a two-sided CUSUM of log-likelihood ratios against the current λ̂ = λ₀: for the
alternative λ₁ = κλ₀ (up) and λ₀/κ (down),

    S⁺ ← max(0, S⁺ + ln κ − (κ − 1)·λ₀·X),        S⁻ ← max(0, S⁻ − ln κ + (1 − 1/κ)·λ₀·X),

and an *alarm* is raised when either passes h.  An alarm is a change only if the data bear it out: λ̂
goes on unchanged for ``confirm`` more gaps, then the window from ``lookback`` mean gaps (1/λ₀ each) before
the CUSUM's change-point estimate (where that side's statistic was last 0) to the latest arrival, N arrivals
in D ms, is judged by the likelihood-ratio test of its Poisson count between λ₀ and λ₁ (the alarm's own
post-change rate n/Σx, at least κλ₀ up, at most λ₀/κ down): the change stands if N/D lies beyond the
logarithmic mean (λ₁ − λ₀)/ln(λ₁/λ₀) on λ₁'s side.  λ̂ then restarts from the gaps since the change point
(at least ``confirm``, so it is ready at once: after the warm-up λ̂ is never blank).  An alarm not borne
out is counted in ``unconfirmed``.  This is for stalls: a server that stalls (a GC pause, a starved
process, a busy event loop) hands on the arrivals it held back as one long gap and then a burst; gap by
gap, the long gap sets S⁺ to 0 and the burst climbs past h, but a window that takes in the long gap still
holds the old rate's count.  A gap is clipped at ``clip`` mean gaps for the CUSUM and the estimate, so one
clock jump or pause moves the estimate by a bounded amount (counted in ``clipped``); the mean gap is that of
the slower of λ̂ and a twin with 8× its memory that goes on through changes, because a clump let in at once
inflates λ̂ and the stall before the next clump must still count (on the recorded Ray replica trace of
``tests/test_estimators.py`` the last λ̂ fell from 2.4× to 1.5× the rate the replica saw, clips from 9 to 2).
Defaults κ = 2, h = 12, ``warmup`` = 32 gaps (no test before), ``confirm`` = 32, ``lookback`` = 16.
Measured on seeded Poisson streams (``tests/test_estimators.py``): a 3× step up is declared within 140
arrivals and a 3× step down within 115 in each of 200 runs (medians 64 and 46); a stationary stream gave no false change in
20 runs of 10⁵ arrivals (3 alarms dropped); a stall whose arrivals are let through is not a change up to
20 mean gaps at any release spacing, up to 40 released at most 0.2 mean gaps apart, and up to 60 released
at once (without confirmation, a stall of 18 mean gaps let through at once was a change in about every
run).  The price: after an hour with no arrivals, traffic at 10× (3×) the old rate is declared within 150
(170) arrivals, since the first alarm is judged with the quiet hour counted as ``lookback`` mean gaps and
is dropped.  The Autopilot re-solves only once ``min_samples`` (default 200) post-change gaps are in, so
confirmation does not delay it.

**Batch times** (:class:`ServiceEstimator`).  For each allowed size b, the running mean x̄_b and variance
s²_b of the measured batch times (ms; Welford's recurrence, turning into an exponentially weighted one
with weight 1/``memory`` once ``memory`` batches of that size are seen), and pooled over all sizes the
ratio r = x / l_ref(b) to the reference curve (the model's l(b), or the curve of the last re-solve).  The
estimate per size is a posterior mean with pseudo-count k = ``prior_count``,
l̂(b) = (k·p(b) + n_b·x̄_b)/(k + n_b), whose prior p(b) is the reference scaled by the pooled ratio r̂
(r̄ once it rests on ``min_batches`` batches, else 1) up to the largest size measured, b_top, and beyond
it the reference plus b_top's excess, p(b) = l_ref(b) + (r̂ − 1)·l_ref(b_top): a fixed cost measured on small
batches (a thread hop, a busy event loop) is not multiplied up to the large sizes, which would shrink the
stable rate Bmax/l̂(Bmax) the Autopilot plans with; a slowdown in proportion to the work is learned at a
size once it runs.  With nothing measured p(b) is the model's own l(b).  The curve is then made
non-decreasing in b (a running maximum), as the model requires.  :meth:`ServiceEstimator.drift`
says the pooled ratio (or any size's mean) has left its band:
|r̄ − 1| > max(``rel_tol``, z·s/√n) with n ≥ ``min_batches`` batches (4 × that for one size's mean), or that a
two-sided CUSUM on the log ratio y = ln(x / l_ref(b)) has passed its threshold:
S⁺ ← max(0, S⁺ + d − κ), S⁻ ← max(0, S⁻ − d − κ), d = y − μ̂ clipped to ±max(3σ̂, 2κ), κ = ln(1 + ``rel_tol``),
alarm at h = max(10·σ̂, 4κ) (μ̂, σ̂ the log ratio's mean and spread, learned while neither sum rises; σ̂ at least
0.02; 0 and 0.3 before ``min_batches`` batches).  The floors in κ matter where the batch times barely vary (a GPU,
a deterministic model): a clip at 3σ̂ below κ would keep every sum at 0 (a 1.5× slowdown of deterministic
batches was never found), and with it a shift of κ per batch, twice the tolerance, reaches h in 4 batches.  When
a sum passes h the estimator restarts at the change point (where that sum was last 0, as the rate estimator does):
the means forget what came before and hold the batches since, and the pooled ratio is used from one batch on, so
l̂(b), and the re-solve that takes it, is the new service's at once, not a blend still mostly the old.  The
means behind the band test forget slowly (``memory`` batches), so after a long steady service they would take
hundreds of batches to move; the CUSUM restarts from 0 whenever the service is as planned, so a slowdown in
the middle of service is found as fast as from a fresh estimator.  With
the defaults (rel_tol 0.2, z 4, min_batches 8), measured on 200 seeded runs of 32 sizes
(``tests/test_estimators.py``): a 1.5× slowdown is found within 8 batches when the batch times' coefficient
of variation is ≤ 0.1 (deterministic batches included), and within 48 when it is ≤ 0.3 (the slowest of 200: 34);
an unchanged service with CV 0.02 or 0.3 was never flagged in 10 runs of 10⁴ batches.

**Batch energy** (:class:`EnergyEstimator`).  The model's ζ(b) (mJ) stays in force for every size with no
reading; a size with readings gets the posterior mean (k·ζ(b) + n_b·ē_b)/(k + n_b) of its readings.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import deque
from typing import Any, Iterable

import numpy as np

from ..limits import BATCH_MJ_MAX, BATCH_MS_MAX, RATE_MAX, RATE_MIN, READING_CLIP

#: The longest gap between two arrivals taken as one (ms): 1/RATE_MIN.  A longer one is a clock jump: rejected,
#: and the gap clock restarts at the arrival (so λ̂'s sums stay finite and every estimate within the rate limits).
GAP_MAX_MS = 1.0 / RATE_MIN
#: The service CUSUM's threshold in units of the log ratio's spread, that spread's floor, and its value before
#: ``min_batches`` batches (module docstring).
CUSUM_H, CUSUM_SD_MIN, CUSUM_SD_PRIOR = 10.0, 0.02, 0.3
#: Readings kept for the service estimator's restart at a change point (an alarm comes within this many of it).
RECENT = 64
SLOW_MEMORY = 8  # the clip's reference rate forgets SLOW_MEMORY × memory gaps, and goes on through changes
_RING = 1024  # gaps kept for the confirmation window (a fixed ring: O(1) memory)
_NO_ALARM = (0, 0.0, 0, 0.0, 0, 0.0)  # RateChange's pending alarm when there is none

__all__ = ["RateChange", "ServiceEstimator", "EnergyEstimator", "chi2_quantile"]


def _num(x: Any) -> float:
    """x as a float if it is a real number (NaN for anything else; beyond the float range: ±inf)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return math.nan
    try:
        return float(x)
    except (OverflowError, ValueError):
        return math.inf


def chi2_quantile(k: float, z: float) -> float:
    """The χ²(k) quantile at standard-normal score z, by Wilson–Hilferty: k·(1 − 2/(9k) + z·√(2/(9k)))³
    (relative error < 1 % for k ≥ 10 at |z| ≤ 3; never below 0)."""
    a = 2.0 / (9.0 * k)
    return k * max(1.0 - a + z * math.sqrt(a), 0.0) ** 3


def _forgetting(n: float, s: float, x: float, memory: int) -> tuple[float, float]:
    """(gaps, their sum) with gap x added, forgetting to a weighted mean of the last ≈ ``memory`` gaps."""
    if n >= memory:
        f = 1.0 - 1.0 / memory
        n, s = n * f, s * f
    return n + 1.0, s + x


class RateChange:
    """Online arrival rate λ̂ (1/ms) with a two-sided CUSUM change-point test (module docstring).

    ``observe(t_ms)`` takes arrival times (ms, non-decreasing; a time earlier than the last is counted in
    ``rejected`` and restarts the gap clock there), ``observe_gap(x_ms)`` takes one gap.  ``rate`` is
    λ̂ or None before ``ready`` (``ready_after`` gaps since the start or the last change).  ``band(z)``
    is its two-sided interval at normal score z.  ``changes`` counts declared changes; ``last_change`` is
    the count of gaps seen when the latest one was declared.
    """

    def __init__(self, kappa: float = 2.0, h: float = 12.0, warmup: int = 32, memory: int = 1024,
                 clip: float = 20.0, ready_after: int = 32, confirm: int = 32, lookback: float = 16.0):
        vals = (_num(kappa), _num(h), _num(clip))
        if not (vals[0] > 1 and vals[1] > 0 and vals[2] > 1 and all(math.isfinite(v) for v in vals)):
            raise ValueError(f"need kappa > 1, h > 0 and clip > 1, finite; got {kappa!r}, {h!r}, {clip!r}")
        for name, v in (("warmup", warmup), ("memory", memory), ("ready_after", ready_after), ("confirm", confirm)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 2 <= v <= 10**9:
                raise ValueError(f"{name} must be an integer in [2, 1e9], got {v!r}")
        self.kappa, self.h, self.clip = vals
        self.warmup, self.memory, self.ready_after = int(warmup), int(memory), int(ready_after)
        self.confirm = int(confirm)
        self.lookback = _num(lookback)
        if not 0 <= self.lookback <= 1e6:
            raise ValueError(f"lookback must be a number of mean gaps in [0, 1e6], got {lookback!r}")
        self._lk = math.log(self.kappa)
        self._lock = threading.Lock()
        self._last_t: float | None = None
        self._n = 0.0  # effective gaps in the estimate
        self._s = 0.0  # their (weighted) sum, ms
        self._ns = self._ss = 0.0  # the same over SLOW_MEMORY × memory gaps: the clip's reference
        self._since = 0  # gaps since the start or the last change
        self._restart()  # _up: S⁺, gaps since S⁺ was 0, their sum; _down: S⁻, likewise
        # an alarm awaiting confirmation: [side (+1 up, −1 down, 0 none), λ₀, gaps since the change point,
        # their sum, gaps since the alarm, the post-change rate when it was raised]
        self._cand = list(_NO_ALARM)
        self._ring = [0.0] * _RING  # the latest gaps as observed (ms), for the confirmation window
        self._ri = 0
        self.count = 0  # gaps taken
        self.rejected = 0
        self.clipped = 0
        self.changes = 0
        self.unconfirmed = 0  # alarms the next ``confirm`` gaps did not bear out (a stall, a burst)
        self.last_change: int | None = None

    # ------------------------------------------------------------------ input
    def observe(self, t_ms: Any) -> bool:
        """One arrival at t (ms).  True if it completed a change point."""
        t = _num(t_ms)
        with self._lock:
            if not (math.isfinite(t) and t >= 0):
                self.rejected += 1
                return False
            last, self._last_t = self._last_t, t
            if last is None:
                return False
            if not 0 <= t - last <= GAP_MAX_MS:  # the clock stepped back or jumped: the next gap counts from here
                self.rejected += 1
                return False
            return self._gap(t - last)

    def observe_gap(self, x_ms: Any) -> bool:
        """One inter-arrival gap (ms ≥ 0).  True if it completed a change point."""
        x = _num(x_ms)
        with self._lock:
            if not (math.isfinite(x) and 0 <= x <= GAP_MAX_MS):
                self.rejected += 1
                return False
            return self._gap(x)

    def _gap(self, x: float) -> bool:
        self._ring[self._ri % _RING] = x
        self._ri += 1
        self.count += 1
        self._since += 1
        alarm = False
        if self._n >= self.warmup and self._s > 0:
            lam0 = self._n / self._s
            # the clip counts in mean gaps of the slower of λ̂ and its long-memory twin: a clump of arrivals let
            # in at once inflates λ̂, and the stall before the next one must still count as the time it was
            ref = min(lam0, self._ns / self._ss) if self._ss > 0 else lam0
            if ref > 0 and x * ref > self.clip:
                x = self.clip / ref
                self.clipped += 1
            up, down = self._up, self._down
            up[0] = max(0.0, up[0] + self._lk - (self.kappa - 1.0) * lam0 * x)
            down[0] = max(0.0, down[0] - self._lk + (1.0 - 1.0 / self.kappa) * lam0 * x)
            for side in (up, down):
                if side[0] > 0:
                    side[1] += 1
                    side[2] += x
                else:
                    side[1], side[2] = 0, 0.0
            alarm = up[0] > self.h or down[0] > self.h
        cand = self._cand
        if cand[0]:
            cand[2], cand[3], cand[4] = cand[2] + 1, cand[3] + x, cand[4] + 1
            if cand[4] >= self.confirm and self._settle():
                return True
            if alarm:  # a second alarm while one is pending: its statistic starts again
                self._restart()
        elif alarm:  # pending until ``confirm`` more gaps say whether it stands; λ̂ goes on meanwhile
            sign = 1 if self._up[0] > self.h else -1
            side = self._up if sign > 0 else self._down
            self._cand = [sign, self._n / self._s, int(side[1]), float(side[2]), 0,
                          side[1] / side[2] if side[2] > 0 else math.inf]
            self._restart()
        self._absorb(x)
        return False

    def _restart(self) -> None:
        """Both CUSUM statistics from 0."""
        self._up, self._down = [0.0, 0, 0.0], [0.0, 0, 0.0]

    def _absorb(self, x: float) -> None:
        self._n, self._s = _forgetting(self._n, self._s, x, self.memory)
        self._ns, self._ss = _forgetting(self._ns, self._ss, x, SLOW_MEMORY * self.memory)

    def _settle(self) -> bool:
        """Judge the pending alarm (module docstring): N gaps over D ms from ``lookback`` mean gaps before
        its change point to now, against λ₁ = the alarm's post-change rate (at least κ^±1·λ₀)."""
        sign, lam0, n, s, est = int(self._cand[0]), self._cand[1], int(self._cand[2]), self._cand[3], self._cand[5]
        self._cand = list(_NO_ALARM)
        want, pre, k = self.lookback / lam0, 0.0, 0
        while pre < want and n + k < min(self._ri, _RING):  # back from the change point, through the ring
            pre += self._ring[(self._ri - 1 - n - k) % _RING]
            k += 1
        d = s + min(pre, want)  # each gap taken brings the arrival that ends it into the window
        seen = (n + k) / d if d > 0 else math.inf
        lam1 = max(lam0 * self.kappa, est) if sign > 0 else min(lam0 / self.kappa, est)
        cut = (lam1 - lam0) / math.log(lam1 / lam0) if math.isfinite(lam1) else math.inf
        if (seen > cut) if sign > 0 else (seen < cut):
            self._n, self._s, self._since = float(n), float(s), int(n)
            self._restart()
            self.changes += 1
            self.last_change = self.count
            return True
        self.unconfirmed += 1
        return False

    # ------------------------------------------------------------------ output
    @property
    def ready(self) -> bool:
        with self._lock:
            return self._since >= self.ready_after and self._s > 0

    @property
    def rate(self) -> float | None:
        """λ̂ = n/Σx (1/ms) since the last change, or None before ``ready``."""
        with self._lock:
            if self._since < self.ready_after or not self._s > 0:
                return None
            return min(max(self._n / self._s, RATE_MIN), RATE_MAX)

    @property
    def samples(self) -> float:
        """The effective number of gaps behind λ̂."""
        with self._lock:
            return self._n

    def band(self, z: float = 1.96) -> tuple[float, float] | None:
        """(lo, hi) of λ (1/ms) at normal score z from 2λΣX ~ χ²(2n), or None before ``ready``."""
        with self._lock:
            if self._since < self.ready_after or not self._s > 0:
                return None
            k = 2.0 * self._n
            return chi2_quantile(k, -abs(z)) / (2.0 * self._s), chi2_quantile(k, abs(z)) / (2.0 * self._s)

    def state_size(self) -> int:
        """Numbers held (constant: the memory bound the tests check)."""
        return len(self.__dict__) + len(self._up) + len(self._down) + len(self._cand) + len(self._ring)


class _PerSize:
    """Welford mean/variance per allowed size, exponentially weighted past ``memory`` observations (plain
    floats, one slot per size: fixed memory)."""

    def __init__(self, sizes: Iterable[int], memory: int):
        self.sizes = tuple(int(b) for b in sizes)
        self.index = {b: i for i, b in enumerate(self.sizes)}
        self.memory = float(memory)
        k = len(self.sizes)
        self.n, self.mean, self.var = [0.0] * k, [0.0] * k, [0.0] * k  # var: population variance

    def add(self, i: int, x: float) -> None:
        n = self.n[i] = min(self.n[i] + 1.0, self.memory)
        a = 1.0 / n
        d = x - self.mean[i]
        self.mean[i] += a * d
        self.var[i] = (1.0 - a) * (self.var[i] + a * d * d)

    def reset(self) -> None:
        k = len(self.sizes)
        self.n, self.mean, self.var = [0.0] * k, [0.0] * k, [0.0] * k


def _size_arg(b: Any, index: dict) -> int | None:
    if isinstance(b, bool) or not isinstance(b, numbers.Integral):
        return None
    return index.get(int(b))


class ServiceEstimator:
    """Measured batch times per allowed size against a reference l(b) (module docstring).

    ``sizes``: the allowed batch sizes 𝓑; ``latency_ms``: the model's l(b) on them (ms).
    ``observe(b, ms)`` one batch of size b that took ``ms`` (> 0, finite).  ``latency_ms()`` the curve l̂(b);
    ``drift()`` whether it has left the reference's band; ``rebase(curve)`` takes a new reference (the
    curve a re-solve used) and forgets the measurements.
    """

    def __init__(self, sizes: Iterable[int], latency_ms: Iterable[float], *, prior_count: float = 5.0,
                 rel_tol: float = 0.2, z: float = 4.0, min_batches: int = 8, memory: int = 1000):
        sizes = tuple(int(b) for b in sizes)
        ref = np.asarray(list(latency_ms), dtype=np.float64)
        if not sizes or ref.shape != (len(sizes),) or not np.all(np.isfinite(ref) & (ref > 0)):
            raise ValueError("need one finite l(b) > 0 (ms) per allowed batch size")
        if not (_num(prior_count) >= 0 and _num(rel_tol) > 0 and _num(z) > 0 and min_batches >= 2 and memory >= 2):
            raise ValueError("need prior_count ≥ 0, rel_tol > 0, z > 0, min_batches ≥ 2 and memory ≥ 2")
        self.model = ref.copy()
        self.reference = ref.copy()
        self._ref = [float(v) for v in ref]
        self.k, self.rel_tol, self.z = float(prior_count), float(rel_tol), float(z)
        self.min_batches = int(min_batches)
        self._per = _PerSize(sizes, memory)
        self._ratio = _PerSize((0,), memory)  # the pooled ratio x / l_ref(b)
        self._noise = _PerSize((0,), memory)  # ln(x / l_ref(b)) while the CUSUM rests: its spread σ̂
        self._up = self._down = 0.0  # the CUSUM's sums (module docstring)
        self._runs = [0, 0]  # batches since S⁺, S⁻ were last 0: the change point's estimate
        self._recent: deque[tuple[int, float]] = deque(maxlen=RECENT)  # the latest (size index, reading)
        self._changed = False  # the CUSUM fired: the means hold the batches since its change point only
        self._lock = threading.Lock()
        self.count = 0
        self.rejected = 0
        self.clipped = 0  # readings taken at READING_CLIP× the estimate

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._per.sizes

    def observe(self, b: Any, ms: Any, learn: bool = True) -> bool:
        """One batch of size b that took ``ms`` ms.  False (and counted in ``rejected``) if ignored: not a finite
        time in (0, BATCH_MS_MAX].  A reading more than READING_CLIP× away from the size's current estimate is
        taken at that bound (counted in ``clipped``): one absurd reading moves l̂(b) by a bounded amount.
        ``learn`` False: checked (and a bad one counted) but not learned from (False), e.g. a batch that ran beside
        a solve."""
        x = _num(ms)
        with self._lock:
            i = _size_arg(b, self._per.index)
            if i is None or not (math.isfinite(x) and 0 < x <= BATCH_MS_MAX):
                self.rejected += 1
                return False
            if not learn:
                return False
            x = self._winsorised(i, x)
            self._recent.append((i, x))
            self._per.add(i, x)
            self._ratio.add(0, x / self._ref[i])
            self._cusum(math.log(x / self._ref[i]))
            self.count += 1
            return True

    def _winsorised(self, i: int, x: float) -> float:
        """x within READING_CLIP× of size i's current estimate (its mean once it has ``min_batches`` batches, else
        the reference scaled by the pooled ratio)."""
        per = self._per
        anchor = per.mean[i] if per.n[i] >= self.min_batches else self._ref[i] * self._ratio_locked()
        lo, hi = anchor / READING_CLIP, anchor * READING_CLIP
        if lo <= x <= hi:
            return x
        self.clipped += 1
        return min(max(x, lo), hi)

    def _spread(self) -> tuple[float, float]:
        """(mean, sd) of the log ratio while the service is as planned (before ``min_batches``: 0 and the prior)."""
        n = self._noise
        if n.n[0] < self.min_batches:
            return 0.0, CUSUM_SD_PRIOR
        return n.mean[0], max(math.sqrt(n.var[0] * n.n[0] / (n.n[0] - 1.0)), CUSUM_SD_MIN)

    def _threshold(self) -> float:
        return max(CUSUM_H * self._spread()[1], 4.0 * math.log1p(self.rel_tol))

    def _cusum(self, y: float) -> None:
        k = math.log1p(self.rel_tol)
        mu, sd = self._spread()
        h = self._threshold()
        if self._up < 0.5 * h and self._down < 0.5 * h:  # the service as planned: its spread is the noise
            self._noise.add(0, y)
        c = max(3.0 * sd, 2.0 * k)  # one batch moves a sum by at most this (a skewed law's tail; module doc)
        d = min(max(y - mu, -c), c)
        self._up = max(0.0, self._up + d - k)
        self._down = max(0.0, self._down - d - k)
        self._runs = [self._runs[0] + 1 if self._up > 0 else 0, self._runs[1] + 1 if self._down > 0 else 0]
        if not self._changed and max(self._up, self._down) > h:  # restart at the change point (module doc)
            since = self._runs[0] if self._up > h else self._runs[1]
            self._per.reset()
            self._ratio.reset()
            for i, x in list(self._recent)[-max(since, 1):]:
                self._per.add(i, x)
                self._ratio.add(0, x / self._ref[i])
            self._changed = True

    def ratio(self) -> float:
        """The pooled ratio r̂ of measured to reference batch times: r̄ once it has ``min_batches`` batches, else 1."""
        with self._lock:
            return self._ratio_locked()

    def _ratio_locked(self) -> float:
        return self._ratio.mean[0] if self._ratio.n[0] >= (1 if self._changed else self.min_batches) else 1.0

    def latency_ms(self) -> np.ndarray:
        """l̂(b) on the allowed sizes (ms): posterior means, non-decreasing in b."""
        with self._lock:
            r = self._ratio_locked()
            n, k = np.asarray(self._per.n), self.k
            prior = self.reference * r
            seen = np.flatnonzero(n > 0)
            if seen.size:  # above the largest measured size: the reference plus that size's excess
                top = seen[-1]
                prior[top + 1:] = self.reference[top + 1:] + (r - 1.0) * self.reference[top]
            den = k + n
            est = np.where(den > 0, (k * prior + n * np.asarray(self._per.mean)) / np.where(den > 0, den, 1.0), prior)
            return np.maximum.accumulate(est)

    def counts(self) -> np.ndarray:
        """Effective batches behind each size's mean."""
        with self._lock:
            return np.asarray(self._per.n)

    def _out(self, n: float, mean: float, var: float, ref: float, least: int) -> bool:
        if n < least:
            return False
        sd = math.sqrt(var * n / (n - 1.0)) if n > 1 else 0.0
        return abs(mean - ref) > max(self.rel_tol * ref, self.z * sd / math.sqrt(n))

    def drift(self) -> bool:
        """True when the pooled ratio, or any size's mean, is outside its band around the reference."""
        with self._lock:
            if max(self._up, self._down) > self._threshold():
                return True
            if self._out(self._ratio.n[0], self._ratio.mean[0], self._ratio.var[0], 1.0, self.min_batches):
                return True
            p, least = self._per, 4 * self.min_batches  # one size of many: more data before its (noisier) test
            return any(self._out(p.n[i], p.mean[i], p.var[i], self._ref[i], least) for i in range(len(p.sizes)))

    def rebase(self, latency_ms: Iterable[float] | None = None) -> None:
        """Take ``latency_ms`` (default: the current l̂) as the new reference and forget the measurements."""
        new = self.latency_ms() if latency_ms is None else np.asarray(list(latency_ms), dtype=np.float64)
        if new.shape != self.reference.shape or not np.all(np.isfinite(new) & (new > 0)):
            raise ValueError("a reference curve needs one finite l(b) > 0 per allowed size")
        with self._lock:
            self.reference = new.copy()
            self._ref = [float(v) for v in new]
            self._per.reset()
            self._ratio.reset()
            self._up = self._down = 0.0  # the spread σ̂ is the service's own: kept
            self._runs, self._changed = [0, 0], False
            self._recent.clear()

    def state_size(self) -> int:
        p, r = self._per, self._ratio
        return (len(self.__dict__) + len(p.n) + len(p.mean) + len(p.var) + len(r.n) + len(self._noise.n)
                + self.reference.size + self.model.size + 2 * RECENT)  # the ring at its bound


class EnergyEstimator:
    """Measured batch energy per allowed size (mJ); the model's ζ(b) where there is no reading."""

    def __init__(self, sizes: Iterable[int], energy_mj: Iterable[float], *, prior_count: float = 5.0,
                 memory: int = 1000):
        sizes = tuple(int(b) for b in sizes)
        ref = np.asarray(list(energy_mj), dtype=np.float64)
        if not sizes or ref.shape != (len(sizes),) or not np.all(np.isfinite(ref) & (ref >= 0)):
            raise ValueError("need one finite ζ(b) ≥ 0 (mJ) per allowed batch size")
        self.model = ref.copy()
        self.k = float(prior_count)
        self._per = _PerSize(sizes, memory)
        self._lock = threading.Lock()
        self.count = 0
        self.rejected = 0
        self.clipped = 0

    def observe(self, b: Any, mj: Any) -> bool:
        """One batch of size b that used ``mj`` mJ (finite, ≥ 0).  False (counted) if ignored."""
        x = _num(mj)
        with self._lock:
            i = _size_arg(b, self._per.index)
            if i is None or not (math.isfinite(x) and 0 <= x <= BATCH_MJ_MAX):
                self.rejected += 1
                return False
            per = self._per
            anchor = per.mean[i] if per.n[i] >= 8 else float(self.model[i])
            if anchor > 0 and not anchor / READING_CLIP <= x <= anchor * READING_CLIP:
                x = min(max(x, anchor / READING_CLIP), anchor * READING_CLIP)  # winsorised, as batch times
                self.clipped += 1
            per.add(i, x)
            self.count += 1
            return True

    @property
    def measured(self) -> bool:
        return self.count > 0

    def energy_mj(self) -> np.ndarray:
        """ζ̂(b) on the allowed sizes (mJ)."""
        with self._lock:
            n, k = np.asarray(self._per.n), self.k
            den = k + n
            mean = np.asarray(self._per.mean)
            return np.where(n > 0, (k * self.model + n * mean) / np.where(den > 0, den, 1.0), self.model)
