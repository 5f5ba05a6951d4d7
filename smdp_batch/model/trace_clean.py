"""Arrival traces for :mod:`.fit`: input checks, tied and quantised timestamps, and the check that a fitted
model keeps the trace's mean rate.  Times in ms, rates in 1/ms.

Logs often write arrival times on a grid (whole ms, 10 ms, 1 µs): the arrivals inside one quantum then
share a timestamp.  An MMPP (any MAP) never puts two arrivals at the same instant, so the exact likelihood
of such a trace rewards a phase with an enormous rate that "explains" the zero gaps, and the fitted mean
rate lands far from the trace's (79–91 % below it on a 10 ms grid).  :func:`clean_trace` finds and undoes
the quantisation before the fit:

* **Grid.**  The largest step s among the smallest positive gap and the decimal steps {1, 2, 5}·10^k ms
  that every gap is a whole multiple of (to :data:`GRID_TOL` of s); steps finer than 1000 float64 ulps of
  the largest time are not considered (rounding cannot be told from a grid there).
* **Spread.**  With tied gaps, or a grid coarser than :data:`COARSE` of the mean gap, every arrival is
  moved to a uniform point of its quantum [t, t + s) (seeded) and the times are sorted.  Given the counts
  per quantum this is exactly the law of a Poisson process's arrivals, and an MMPP's whose phases last
  many quanta; burstiness shorter than a quantum is not in the trace at all.  A trace spanning fewer
  than :data:`MIN_QUANTA` quanta is refused: its rate and burstiness live below the grid.
* **Ties without a grid** (a few duplicated lines, at most :data:`TIES_MAX` of the gaps): the tied arrivals
  are spread within [t, t + d), d the smallest positive gap (the trace's resolution is at most d; no arrival
  passes its successor).  More ties on no grid are batch arrivals, which no MMPP has: refused.

:func:`check_rate` is the guard after a fit: the model's mean rate π·λ must be within :data:`RATE_TOL` of
the trace's (n − 1)/(t_last − t_first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..limits import RATE_MAX, RATE_MIN

__all__ = ["CleanTrace", "clean_trace", "grid_step", "check_times", "check_rate", "trace_idc", "MIN_ARRIVALS",
           "RATE_TOL"]

#: Fewest arrivals accepted.
MIN_ARRIVALS = 200
#: Largest relative gap between a fitted model's mean rate and the trace's.
RATE_TOL = 0.02
#: Fewest quanta a quantised trace must span; a gap is on a grid of step s when within GRID_TOL·s of a multiple.
MIN_QUANTA, GRID_TOL = 100, 0.01
#: A grid step at least this share of the mean gap is spread even without ties; the largest share of tied gaps
#: accepted when the times are on no common grid.
COARSE, TIES_MAX = 0.01, 0.01
#: Stream of the spread's random numbers (beside the fit's seed).
_SPREAD_STREAM = 0x71E5


def check_times(times_ms, least: int = MIN_ARRIVALS) -> np.ndarray:
    """Sorted finite arrival times (ms) as float64, at least ``least`` of them, spread over time."""
    try:
        t = np.asarray(times_ms, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("arrival times must be numbers (ms)") from None
    if t.ndim != 1:
        raise InputError(f"arrival times must be a 1-D sequence of ms, got shape {t.shape}")
    if t.size < least:
        raise InputError(f"a trace needs at least {least} arrivals to fit an MMPP, got {t.size}")
    bad = np.nonzero(~np.isfinite(t))[0]
    if bad.size:
        raise InputError(f"arrival time #{int(bad[0])} is {float(t[bad[0]])!r}; times must be finite numbers in ms")
    down = np.nonzero(np.diff(t) < 0)[0]
    if down.size:
        i = int(down[0])
        raise InputError(f"arrival times must be sorted: #{i} = {t[i]:g} ms is followed by {t[i + 1]:g} ms")
    span = float(t[-1] - t[0])
    if not span > 0:
        raise InputError(f"the trace spans 0 ms: all {t.size} arrivals are tied at {t[0]:g} ms (every gap is 0); "
                         "times must spread over time")
    rate = (t.size - 1) / span
    if not RATE_MIN * 1e3 <= rate <= RATE_MAX * 1e-3:
        raise InputError(f"the trace's mean rate {rate:.3g} /ms is outside [{RATE_MIN * 1e3:g}, {RATE_MAX * 1e-3:g}] /ms; "
                         "give the times in ms")
    return t


def window_counts(t: np.ndarray, window: float) -> np.ndarray:
    """Arrivals in each full window [t_0 + jw, t_0 + (j + 1)w)."""
    full = int((t[-1] - t[0]) // window)
    idx = ((t - t[0]) // window).astype(np.int64)
    return np.bincount(idx[idx < full], minlength=full)


def trace_idc(times_ms, window_ms: float) -> float:
    """Index of dispersion of counts of the trace over consecutive full windows of ``window_ms`` ms."""
    c = window_counts(np.asarray(times_ms, dtype=np.float64), float(window_ms))
    mean = c.mean() if c.size else 0.0
    return float(c.var(ddof=1) / mean) if c.size >= 2 and mean > 0 else math.nan


def grid_step(times_ms) -> float | None:
    """The common grid step of the timestamps (ms; module docstring), or None when they are on none."""
    t = np.asarray(times_ms, dtype=np.float64)
    gaps = np.diff(t)
    pos = gaps[gaps > 0]
    if pos.size == 0:
        return None
    least = float(pos.min())
    floor = 1000.0 * float(np.spacing(max(abs(t[0]), abs(t[-1]), least)))
    steps = {least} | {m * 10.0**k for k in range(-9, 7) for m in (1, 2, 5)}
    for s in sorted((s for s in steps if floor <= s <= least * (1 + GRID_TOL)), reverse=True):
        for part in (pos[:1000], pos):  # a quick reject on the first gaps, then all of them
            r = part / s
            if not np.all(np.abs(r - np.round(r)) <= GRID_TOL):
                break
        else:
            return float(s)
    return None


@dataclass(frozen=True)
class CleanTrace:
    """A trace ready for the fit: ``times`` (ms, sorted; where tied or quantised, spread and counted from the first
    arrival) and what was done."""

    times: np.ndarray
    tied: int  # zero gaps in the trace as given
    tied_share: float  # of its n − 1 gaps
    quantum_ms: float | None  # the common grid step, if any
    spread: str  # "none", "quantum" (every arrival within its quantum) or "ties" (tied arrivals only)
    note: str | None

    def as_dict(self) -> dict:
        """The fit report's ``timestamps`` object (docs/json.md ``fit-arrivals``)."""
        return {"tied_gaps": self.tied, "tied_share": self.tied_share, "quantum_ms": self.quantum_ms,
                "spread": self.spread}


