"""The Autopilot's closed loop: integral control of the share of responses over the limit, by the live timer.

A plan is solved for a target p99, but what the responses meet is the plan plus everything it does not model
(the server's own time, a noisy host, a slow estimate).  :class:`TimerControl` watches the responses the
Autopilot is given, in windows of ``window`` (100), and moves a multiplier m = e^u on the live plan's timer with
no re-solve.  With k of the window's n responses over the limit (SLO − ``overhead_ms``), s = k/n and s* the
``target_share`` (1 %, what a p99 allows):

    k > s*·n + 1:  u ← u − min(g·(s − s*)/s*, ``step``)    (tighten: 3 of 100 by 10 %, 10 of 100 by 36 %)
    k = 0:         u ← u + g/4                             (relax by 1.25 %, never past the plan: m ≤ ``hi`` = 1)
    otherwise:     hold                                    (1 or 2 of 100: the binomial noise of a 1 % share)

with u ≥ ln ``lo`` (m ≥ 0.05) and g = 0.05.  The law is an integral one: it moves until the windows that
tighten and those that relax balance, which for a share s happens where P(k = 0)·g/4 equals P(k > s*n + 1) times
the mean tightening — about s = 0.85 % — so the share over the limit settles below 1 %, and a plan that already
meets it (s ≈ s*, whose clean windows outnumber its noisy ones) keeps its own timer.  A breach is answered within
a window; the slack is taken back slowly.  Relaxing stops at the plan's timer: beyond it the tail of a batcher
with near-deterministic batches rises as a cliff (every request that waits for the timer crosses at once), which
an integral law only finds by crossing it.  With m < 1 a plan with no timer gets one: m × its planned p99.

**The sign of the effect.**  A tighter timer means smaller batches, and where each batch costs the server time the
model does not see (a dispatch, a Python backend's per-batch work on a host short of CPU) smaller batches raise
the delay instead of cutting it; an integral law would then tighten without end, down to batches of one and a
queue that grows.  So each run of tightening windows is watched: when the third and the fourth in a row are both
over the limit more than the first was (beyond the first's binomial noise, k > k₁ + 2√k₁ + 1: one window can be
worse by the lag of the requests that queued before the tightening, two in a row rarely), the timer goes back to
the plan's (m = 1, the larger batches) and tightening rests for ``cooldown`` windows (30); ``inversions`` counts
them.  (A single instance that serves everything waiting cannot show it: a backlog makes its batches large again
whatever the timer; it takes a server whose own work slows with its batch count, as on a host short of CPU.)

The timer is what moves the tail of a table + timer plan at once: the oldest request waits at most the timer,
so its response is at most the timer plus a batch.  A swap halves u: the new plan was solved with the latest
estimates, which model part of what the loop corrected (a slowdown it held until the re-solve), and the rest (the
server's own time, which no plan models) is found again within a few windows.

**The rollback's sequential test** (:class:`BreachTest`).  After a swap the rollback watch judged the new plan
on full windows of 500 responses after a grace of 100 (12-20 s at 30-50 requests/s: longer than a phase).  A
Bernoulli CUSUM on the same indicator, response over the limit, tests a share p₀ = 1 % against p₁ = 5 %:
S ← max(0, S + ln(p₁/p₀)) for a breach, S ← max(0, S + ln((1 − p₁)/(1 − p₀))) for one within (each breach adds
1.61, each clean response takes 0.041 away), and calls a judgement when S ≥ h = ln 1000 after at least 100
responses: a plan with 10 % over is judged after about 100 responses, one at 1 % goes on to its windows (from
h, a run of that length under p₀ is about 1/1000 as likely as under p₁).

**The margin after a rollback** (:class:`Margin`): the overshoot seen (observed − planned p99), which the plans
after it keep below their target, halved by each swap that holds and every 15 s: at 10 requests/s a watch of 600
responses takes a minute, and one overshoot (a hiccup of the server's path, a change's onset) says little about the
traffic after it.

numpy only; not thread-safe by itself (the Autopilot holds its lock around every call).
"""

from __future__ import annotations

import copy
import math

import numpy as np

__all__ = ["BreachTest", "Margin", "TimerControl"]


