"""The server's outside delay, learned online: what each response spends beyond the batcher's view, per load.

A served plan (:mod:`smdp_batch.model.served`) adds to the batch model's response — wait + batch — the time the
server spends outside it: the front end and hand-offs, each response's return (the k-th of a batch leaves about k·r
after the first where the server answers a batch's requests one at a time), the legs to the client.  ``smdp-batch
calibrate`` measures it before serving; while serving, an integration that knows both times of a request — the
batcher's (entry → batch end) and the end-to-end one (entry → answer sent, or the client's send → answer) — tells the
Autopilot both (``Autopilot.observe_served(ms, batch_ms=…)``), and this estimator learns the difference

    o = end-to-end − batcher's view   (ms, per request)

at the traffic's rate when it was served, so that a plan at another load draws the delay measured there, as a
calibration's does:

* **per load**: o is kept in bins of the estimated rate λ̂, each a factor 1.25 wide (geometric), the latest
  :data:`BIN_SIZE` per bin; a bin is used once it holds :data:`MIN_SAMPLES` (three of its values then lie above its
  p99; a plan's interval carries that p99's bootstrap width, ``ServedDelay.halfwidth``).  A front end that is
  CPU-bound adds more at a higher load, and a rate step lands in another bin rather than being averaged with the old
  one.
* **recent**: told the time (``now_s``), a bin plans with its delays of the last :data:`MAX_AGE_S` seconds (at least
  its latest :data:`MIN_SAMPLES`, so that a load the traffic left keeps what was last learned there).  A stall of the
  host — a second in which every response waits — puts about 1 % of a bin's delays far out: kept for the bin's whole
  4 000 (over two minutes at 30 requests/s) it held that bin's p99 up, and through the deployment factor below every
  unlearned load's, long after it passed; on a real Ray Serve run the plan at a rate step then found no setting with
  room and served timeout 0.  A host that stalls every minute keeps a stall in every window, and plans allow for it.
* **per position**: where a batch's requests are told together in FIFO order, the return per position r is the
  least-squares slope of o on the position k within each batch, o − ō_b = r·(k − k̄_b) (the batch's own mean taken
  out, so that a load or a batch size that raises every response's o does not enter r); r ≥ 0, fitted from
  :data:`MIN_BATCHES` batches of two or more.  The bins then hold o − r·k, and a plan adds r·k by the position each
  request takes in its simulated batch (a larger batch returns its last request later).  Told one request at a time
  (no positions), the bins hold o whole (the positions' part drawn as a load's average) and r is 0, or the
  calibration's r where one was given: then the positions' part counts twice, on the safe side.

:meth:`OutsideLearner.model` hands the planner a :class:`~smdp_batch.model.served.ServedDelay`: the learned loads
(each bin's centre) with their samples, r, and from a calibration given to the Autopilot its per-batch time a + c·b
and carried load (the calibrated loads the learned bins do not cover keep their samples, scaled as below; the carried load
rises to the top of the highest learned bin, since the server answered there: a path that did not keep up shows as
delays no plan meets, not as a refusal).

**Between deployments.**  A calibration was measured on another deployment, at another time: on a noisy 2-core host
its outside p99 at 15 requests/s was 27.4 ms where the Autopilot's own deployment learned 11-20 ms, and every plan at a
load not learned yet drew the calibration's and ran a 5-11 ms timer for a phase.  So the calibration's samples at the
loads no bin covers are scaled by this deployment's factor, the geometric mean over the learned bins of their p99 ÷
the calibration's p99 at the same load (its samples there by the same quantile average by log-load), within [1/3, 3]
(:data:`FACTOR_MIN`): the multiplicative effect of a deployment that ``calibrate``'s spread between runs also models
(log of a run's p99 ÷ its plan).  Before a bin is learned the factor is 1 (the calibration as measured).

A calibration's spread between deployments (``new_run_share``: how far another deployment's p99 may land from its plan,
which ``export`` and ``compare`` add to a setting's interval) is left out of every plan, learned load or not: it is
what a static setting deployed elsewhere must allow for with nothing watching it, and the Autopilot watches the one
deployment it serves (its closed loop tightens the timer within a window of 100 responses, its rollback watch judges
every swap).  Kept, with ± 172 % on a noisy host, it left no setting room at any load not learned yet, and the
Autopilot served Ray's timeout 0 (batches of one) through the first phase and a ramp.  The calibration sample's own
uncertainty (the bootstrap of its percentiles) stays in every plan's interval.  numpy only; not thread-safe by itself
(the Autopilot holds its lock around every call).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

__all__ = ["OutsideLearner", "BIN_RATIO", "BIN_SIZE", "FACTOR_MIN", "MAX_AGE_S", "MIN_SAMPLES", "MIN_BATCHES"]

BIN_RATIO = 1.25  #: the rate bins' width: λ̂ within a factor 1.25
BIN_SIZE = 4000  #: the latest outside delays kept per bin
MIN_SAMPLES = 300  #: a bin is planned with once it holds this many
MAX_AGE_S = 60.0  #: a bin plans with its delays of the last minute (at least its latest MIN_SAMPLES): module doc
MIN_BATCHES = 50  #: batches of two or more before the return per position is fitted (else 0, or the calibration's)
FACTOR_MIN = 1.0 / 3.0  #: this deployment's outside delay against the calibration's is taken within [1/3, 3]
_MOST_MS = 1e6  # a difference beyond ±1000 s is not a measurement (ServedDelay's own bound)


class _Ring:
    """The latest ``size`` values of one rate bin: outside delay (ms), position, the rate λ̂ it came at (req/s) and
    when (s; NaN: not told)."""

    def __init__(self, size: int):
        self.o, self.k, self.lam, self.n, self.i = np.empty(size), np.zeros(size), np.zeros(size), 0, 0
        self.t = np.full(size, np.nan)

    def add(self, o: np.ndarray, k: np.ndarray, lam: float, t: float) -> None:
        o, k = o[-self.o.size:], k[-self.o.size:]
        idx = (self.i + np.arange(o.size)) % self.o.size
        self.o[idx], self.k[idx], self.lam[idx], self.t[idx] = o, k, lam, t
        self.i, self.n = (self.i + o.size) % self.o.size, min(self.n + o.size, self.o.size)

    def latest(self, since: float) -> np.ndarray:
        """The slots planned with: those told at ``since`` (s) or later, at least the latest :data:`MIN_SAMPLES`
        (all of them for ``since`` = −∞)."""
        if since == -math.inf:
            return np.arange(self.n)
        m = min(max(int(np.count_nonzero(self.t[:self.n] >= since)), MIN_SAMPLES), self.n)
        return (self.i - 1 - np.arange(m)) % self.o.size  # told in time order: the latest m slots end before i

    def values(self, r: float, since: float) -> np.ndarray:
        j = self.latest(since)
        return np.sort(self.o[j] - r * self.k[j])


def _mix(a: np.ndarray, b: np.ndarray, w: float) -> np.ndarray:
    """The quantile average (1 − w)·Q_a + w·Q_b of two sorted samples, on :data:`BIN_SIZE` levels at most."""
    u = (np.arange(n := min(max(a.size, b.size), BIN_SIZE)) + 0.5) / n
    return (1.0 - w) * np.quantile(a, u) + w * np.quantile(b, u)


class OutsideLearner:
    """The outside delay per rate bin and the return per position, learned from (batcher's view, end-to-end) pairs
    (module doc).  ``base``: a calibration (:class:`~smdp_batch.model.served.ServedDelay`) whose per-batch time, carried
    load and uncovered loads the learned model keeps; None: a + c·b = 0, nothing refused."""

    def __init__(self, base: Any = None):
        self.base = None if base is None else replace(base, stats=tuple(  # module doc: the Autopilot's own deployment
            {k: v for k, v in st.items() if k != "new_run_share"} for st in base.stats))
        self._bins: dict[int, _Ring] = {}
        self._sxy = self._sxx = 0.0  # Σ (k − k̄)(o − ō), Σ (k − k̄)² over batches of two or more
        self.batches = 0  # batches of two or more told with their positions
        self.pairs = 0  # requests learned from
        self.rejected = 0  # pairs left out (not finite, or beyond ±1000 s, or no rate yet)
        self._checked, self._planned = 0, math.nan  # pairs at the last check of moved(); the p99 the last solve drew
        self._now = -math.inf  # the latest time told (s): bins plan with their delays since MAX_AGE_S before it

    def observe(self, lam_per_ms: float | None, batch_ms: Any, served_ms: Any, positions: bool,
                now_s: float | None = None) -> None:
        """One batch's requests (``positions``: in FIFO order, the k-th at position k) or any responses (one, or a
        list with unknown positions): their batcher's view and end-to-end times (ms), at rate λ̂ (1/ms), told at
        ``now_s`` (s, a clock that does not step back; None: no age is kept, every bin plans with its latest
        :data:`BIN_SIZE`)."""
        try:
            b = np.asarray(batch_ms, dtype=np.float64).ravel()
            s = np.asarray(served_ms, dtype=np.float64).ravel()
        except (TypeError, ValueError, OverflowError):
            self.rejected += 1
            return
        if b.size != s.size or lam_per_ms is None or not (math.isfinite(lam_per_ms) and lam_per_ms > 0):
            self.rejected += max(b.size, s.size, 1)
            return
        o = s - b
        ok = np.isfinite(o) & (np.abs(o) <= _MOST_MS) & np.isfinite(b) & (b >= 0)
        k = np.arange(o.size, dtype=np.float64) if positions else np.zeros(o.size)
        if not ok.all():
            self.rejected += int((~ok).sum())
            o, k, positions = o[ok], k[ok], False  # a gap breaks the positions
        if o.size == 0:
            return
        if positions and o.size >= 2:
            dk, do = k - k.mean(), o - o.mean()
            self._sxy += float(dk @ do)
            self._sxx += float(dk @ dk)
            self.batches += 1
        per_s = lam_per_ms * 1e3
        key = round(math.log(per_s) / math.log(BIN_RATIO))
        ring = self._bins.get(key)
        if ring is None:
            ring = self._bins[key] = _Ring(BIN_SIZE)
        t = math.nan
        if now_s is not None and math.isfinite(now_s):
            t = self._now = max(self._now, float(now_s))
        ring.add(o, k, per_s, t)
        self.pairs += int(o.size)

    @property
    def return_ms(self) -> float:
        """r, ms per position: fitted once :data:`MIN_BATCHES` batches came with positions, else the calibration's
        (0 without one)."""
        if self.batches < MIN_BATCHES or self._sxx <= 0:
            return 0.0 if self.base is None else float(self.base.return_ms)
        return max(self._sxy / self._sxx, 0.0)

    def points(self) -> list[tuple[float, np.ndarray]]:
        """(load in req/s, sorted outside delays less r·k, ms), by load: every bin holding :data:`MIN_SAMPLES` at
        the mean λ̂ of its values, and the calibration's loads that lie in no such bin (× this deployment's factor)."""
        return [(x, self._values(src)) for x, src in self._points()]

    def _points(self) -> list[tuple[float, Any]]:  # (load, its ring or the calibration's sample): values sorted lazily
        since = self._now - MAX_AGE_S
        pts: list[tuple[float, Any]] = [(float(ring.lam[ring.latest(since)].mean()), ring)
                                        for ring in self._full().values()]
        if self.base is not None:
            f = self._factor(pts)
            pts += [(x, o * f) for x, o in zip(self.base.loads_per_s, self.base.outside_ms) if not self._covered(x)]
        return sorted(pts, key=lambda p: p[0])

    def _factor(self, learned: list[tuple[float, Any]]) -> float:
        """This deployment's outside delay against the calibration's (module doc): the geometric mean over the learned
        bins of their p99 ÷ the calibration's p99 at the same load, within [1/3, 3]; 1 with no bin or no calibration."""
        if self.base is None:
            return 1.0
        cal = list(zip(self.base.loads_per_s, self.base.outside_ms))
        logs = [math.log(mine / theirs) for x, ring in learned
                if (mine := float(np.percentile(self._values(ring), 99))) > 0
                and (theirs := float(np.percentile(self._sample(cal, x), 99))) > 0]
        return float(np.clip(math.exp(sum(logs) / len(logs)), FACTOR_MIN, 1.0 / FACTOR_MIN)) if logs else 1.0

    def _covered(self, per_s: float) -> bool:
        """Whether ``per_s`` (req/s) lies in a learned bin."""
        return any(BIN_RATIO ** (k - 0.5) <= per_s < BIN_RATIO ** (k + 0.5) for k in self._full())

    def _full(self) -> dict[int, _Ring]:
        """The bins planned with: those holding :data:`MIN_SAMPLES`, by key."""
        return {k: ring for k, ring in self._bins.items() if ring.n >= MIN_SAMPLES}

    def _values(self, src: Any) -> np.ndarray:
        if not isinstance(src, _Ring):
            return src
        r = 0.0 if self.batches < MIN_BATCHES else self.return_ms  # a calibration's r is not in them
        return src.values(r, self._now - MAX_AGE_S)

    def sample_at(self, lam_per_ms: float) -> np.ndarray | None:
        """The outside delays (ms, sorted) at λ (1/ms): between two points, their quantile average weighted by
        log-load; beyond them, the nearest point's; None without points."""
        pts = self._points()
        return self._sample(pts, float(lam_per_ms) * 1e3) if pts else None

    def _sample(self, pts: list[tuple[float, Any]], x: float) -> np.ndarray:  # sample_at on the points, at x req/s
        j = int(np.searchsorted([p[0] for p in pts], x))
        if j == 0 or j == len(pts):
            return self._values(pts[min(j, len(pts) - 1)][1])
        (x0, a), (x1, b) = pts[j - 1], pts[j]
        return _mix(self._values(a), self._values(b), math.log(x / x0) / math.log(x1 / x0))

    def learned(self) -> bool:
        """Whether a bin holds :data:`MIN_SAMPLES` (before that, plans use the calibration, or no outside delay)."""
        return bool(self._full())

    def p99_at(self, lam_per_ms: float) -> float:
        """The outside delay's p99 (ms) a plan at λ (1/ms) draws (0 without a model)."""
        sample = self.sample_at(lam_per_ms)
        return 0.0 if sample is None else float(np.percentile(sample, 99))

    def planning(self, lams: list[float]) -> Any:
        """The model a solve at the loads ``lams`` (1/ms, the first its λ̂) plans with (:meth:`model`);
        :meth:`moved` is judged from its p99 at λ̂."""
        self._planned = self.p99_at(lams[0])
        return self.model(lams)

    @property
    def planned_p99_ms(self) -> float | None:
        """The outside delay's p99 (ms) at λ̂ that the last :meth:`planning` drew; None before one drew any."""
        return round(self._planned, 3) if math.isfinite(self._planned) and self._planned > 0 else None

    def moved(self, lam_per_ms: float | None, tol_ms: float) -> bool:
        """Whether, every 100 pairs, the p99 a plan at λ would draw left the last :meth:`planning`'s: by more than
        ``tol_ms`` and beyond the sample's own 99.9 % interval for its p99 (order statistics n·0.99 ± 3.29·√(n·0.99·0.01);
        asked every 100 pairs, a 95 % one still re-planned on noise).  A minute's p99 at 15 requests/s rests on 9
        values above it, and its moves of a few ms from draw to draw re-planned 2.7 times in five stationary minutes
        on the simulated clock.  With this test, over 20 seeded five-minute streams of Exp delays at 15/s: one false
        move in 5 of them, and the same delays 1.5× as long found in all 20, within 10-50 s."""
        if lam_per_ms is None or self.pairs < self._checked + 100:
            return False
        self._checked = self.pairs
        sample = self.sample_at(lam_per_ms)
        if sample is None:
            return abs(self._planned) > tol_ms
        n, q = sample.size, 0.99
        d = 3.29 * math.sqrt(n * q * (1.0 - q))
        lo, hi = sample[max(int(math.floor(n * q - d)), 0)], sample[min(int(math.ceil(n * q + d)), n - 1)]
        return abs(float(np.percentile(sample, 99)) - self._planned) > tol_ms and not lo <= self._planned <= hi

    def model(self, lams: list[float]) -> Any:
        """The :class:`~smdp_batch.model.served.ServedDelay` a plan at the loads ``lams`` (1/ms) uses: the calibration
        while no bin is full enough (None without one); else a point at each load with :meth:`sample_at`'s delays
        (and the statistics of the calibrated load each would have used), beside the calibration's own loads."""
        from ..model.served import ServedDelay

        base = self.base
        if not self.learned():
            return base
        per_s, have = sorted({float(x) * 1e3 for x in lams}), self._points()  # (learned: a bin is among them)
        pts = {x: (self._sample(have, x), self._stats_at(x)) for x in per_s}
        if base is not None:  # its loads no bin covers keep their samples (× the factor) and statistics (what it
            kept = {x: o for x, o in have if not isinstance(o, _Ring)}  # refuses, and why); one a bin covers would be
            for i, x in enumerate(base.loads_per_s):  # drawn, in place of the learned, by a simulation whose rate ran
                if x in kept and all(abs(x / y - 1.0) > 1e-9 for y in per_s):  # a bit high (_points left it out)
                    pts[x] = (kept[x], base.stats[i] if i < len(base.stats) else {})
        loads = sorted(pts)
        samples, stats = tuple(pts[x][0] for x in loads), tuple(pts[x][1] for x in loads)
        source = {"outside": f"learned online from {self.pairs} responses"}
        if base is None:
            return ServedDelay(0.0, 0.0, self.return_ms, tuple(loads), samples, stats=stats, source=source)
        carried = base.carried_per_s  # the server answered every learned load: its path carried it
        top = BIN_RATIO ** (max(self._full()) + 0.5)
        if carried is not None and top > carried:
            carried = top
        return replace(base, return_ms=self.return_ms, loads_per_s=tuple(loads), outside_ms=samples, stats=stats,
                       carried_per_s=carried, source={**base.source, **source})

    def _stats_at(self, per_s: float) -> dict:
        """The statistics of the calibrated load a plan at ``per_s`` (req/s) would use (:meth:`ServedDelay.index_at`)."""
        base = self.base
        i = -1 if base is None else base.index_at(per_s / 1e3)
        return base.stats[i] if base is not None and i < len(base.stats) else {}
