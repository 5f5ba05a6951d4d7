"""The delay search of the SLO optimiser (:mod:`smdp_batch.analysis.slo`): along one delay knob d ∈ [0, cap] ms
(Triton's ``max_queue_delay``, TF-Serving's and Ray Serve's timeouts, TorchServe's ``maxBatchDelay``, a table's
timer τ), where more delay means larger batches and less power, the least-power setting that meets the SLO.

The search brackets the largest feasible delay by doubling from a guess (or halving; waiting too little can break
the SLO too, and then it looks above), and bisects geometrically to :data:`RTOL`.  A delay at which the timer
closed no batch of the stream at any load simulated (``LoadResult.timer_batches`` 0) serves the stream in the
same batches as any longer delay, so the doubling stops there: the answer is the one the doubling to ``cap``
would give, without its runs (with lognormal σ = 1 batch times, a fifth of the SLO search's simulations).
"""

from __future__ import annotations

import math

from .slo_answer import Setting, _better

__all__ = ["largest_delay", "RTOL"]

#: The bisection stops when the bracket's ends are within this share of each other.
RTOL = 0.01


def largest_delay(check, cap: float, guess: float | None = None, inf_first: bool = False,
                  scale: float | None = None) -> Setting | None:
    """The least-power feasible setting along a delay knob d ∈ [0, cap] (ms), where more delay means larger
    batches: bracket the largest feasible d by doubling from ``guess`` (default ``scale``/16), bisect to 1 %.
    ``check(d)`` → Setting.  ``scale`` (default ``cap``; 4 × the tightest bound) sets where the search starts
    and the least delay it tells from 0 (``scale``/4096): a loose second bound (a mean of 10⁶ ms beside a p99
    of 50 ms) widens ``cap`` but must not move the search away from the delays the tight bound allows.  The
    doubling stops at a delay whose timer closed no batch (module doc)."""
    span = cap if scale is None else min(scale, cap)
    best = None
    if inf_first:  # a pure table: the timer is only a guard
        s = check(math.inf)
        if s.meets:
            return s
    tried: dict[float, Setting] = {}

    def at(d: float) -> Setting:
        if d not in tried:
            tried[d] = check(d)
        return tried[d]

    def unbound(d: float) -> bool:  # at(d)'s timer closed no batch: every longer delay decides the same
        return bool(at(d).loads) and all(x.timer_batches == 0 for x in at(d).loads)

    lo_ok, hi_bad = None, None
    d = min(cap, guess if guess and guess > 0 else span / 16.0)
    floor = span / 4096.0
    if at(d).meets:
        lo_ok = d
        while d < cap and not unbound(d):
            d = min(cap, 2.0 * d)
            if at(d).meets:
                lo_ok = d
            else:
                hi_bad = d
                break
    else:
        hi_bad = d
        while d > floor:
            d /= 2.0
            if at(d).meets:
                lo_ok = d
                break
            hi_bad = d
        if lo_ok is None:
            if at(0.0).meets:
                lo_ok = 0.0
            else:  # waiting too little can break the SLO too (small batches, long queues): look above
                d = hi_bad = min(cap, (guess or span / 16.0))
                while d < cap and lo_ok is None and not unbound(d):
                    d = min(cap, 2.0 * d)
                    if at(d).meets:
                        lo_ok = d
                if lo_ok is None:
                    return None
                hi_bad = None
                while d < cap and not unbound(d):
                    d = min(cap, 2.0 * d)
                    if not at(d).meets:
                        hi_bad = d
                        break
                    lo_ok = d
    if hi_bad is not None and hi_bad > lo_ok:
        a, b = lo_ok, hi_bad
        while b - a > RTOL * b and b > floor:
            m = math.sqrt(a * b) if a > 0 else 0.5 * b
            if at(m).meets:
                a = m
            else:
                b = m
    for s in tried.values():
        best = _better(best, s)
    return best