class TimerControl:
    """An integral controller of the share of responses over a limit, acting on a multiplier of the live timer."""

    def __init__(self, target_share: float = 0.01, window: int = 100, gain: float = 0.05, step: float = 0.45,
                 lo: float = 0.05, hi: float = 1.0, cooldown: int = 30):
        if not (0 < target_share < 1 and window >= 10 and gain > 0 and step > 0 and 0 < lo <= 1 <= hi
                and cooldown >= 0):
            raise ValueError("need 0 < target_share < 1, window ≥ 10, gain > 0, step > 0, 0 < lo ≤ 1 ≤ hi and "
                             "cooldown ≥ 0")
        self.target_share, self.window, self.gain, self.step = float(target_share), int(window), float(gain), float(step)
        self.u_lo, self.u_hi, self.cooldown = math.log(lo), math.log(hi), int(cooldown)
        self.u = 0.0
        self.windows = self.inversions = 0  # windows judged; runs of tightening that made it worse (module doc)
        self._n = self._over = 0
        self._run, self._first, self._worse, self._rest = 0, 0, 0, 0  # tightening windows in a row; the first's count;
        # those since worse than it; windows of rest left
        self._shown: tuple = (None, 0.0, None)  # (plan, u, the retimed table): built once per plan and step

    @property
    def scale(self) -> float:
        """The multiplier m on the live timer."""
        return math.exp(self.u)

    def add(self, ms: np.ndarray, limit_ms: float) -> bool:
        """Count responses ``ms`` against ``limit_ms``; True when a full window moved the multiplier."""
        self._n += int(ms.size)
        self._over += int(np.count_nonzero(ms > limit_ms))
        if self._n < self.window:
            return False
        n, over = self._n, self._over
        self._n = self._over = 0
        self.windows += 1
        self._rest = max(self._rest - 1, 0)
        if over > self.target_share * n + 1.0 and self._rest == 0:  # tighten, watching the sign (module doc)
            self._run += 1
            if self._run == 1:
                self._first, self._worse = over, 0
            elif self._run >= 3:
                worse = over > self._first + 2.0 * math.sqrt(self._first) + 1.0
                self._worse = self._worse + 1 if worse else 0
                if self._worse >= 2:
                    self.inversions += 1
                    self._run, self._rest = 0, self.cooldown
                    moved, self.u = self.u != 0.0, 0.0
                    return moved
            d = -min(self.gain * (over / n - self.target_share) / self.target_share, self.step)
        elif over == 0:
            self._run, d = 0, 0.25 * self.gain
        else:  # within the window's binomial noise (or resting): hold
            self._run = 0
            return False
        u = min(max(self.u + d, self.u_lo), self.u_hi)
        moved, self.u = u != self.u, u
        return moved

    def reset(self) -> None:
        self.u, self._n, self._over, self._run, self._rest = 0.0, 0, 0, 0, 0

    def swapped(self) -> None:
        """A new plan went live: it was solved with the latest estimates, which model part of what the loop
        corrected, so half the correction goes (module doc)."""
        self.u *= 0.5

    def timer_ms(self, plan) -> float | None:
        """The timer in force for ``plan`` (a :class:`~smdp_batch.autopilot.plan.Plan`): m × its timer; with none,
        m × its planned p99 while m < 1, else None."""
        base = plan.timer_ms
        if base is None or not math.isfinite(base):
            return self.scale * plan.p99_ms if self.u < 0 and math.isfinite(plan.p99_ms) else None
        return self.scale * base

    def table(self, plan):
        """``plan``'s table with the timer in force as its ``meta["max_wait_ms"]`` (what the batcher reads under
        ``max_wait_ms="auto"``): the plan's own table while m = 1, else a copy built once per plan and step."""
        if self.u == 0.0:
            return plan.table
        shown_plan, shown_u, table = self._shown
        if shown_plan is plan and shown_u == self.u:
            return table
        table = copy.copy(plan.table)
        table.meta = {**plan.table.meta, "max_wait_ms": self.timer_ms(plan)}
        self._shown = (plan, self.u, table)
        return table


class BreachTest:
    """A Bernoulli CUSUM of responses over a limit, a share ``p0`` against ``p1`` (module doc): :meth:`add` says
    when the evidence for ``p1`` reaches ``h`` after at least ``least`` responses; :meth:`reset` starts over."""

    def __init__(self, p0: float = 0.01, p1: float = 0.05, h: float = math.log(1000.0), least: int = 100):
        if not (0 < p0 < p1 < 1 and h > 0 and least >= 1):
            raise ValueError("need 0 < p0 < p1 < 1, h > 0 and least ≥ 1")
        self.up, self.down = math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))
        self.h, self.least = float(h), int(least)
        self.s, self.n = 0.0, 0  # the statistic; responses since the reset

    def add(self, ms: np.ndarray, limit_ms: float) -> bool:
        over = np.asarray(ms) > limit_ms
        if over.size:  # S_k = max(0, S_{k−1} + x_k) for the batch at once: C_k − min(0, min_{j≤k} C_j), C = S + Σx
            c = self.s + np.cumsum(np.where(over, self.up, self.down))
            self.s = max(float(c[-1] - min(0.0, float(c.min()))), 0.0)
        self.n += int(over.size)
        return self.s >= self.h and self.n >= self.least

    def reset(self) -> None:
        self.s, self.n = 0.0, 0


class Margin:
    """What the plans after a rollback keep below their target (ms; module doc): the overshoot seen, capped; halved by
    each swap that holds (:meth:`halve`) and every ``half_life_s`` of the clock (s).

    >>> m = Margin()
    >>> m.raise_to(20.0, now=0.0, cap_ms=12.5)
    >>> m.at(15.0), m.at(30.0)
    (6.25, 3.125)
    """

    def __init__(self, half_life_s: float = 15.0):
        self.half_life_s, self.ms, self._at = float(half_life_s), 0.0, 0.0  # ms: as of the last look, clock s

    def at(self, now: float) -> float:
        """The margin at clock time ``now`` (s), ms; below 0.1 ms it is gone."""
        if self.ms > 0.0:
            m = self.ms * 0.5 ** (max(now - self._at, 0.0) / self.half_life_s)
            self.ms, self._at = (m if m >= 0.1 else 0.0), now
        return self.ms

    def raise_to(self, ms: float, now: float, cap_ms: float) -> None:
        """At least ``ms`` from ``now`` on (a new overshoot), at most ``cap_ms``."""
        self.ms, self._at = min(max(self.at(now), float(ms)), cap_ms), now

    def halve(self) -> None:
        self.ms *= 0.5