def _share(x: float) -> str:
    return f"{100 * x:.2g} %" if x < 0.1 else f"{100 * x:.0f} %"


_UNITS = {1e3: "second", 1.0: "millisecond", 1e-3: "microsecond", 1e-6: "nanosecond"}


def _quantum(s: float) -> str:
    return next((name for v, name in _UNITS.items() if abs(s / v - 1) < 1e-9), f"{s:g} ms quantum")


def clean_trace(times_ms, seed: int = 0) -> CleanTrace:
    """Detect tied and quantised timestamps of a checked trace and spread them (module docstring); seeded."""
    t = np.asarray(times_ms, dtype=np.float64)
    gaps = np.diff(t)
    tied = int(np.count_nonzero(gaps == 0))
    share = tied / gaps.size
    span = float(t[-1] - t[0])
    s = grid_step(t)
    rng = np.random.default_rng([int(seed), _SPREAD_STREAM])
    if s is not None and (tied or s >= COARSE * span / gaps.size):
        if span / s < MIN_QUANTA:
            distinct = int(gaps.size - tied + 1)
            raise InputError(
                f"the trace's times are quantised to {s:g} ms ({_share(share)} of gaps tied) and span only "
                f"{span / s:.0f} quant{'um' if round(span / s) == 1 else 'a'} ({distinct} distinct times): at least {MIN_QUANTA} are needed to tell its rate "
                "and burstiness; give finer timestamps or a longer trace")
        out = np.sort((t - t[0]) + s * rng.random(t.size))  # from the first arrival: full precision for epoch times
        note = (f"timestamps quantised to {s:g} ms: {_share(share)} tied gaps; each arrival spread uniformly within "
                f"its {_quantum(s)} (seeded)")
        if share > max(TIES_MAX, 20 * s * gaps.size / span):  # ~10× what a Poisson stream on this grid ties
            note += "; far more ties than the grid explains: batched arrivals, fitted as a short phase of high rate"
        return CleanTrace(out, tied, share, s, "quantum", note)
    if tied:
        if share > TIES_MAX:
            most = int(np.max(np.diff(np.r_[-1, np.nonzero(gaps)[0], gaps.size])))
            raise InputError(
                f"{_share(share)} of the trace's gaps are 0 (up to {most} arrivals at one time) but its times lie on "
                f"no common grid, so they cannot be spread within a quantum; an MMPP has no simultaneous arrivals "
                f"(at most {100 * TIES_MAX:g} % tied gaps accepted): give each arrival its own time")
        d = float(gaps[gaps > 0].min())
        out = t - t[0]
        idx = np.nonzero(gaps == 0)[0] + 1
        out[idx] += d * rng.random(idx.size)
        note = (f"{tied} tied timestamps ({_share(share)} of gaps) on no common grid: the tied arrivals spread "
                f"uniformly within {d:.3g} ms, the smallest non-zero gap (seeded)")
        return CleanTrace(np.sort(out), tied, share, s, "ties", note)
    return CleanTrace(t, 0, 0.0, s, "none", None)


def check_rate(model_rate: float, trace_rate: float, what: str) -> None:
    """Refuse a fitted model whose mean rate is more than RATE_TOL off the trace's (one line)."""
    off = model_rate / trace_rate - 1.0
    if not abs(off) <= RATE_TOL:
        raise InputError(
            f"the {what}'s mean rate {model_rate:.6g} /ms is {abs(off) * 100:.3g} % {'above' if off > 0 else 'below'} "
            f"the trace's {trace_rate:.6g} /ms (at most {RATE_TOL * 100:g} % allowed); it would misstate the load: "
            "check the trace's timestamps, or fit fewer phases")
