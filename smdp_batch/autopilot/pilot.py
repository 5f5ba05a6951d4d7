"""Autopilot: a policy that re-solves its own table when the traffic or the server changes.

Use it wherever a table goes (``DynamicBatcher(infer, Autopilot(problem, slo_p99_ms))``).  It serves one live *plan* —
a :class:`~smdp_batch.runtime.PolicyTable` and its timer — and learns from the batcher's hooks:

* ``observe_arrival(t_ms)`` feeds a :class:`~smdp_batch.autopilot.estimators.RateChange` (λ̂, change points);
* ``observe_batch(b, seconds, ok)`` feeds a :class:`~smdp_batch.autopilot.estimators.ServiceEstimator` (l̂(b) and its
  drift), the energy meter (on a GPU: NVML's counter, :mod:`~smdp_batch.autopilot.energy_meter`) and counts the batch
  per size (the metrics' histogram); ``observe_energy(b, mJ)`` an
  :class:`~smdp_batch.autopilot.estimators.EnergyEstimator` (used while the meter has no estimate);
* ``observe_response(ms)`` (the batcher's view, entry → batch end; one time or a batch's list) feeds the responses
  seen: the closed loop, the rollback watch, the excess; ``observe_served(ms)`` (end-to-end times, the server's
  record of entry → answer sent, or the client's) replaces that view from its first call; told with ``batch_ms``, the
  same requests' batcher view, it learns their difference, the outside delay, per load (:mod:`.outside`): plans add it.

When the rate estimator declares a change (and its post-change estimate has ``min_samples`` gaps), λ̂'s band leaves the
live plan's λ by more than ``rate_tol`` (a ramp the change test misses), the service estimator drifts by at least
``service_tol_ms`` at some size (or at a high load), the energy meter's ζ̂(b) leaves the curve of the last solve by more
than ``energy_tol`` (20 %) at a size that ran, the learned excess moves, or the learned outside delay's p99 at λ̂ moves
by max(2 ms, 5 % of the SLO) beyond its noise, the Autopilot builds the problem at λ̂ with the l̂(b) curve (ζ̂(b) where energy is
measured; the default solver: the outside delay learned at each planned load) and re-solves it with a time budget, at
most once per ``min_interval_s`` (a change found during a solve as soon as it ends), **in a lower-priority child
process** (:mod:`~smdp_batch.autopilot.solve_process`; a thread with ``solve_in="thread"``, the default for a solver you
pass). The default solver is the SLO optimiser (:func:`smdp_batch.analysis.slo.optimise`, family ``smdp``: the
least-power SMDP table + timer whose simulated p99 plus its 95 % half-width meets the *target* at λ̂ and at both edges
of λ̂'s one-σ band). The target is SLO − ``overhead_ms`` (the share of the SLO spent outside the response times it is
told: network, client) − the learned excess (with ``learn=True``: the p99 of the latest responses less the p99 planned
for them, smoothed and capped at half the SLO). The new plan goes live only if it meets the target with finite planned
metrics (the same table and timer again is kept, not swapped; the default solver also simulates the live plan on the
same arrivals and keeps it unless the new one saves 2 % of its power); the swap is one reference assignment, and
``decide(n)`` reads that reference once, so every batch is decided wholly by one table.

Rollback: after a swap, the next responses (after ``grace``) are watched in windows of ``window``; one whose p99 exceeds
SLO − ``overhead_ms`` and the replaced plan's (at this load: simulated by the default solver, plus the excess its last
window showed; else its last window), each by over ``tolerance``, puts that plan back; ``watch`` clean windows make the
new one the last good. A plan put back that was made for another load (λ̂'s band excludes its λ) re-plans at once.

When no table meets the target at λ̂ (``infeasible``, retried with the back-off below), the solver's best effort there
goes live when it has one (:func:`~smdp_batch.autopilot.plan.slo_plan`: the greedy table, when its simulated p99 at λ̂
is below the live plan's, made for another load), judged by the rollback watch as any swap; so does the initial solve's
(a calibration's outside delay may leave no room until this deployment's is learned); no answer at all: ValueError.

Guards: a solver that raises, returns nothing usable (NaN metrics, a table not meeting the target, unknown batch sizes)
or runs past ``budget_s`` (a child process is killed; a thread cannot be, so it is abandoned, at most ``max_threads``
run at once and a late result is dropped), and an estimate out of range (λ̂ at or above 98 % of the stable rate
Bmax/l̂(Bmax)) never stop serving: the live plan stays, the event is counted and logged (a JSON line). A failed or
infeasible solve (or an out-of-range estimate) is retried after max(``min_interval_s``, 0.1 s) × 2^(failures in a row),
≤ 300 s; a solve that keeps the live plan backs off the same way, 2^(kept in a row), so that stationary noise does not
re-solve every ``min_interval_s``; a change of rate ends both. A plan rolled back is not swapped in again while solves
plan it within 25 % of the load it failed at (``blocked``, counted with the kept; the last 8), nor as a best effort:
swap, fail, roll back was a cycle (8 swaps, 6 rollbacks in one run); and the plans after it keep a margin of its
overshoot (:class:`~.control.Margin`, ≤ 25 % of SLO − overhead; halved by each swap that holds and every 15 s), each
move of the target by over max(2 ms, 5 % of the SLO) a re-plan — unless it planned tighter (a learned excess) or timed
shorter than the plan put back: its smaller batches raised what no plan models (a host short of CPU), so the excess
returns to that plan's, unlearned for 30 s, and a shorter timer bars every plan as short at that load
(:class:`~.plan.Blocked`). The solve clock (``clock``, s) is made monotone (a step back: no time passed); with
``solve_in="clock"`` a solve takes ``solve_seconds`` of it (:mod:`.simulated`'s mode).

The hooks never raise. Importing this module needs numpy only; the default solver imports the analysis (numba, scipy) in
the solve process, the first plan's too (a full garbage collection over numba's objects stalled serving 50-70 ms). One
idea, the Autopilot's state machine: hooks, solve schedule, plans and rollback watch share one state under one lock, and
a batch is decided by one read of the live plan; the rest stands beside it (responses, estimators, energy meter, plan
and solver, solve process, metrics).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import threading
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..limits import SLO_MAX_MS
from .energy_meter import open_meter
from .estimators import EnergyEstimator, RateChange, ServiceEstimator, _num, _size_arg
from .control import BreachTest, Margin, TimerControl
from .hooks import never_raises as _never_raises
from .outside import OutsideLearner
from .plan import PLAN_FAMILIES, RUNNING, Blocked, Job, Plan, _same, shorter_timer, slo_plan
from .report import EVENT_PREFIX, AutopilotMetrics
from .responses import Responses, response_times
from ..runtime.table import PolicyTable

__all__ = ["Autopilot", "AutopilotMetrics", "Plan", "slo_plan"]

log = logging.getLogger("smdp_batch")
_IDS = itertools.count(1)
_RETRY_MAX_S = 300.0
_MARGIN_MAX = 0.25  # module doc: the margin's cap (× SLO − overhead)
_RATE_CHECK_EVERY = 64  # arrivals between two checks of λ̂ against the plan's λ
_LEARN_RATE_TOL = 0.25  # the excess is learned only while λ̂ is within 25 % of the live plan's λ
_LEARN_EVERY, _LEARN_MIN = 100, 200  # responses between two updates of the excess; in the ring before the first
_ENERGY_CHECK_EVERY = 64  # metered batches between two checks of ζ̂ against the curve of the last solve
_EXCESS_MAX = 0.5  # the learned excess takes at most half the SLO (less the overhead budget)
_EXCESS_REST_S = 30.0  # after a tighter plan is rolled back, the excess is not learned for this long (module doc)


class Autopilot:
    """A self-re-solving policy for :class:`~smdp_batch.runtime.DynamicBatcher` (module docstring).

    ``problem``: the :class:`~smdp_batch.model.problem.BatchingProblem` (λ, 𝓑, l(b), ζ(b), service law); ``slo_p99_ms``:
    the p99 response-time SLO (ms). ``table``: the initial table (a PolicyTable or a :class:`Plan`); default: solved now
    by ``solver`` at ``problem.lam``. ``solver(problem, slo_ms, lams)`` returns a :class:`Plan` or None (default
    :func:`slo_plan`); ``budget_s``: its time budget (s). ``overhead_ms``: the part of the SLO spent outside the
    response times it is told (network, proxy, client), ms. ``solve_in``: ``"process"`` (a child at ``nice`` +10,
    SCHED_IDLE on Linux; the default with the default solver), ``"thread"`` (the default with a given ``solver``, which
    then need not be picklable) or ``"clock"`` (the solve runs at once in the hook that starts it, and its result goes
    live ``solve_seconds`` of ``clock`` later: the simulated-clock mode of :mod:`~smdp_batch.autopilot.simulated`).
    ``close()`` ends the child. ``energy_meter``: ``"auto"`` (NVML's energy counter of the process's GPU where there is
    one), None, or a meter of your own (:func:`~smdp_batch.autopilot.energy_meter.open_meter`). ``control``: the closed
    loop on the share of responses over SLO − ``overhead_ms`` (a :class:`~smdp_batch.autopilot.control.TimerControl`;
    True: the default one; False: the plans' timers as solved). ``family``: what the default solver plans, "smdp" (a
    table + timer), "ray" (Ray Serve's batcher, its timeout set live) or "triton" (Triton's batcher, its delay chosen
    live among loaded models: :mod:`~smdp_batch.integrations.triton_bank`): :func:`~smdp_batch.autopilot.plan.slo_plan`.
    ``served``: what the server adds (``ServedDelay.load`` of ``calibrate``'s file, less its spread between deployments),
    which the default solver plans served p99s with: feed it end-to-end times (``observe_served``).
    ``learn_outside``: learn the outside delay per load from ``observe_served(ms, batch_ms)``'s pairs and plan with it
    (:mod:`~smdp_batch.autopilot.outside`; a calibration's loads it does not cover stay as calibrated)."""

    _previous: Plan | None  # the plan a swap replaced, while its watch runs
    _proc: Any  # the solve process (solve_in="process")

    def __init__(self, problem: Any, slo_p99_ms: float, table: PolicyTable | Plan | None = None, *,
                 solver: Callable[..., Plan | None] | None = None, budget_s: float = 10.0, overhead_ms: float = 0.0,
                 solve_in: str | None = None, nice: int = 10, service_tol_ms: float | None = None,
                 rate_tol: float = 0.25, learn: bool = False, rate: RateChange | None = None,
                 service: ServiceEstimator | None = None, energy: EnergyEstimator | None = None,
                 min_samples: int = 200, window: int = 500, grace: int = 100, tolerance: float = 0.1,
                 watch: int = 3, min_interval_s: float = 5.0, max_threads: int = 2,
                 clock: Callable[[], float] = time.monotonic, energy_meter: Any = "auto", energy_tol: float = 0.2,
                 solve_seconds: float = 1.0, control: bool | TimerControl = True, family: str = "smdp",
                 served: Any = None, learn_outside: bool = True):
        slo = _num(slo_p99_ms)
        if not (math.isfinite(slo) and slo > 0):
            raise ValueError(f"slo_p99_ms must be a finite number of ms > 0, got {slo_p99_ms!r}")
        if slo > SLO_MAX_MS:
            raise ValueError(f"slo_p99_ms must be at most {SLO_MAX_MS:g} ms (about 17 minutes: the SLO optimiser's "
                             f"limit, beyond which the servers' integer timers no longer fit), got {slo_p99_ms!r}")
        for name, v in (("budget_s", budget_s), ("tolerance", tolerance), ("min_interval_s", min_interval_s),
                        ("overhead_ms", overhead_ms), ("rate_tol", rate_tol), ("energy_tol", energy_tol),
                        ("solve_seconds", solve_seconds)):
            if not (math.isfinite(_num(v)) and _num(v) >= 0):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
        if not _num(overhead_ms) < slo:
            raise ValueError(f"overhead_ms must be below the SLO ({slo:g} ms), got {overhead_ms!r}")
        if service_tol_ms is not None and not (math.isfinite(_num(service_tol_ms)) and _num(service_tol_ms) >= 0):
            raise ValueError(f"service_tol_ms must be a finite number of ms ≥ 0 or None, got {service_tol_ms!r}")
        if not (window >= 100 and grace >= 0 and watch >= 1 and max_threads >= 1 and min_samples >= 2):
            raise ValueError("need window ≥ 100, grace ≥ 0, watch ≥ 1, max_threads ≥ 1 and min_samples ≥ 2")
        if family not in PLAN_FAMILIES:
            raise ValueError(f"family must be one of {', '.join(PLAN_FAMILIES)}, got {family!r}")
        if served is not None and not callable(getattr(served, "add_to", None)):
            raise TypeError(f"served must be a ServedDelay (smdp-batch calibrate's file: ServedDelay.load(path)), "
                            f"got {served!r}")
        if solve_in not in (None, "process", "thread", "clock"):
            raise ValueError(f"solve_in must be 'process', 'thread', 'clock' or None, got {solve_in!r}")
        self.problem, self.slo_ms = problem, slo
        self.solver, self.family, self.served, self.learn_outside = solver or slo_plan, family, served, bool(learn_outside)
        self.budget_s, self.tolerance, self.min_interval_s = float(budget_s), float(tolerance), float(min_interval_s)
        self.overhead_ms, self.rate_tol, self.learn = float(overhead_ms), float(rate_tol), bool(learn)
        self.service_tol_ms = 0.05 * slo if service_tol_ms is None else float(service_tol_ms)
        self.min_samples, self.window, self.grace, self.watch = int(min_samples), int(window), int(grace), int(watch)
        self.max_threads, self.solve_seconds = int(max_threads), float(solve_seconds)
        self.control, self._breach = TimerControl() if control is True else control or None, BreachTest()
        self.sizes, self.rate = tuple(problem.batch_sizes), rate or RateChange()
        self.service = service or ServiceEstimator(self.sizes, problem.latency_ms())
        self.energy = energy or EnergyEstimator(self.sizes, problem.energy_mj())
        self.meter, self.energy_tol = open_meter(energy_meter, self.sizes, problem), float(energy_tol)
        self._zeta_ref = np.asarray(problem.energy_mj(), dtype=np.float64)  # ζ(b) of the last solve (mJ)
        self._metered, self._clock, self._tlast, self._offset = 0, clock, -math.inf, 0.0  # batches metered; the clock
        self._lock = threading.RLock()
        self._job: Job | None = None  # the solve in flight
        self._solve_end, self.overlapped = -math.inf, 0  # the latest solve's end (s); batches beside a solve (not learned)
        self._abandoned: list[threading.Thread] = []  # thread mode: at most max_threads (pruned when they end)
        self._dirty: str | None = None
        self._not_before, self._last_start = -math.inf, -math.inf  # next solve allowed; the latest started (s)
        self._fails, self._kept = 0, 0  # solves in a row that failed / kept the live plan (each doubles the next wait)
        self._blocked = Blocked()  # plans rolled back, each with the rates it may not return at
        self._resp = Responses(self.window)  # the latest response times, each with the p99 planned for it
        self._served = False  # whether end-to-end times come (observe_served): then the batcher's view is left out
        self._outside = OutsideLearner(served)  # learned, and what the next solve plans with (:mod:`.outside`)
        self._plan_served = self._outside.planning([problem.lam])
        self._unlearned, self._rest_until = 0, -math.inf  # responses since the excess was learned; its rest (clock s)
        self._index, self._batches = {b: i for i, b in enumerate(self.sizes)}, [0] * len(self.sizes)  # batches per size
        self._seen, self._windows, self._watching, self._watch_ok = 0, 0, False, 0  # responses, windows since a swap
        self._good_p99 = math.nan  # the p99 of the latest window judged under the last good plan (ms)
        self._excess, self._arrivals, self._margin = 0.0, 0, Margin()  # learned excess (ms); arrivals since a λ̂ check
        self._c = dict(swaps=0, rollbacks=0, failed_solves=0, infeasible=0, out_of_range=0, solves=0, late_results=0,
                       best_effort=0, kept=0)
        self._hook_errors, self._proc, self._last_solve_s, self._event = 0, None, math.nan, "start"  # hooks that raised
        self.solve_in, fallback = solve_in or ("process" if solver is None else "thread"), None
        args = (problem, self._target(), [float(problem.lam)])
        if self.solve_in == "process":  # with a table given, a warm-up solve loads the default solver's kernels now
            from .solve_process import SolveProcessError, open_process
            try:
                self._proc = open_process(self._solver(None), nice, args if self.solver is slo_plan and table is not None else None)
            except SolveProcessError as exc:
                self.solve_in, fallback = "thread", str(exc)[:200]
        solved = self._initial(args) if table is None else None
        effort = table is None and isinstance(solved, Plan) and Plan.usable(solved, self.sizes) and not solved.meets
        if table is None and not effort and not Plan.usable(solved, self.sizes, self._target()):
            raise ValueError(f"no table meets p99 ≤ {self._target():g} ms at λ = {problem.lam:.6g}/ms and the solver "
                             "gave no best effort (initial solve)")
        plan = Plan.given(table, problem.lam) if solved is None else replace(solved, target_ms=self._target())
        self._live: Plan = replace(plan, id=next(_IDS))
        self._good, self._previous = self._live, None
        if effort:  # counted and retried as a re-solve's: what is learned while serving may leave room (module doc)
            self._c["best_effort"] += 1
            self._failed(self._now(), "infeasible", "infeasible", reason="start", best_effort=self._live.spec)
        if fallback is not None:
            self._count(None, "solve-in-thread", logging.WARNING, error=fallback)

    def _initial(self, args: tuple) -> Any:  # in the solve process where there is one (module doc: imports)
        from .solve_process import SolveProcessError
        try:
            return self._proc.call(self._solver(None), *args) if self._proc is not None else self._solver(None)(*args)
        except SolveProcessError:
            return self._solver(None)(*args)

    def _solver(self, incumbent: Plan | None) -> Callable[..., Any]:  # the default solver knows the live plan and family
        return self.solver if self.solver is not slo_plan else functools.partial(
            slo_plan, incumbent=incumbent, family=self.family, served=self._plan_served)

    def close(self) -> None:
        """End the solve process (if any); the live table keeps serving, and no further solve starts."""
        with self._lock:
            self._not_before = math.inf
            proc, self._proc = self._proc, None
        for part in (proc, self.meter):
            if part is not None:
                part.close()

    # ------------------------------------------------------------------ the policy
    def decide(self, n: int) -> int:
        """Batch size at queue length n, from the live table (one reference read)."""
        return self._live.table.decide(n)

    @property
    def table(self) -> PolicyTable:
        """The live table; its ``meta["max_wait_ms"]`` (the timer in force) bounds the batcher's wait under "auto"."""
        return self._live.table if self.control is None else self.control.table(self._live)

    @property
    def plan(self) -> Plan:
        return self._live

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self._live.table.batch_sizes

    @property
    def max_wait_ms(self) -> float | None:
        """The timer in force (ms): the live plan's, times the closed loop's multiplier; None for none."""
        return self._live.timer_ms if self.control is None else self.control.timer_ms(self._live)

    # ------------------------------------------------------------------ hooks (never raise)
    @_never_raises
    def observe_arrival(self, t_ms: Any) -> None:
        if self.rate.observe(t_ms):
            with self._lock:  # a new load: what failed or was infeasible at the old one may not be now
                if self._fails or self._kept:
                    self._fails, self._kept, self._not_before = 0, 0, self._last_start + self.min_interval_s
            self._trigger("rate")
        else:
            self._arrivals = (self._arrivals + 1) % _RATE_CHECK_EVERY
            if self._arrivals == 0 and self._off_rate(self._live):  # a slow change the change test misses (a ramp)
                self._trigger("rate")
        self.poll()

    def _off_rate(self, plan: Plan) -> bool:
        """Whether λ̂'s band excludes the plan's λ, by more than ``rate_tol``."""
        lam, band = self.rate.rate, self.rate.band()
        return lam is not None and band is not None and self.rate.samples >= self.min_samples \
            and not band[0] <= plan.lam <= band[1] and abs(lam / plan.lam - 1.0) > self.rate_tol

    @_never_raises
    def observe_batch(self, b: Any, seconds: Any, ok: bool = True) -> None:
        """One executed batch of size b that took ``seconds``; a failed batch (``ok`` False) teaches nothing."""
        i = _size_arg(b, self._index)
        overlap = False  # a batch that ran beside a solve ran on a busier host: its time is not the model's
        if i is not None:
            with self._lock:
                self._batches[i] += 1
                overlap = ok and (self._job is not None or self._now() - self._solve_end < _num(seconds))
                self.overlapped += overlap
        if ok and self.meter is not None:
            self.meter.batch(b, seconds)
            self._metered += 1
            if self._metered % _ENERGY_CHECK_EVERY == 0 and self._dirty is None and self._job is None \
                    and self._energy_moved():
                self._trigger("energy")
        if ok and self.service.observe(b, _num(seconds) * 1e3, learn=not overlap) and self._dirty is None \
                and self._job is None and self.service.drift() and self._material():  # (a pending solve takes it)
            self._trigger("service")
        self.poll()

    def _material(self) -> bool:
        """Whether a drift of l̂(b) can matter: it moved from the curve of the last solve by ``service_tol_ms`` at
        some size, or the load is high (λ̂·l̂(Bmax)/Bmax ≥ 0.5), where a relative change moves the queue."""
        cur = self.service.latency_ms()
        lam = self.rate.rate
        busy = lam is not None and lam * float(cur[-1]) / self.sizes[-1] >= 0.5
        return busy or bool(np.max(np.abs(cur - self.service.reference)) >= self.service_tol_ms)

    def _energy_moved(self) -> bool:
        """Whether the meter's ζ̂(b) left the last solve's curve by more than ``energy_tol`` at a size that ran."""
        ran, zeta = np.asarray(self._batches) > 0, self.meter.energy_mj(self.service.latency_ms())
        return zeta is not None and bool(np.any(ran & (np.abs(zeta - self._zeta_ref) > self.energy_tol * self._zeta_ref)))

    @_never_raises
    def observe_energy(self, b: Any, mj: Any) -> None:
        self.energy.observe(b, mj)

    @_never_raises
    def observe_response(self, ms: Any) -> None:
        """One response time (ms) from batcher entry to batch end, or a batch's list: the batcher's hook.  Left out
        once :meth:`observe_served` has been called (those times replace this view)."""
        if not self._served:
            self._responses(ms)

    @_never_raises
    def observe_served(self, ms: Any, batch_ms: Any = None) -> None:
        """End-to-end response times (ms), one or a list, as the server recorded them (entry → answer sent) or the
        client did.  From the first call on they replace the batcher's view in the closed loop, the rollback watch,
        the learned excess and ``observed_p99_ms``; ``overhead_ms`` is then what these times leave out.  ``batch_ms``:
        the same requests' batcher view (entry → batch end; a list: one batch's, in FIFO order): their difference is
        the outside delay, learned per load and age (:mod:`.outside`) and planned with."""
        self._served = True
        if batch_ms is not None and self.learn_outside:
            with self._lock:
                self._outside.observe(self.rate.rate, batch_ms, ms, isinstance(ms, (list, tuple, np.ndarray)), self._now())
                if self._outside.moved(self.rate.rate, max(2.0, 0.05 * self.slo_ms)):
                    self._dirty = self._dirty or "outside"
        self._responses(ms)

    def _responses(self, ms: Any) -> None:  # a value that is not a time in [0, 10 × the optimiser's limit]: left out
        k = (vals := response_times(ms, 10.0 * SLO_MAX_MS)).size
        if k == 0:
            return
        with self._lock:
            self._resp.add(vals, self._live.p99_ms)
            if self.control is not None:
                self.control.add(vals, self.slo_ms - self.overhead_ms)
            self._seen, self._unlearned = self._seen + k, self._unlearned + k
            if self._watching and self._seen > self.grace and self._breach.add(  # the sequential test: judge now
                    vals[-(self._seen - self.grace):], self.slo_ms - self.overhead_ms):
                self._window_done(self._resp.p99(self._breach.n))
            while self._seen >= self.grace + self.window * (self._windows + 1):  # a full window under the live plan
                self._windows += 1
                self._window_done(self._resp.p99())
            if self.learn and self._unlearned >= _LEARN_EVERY and self._learn():
                self._unlearned = 0

    def _window_done(self, p99: float) -> None:
        """Judge one full window of the live plan's responses: while watching a swap, roll back when it breaks
        the limit and is worse than the plan it replaced; otherwise remember it as the good plan's p99."""
        live = self._live
        if not self._watching:
            self._good_p99 = p99  # the last good plan's latest window
        else:
            limit, old = (self.slo_ms - self.overhead_ms) * (1.0 + self.tolerance), self._good_p99  # NaN: unknown
            if math.isfinite(live.incumbent_p99_ms):  # the replaced plan at this load: simulated, + the excess it showed
                old = live.incumbent_p99_ms + max(float(np.nan_to_num(self._good_p99 - self._good.p99_ms)), 0.0)
            worse = not p99 <= old * (1.0 + self.tolerance)  # than the plan it replaced
            if p99 > limit and worse and self._previous is not None:
                back = self._live = self._good = self._previous  # the plan put back
                self._previous, self._seen, self._windows, self._watching = None, 0, 0, False
                shorter = shorter_timer(live, back)
                lo, hi = self._blocked.add(live, floor=shorter)
                if live.target_ms < back.target_ms or shorter:  # did worse with smaller batches: what no plan models
                    # grew as they shrank (module doc)
                    self._excess = min(self._excess, self._live_excess())  # the plan put back is live
                    self._rest_until = self._now() + _EXCESS_REST_S
                else:
                    self._margin.raise_to(p99 - live.p99_ms, self._now(), _MARGIN_MAX * (self.slo_ms - self.overhead_ms))
                self._dirty = self._dirty or ("rollback" if self._off_rate(back) else None)  # planned for another load
                self._count("rollbacks", "rollback", table=live.id, to=self._live.id, observed_p99_ms=p99, blocked=[lo, hi])
            else:
                self._watch_ok += 1
                self._breach.reset()
                if self._watch_ok >= self.watch:  # it holds: half the margin, which must not stay for ever
                    self._good, self._previous, self._watching = live, None, False
                    self._margin.halve()
                    self._moved("margin")

    def _learn(self) -> bool:
        """The excess (module doc), while λ̂ is within 25 % of the live plan's λ, smoothed by halves; a move of max(2 ms,
        5 % of the SLO) from the live plan's re-plans (a p99 of a few hundred responses is noisy).  False: too few."""
        lam, live = self.rate.rate, self._live
        e = self._resp.excess(min(self.window, _LEARN_MIN))
        if e is None:
            return False
        if lam is None or abs(lam / live.lam - 1.0) > _LEARN_RATE_TOL or self._now() < self._rest_until:
            return True
        self._excess = min(self._excess + 0.5 * (e - self._excess), _EXCESS_MAX * (self.slo_ms - self.overhead_ms))
        self._moved("excess")
        return True

    def _moved(self, reason: str, rose: bool = False) -> None:  # re-plan: the next target left the live plan's
        d = self._target() - self.slo_ms + self.overhead_ms + self._live_excess()  # (a plan without one: the SLO's)
        if (d if rose else abs(d)) > max(2.0, 0.05 * self.slo_ms):  # rose: only where it went above it
            self._dirty = self._dirty or reason

    def _live_excess(self) -> float:
        return self.slo_ms - self.overhead_ms - t if math.isfinite(t := self._live.target_ms) else 0.0

    def _target(self) -> float:
        """The p99 the next solve plans for (ms): the SLO less the overhead budget, the learned excess, the margin."""
        return max(self.slo_ms - self.overhead_ms - self._excess - self._margin.ms, 1e-3)

    # ------------------------------------------------------------------ solving
    def _now(self) -> float:
        t = float(self._clock()) + self._offset
        if t < self._tlast:  # the clock stepped back: no time passed
            self._offset += self._tlast - t
            t = self._tlast
        self._tlast = t
        return t

    def _trigger(self, reason: str) -> None:
        with self._lock:
            self._dirty = self._dirty or reason

    def _count(self, key: str | None, event: str, level: int = logging.INFO, **info: Any) -> None:
        if key is not None:
            self._c[key] += 1
        self._event = event
        line = {"event": event, "live_table": self._live.id, **info}
        log.log(level, EVENT_PREFIX + "%s", json.dumps(line, sort_keys=True, default=str))

    def poll(self) -> None:
        """Run the solve schedule now (the arrival and batch hooks do): hand over a solve that has ended
        (``solve_in="clock"``), time out one past ``budget_s``, start one that is due."""
        try:
            with self._lock:
                now, job = self._now(), self._job
                if job is not None and job.out is not RUNNING and now >= job.start + self.solve_seconds:
                    self._finish(job, job.out, self.solve_seconds)
                elif job is not None and now - job.start > self.budget_s:
                    self._job, self._solve_end = None, now
                    if self._proc is not None:
                        self._proc.kill()  # the job's thread then returns at once
                    elif job.thread is not None:
                        self._abandoned.append(job.thread)
                    self._failed(now, "solve-timeout", seconds=now - job.start)
                margin = self._margin.at(now)  # decayed to now, whatever is due: the next solve's target reads it
                if self._job is None and self._dirty is None and margin:
                    self._moved("margin", rose=True)  # the margin decayed: a plan it made too tight re-plans
                if self._job is None and self._dirty is not None and now >= self._not_before:
                    self._start(now)
        except Exception as exc:  # noqa: BLE001 - a hook never stops serving
            self._count("failed_solves", "internal-error", logging.WARNING, error=repr(exc)[:200])

    def _failed(self, now: float, event: str, key: str = "failed_solves", **info: Any) -> None:
        """Count and log a failure; try again after max(min_interval_s, 0.1 s) × 2^(failures in a row), ≤ 300 s."""
        self._fails += 1
        self._dirty = self._dirty or "retry"
        self._not_before = now + self._backoff(self._fails)
        self._count(key, event, logging.WARNING, **info)

    def _backoff(self, k: int) -> float:  # the wait after k failures (or kept results) in a row, s
        return min(max(self.min_interval_s, 0.1) * 2.0 ** k, _RETRY_MAX_S)

    def _start(self, now: float) -> None:
        reason, lam = self._dirty or "", self.rate.rate
        if lam is None or (reason == "rate" and self.rate.samples < self.min_samples):
            return  # not enough post-change data yet: stay dirty
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        if len(self._abandoned) >= self.max_threads:
            return  # hung solves hold every slot: wait for one to end
        latency, band = self.service.latency_ms(), self.rate.band(1.0)
        max_lam = self.sizes[-1] / float(latency[-1])
        if not (math.isfinite(lam) and 1e-12 <= lam < 0.98 * max_lam and np.all(np.isfinite(latency))):
            self._failed(now, "out-of-range", "out_of_range", lam_hat=lam, max_lam=max_lam)
            return
        self._dirty = None
        lams = [lam]  # planned metrics at λ̂; the SLO also at both edges of its one-σ band: a table that waits
        if band is not None:  # for a fuller batch has a longer p99 at a lower rate, a busier one at a higher rate
            if band[0] < 0.99 * lam:
                lams.append(band[0])
            if band[1] > 1.01 * lam:
                lams.append(min(band[1], 0.98 * max_lam))
        job = self._job = Job(now, reason, latency, lams, self._target(), self._energy_hat(latency))
        self._c["solves"] += 1
        self._last_start = now
        self._not_before = now + self.min_interval_s
        self.service.rebase(latency)  # drift is now measured from the curve this solve uses
        self._plan_served = self._outside.planning(lams)
        if job.energy is not None:  # and the energy's too
            self._zeta_ref = np.asarray(job.energy, dtype=np.float64)
        if self.solve_in == "clock":
            return self._work(job)
        job.thread = threading.Thread(target=self._work, args=(job,), name="smdp-autopilot-solve", daemon=True)
        job.thread.start()

    def _energy_hat(self, latency: np.ndarray) -> np.ndarray | None:
        """ζ̂(b) (mJ): the energy meter's (once it has fitted enough intervals), else the readings given to
        ``observe_energy``; None while neither has any."""
        zeta = None if self.meter is None else self.meter.energy_mj(latency)
        return zeta if zeta is not None else self.energy.energy_mj() if self.energy.measured else None

    def _work(self, job: Job) -> None:
        t0 = time.perf_counter()
        try:
            args = (job.problem(self.problem), job.target, job.lams)
            solver = self._solver(self._live)
            proc = self._proc
            out: Any = proc.call(solver, *args) if proc is not None else solver(*args)
        except Exception as exc:  # noqa: BLE001 - counted, the live plan stays
            out = exc
        if self.solve_in == "clock":
            job.out = out  # poll() hands it over once solve_seconds of the clock have passed
        else:
            self._finish(job, out, time.perf_counter() - t0)
            self.poll()  # a change found while it ran is solved for now, not at the next request (module doc)

    def _finish(self, job: Job, out: Any, seconds: float) -> None:
        with self._lock:
            now = self._now()
            if self._job is not job:  # abandoned past its budget (in process mode: killed, nothing comes back)
                if self._proc is None or not isinstance(out, BaseException):
                    self._count("late_results", "solve-late", seconds=seconds)
                return
            self._job, self._solve_end, self._last_solve_s = None, now, seconds
            if (seconds if self.solve_in == "clock" else now - job.start) > self.budget_s:
                self._failed(now, "solve-timeout", seconds=seconds)
            elif isinstance(out, BaseException):
                self._failed(now, "solve-error", error=str(out)[:200], reason=job.reason)
            elif out is None or (Plan.usable(out, self.sizes) and not out.meets):
                # nothing meets the target at λ̂; a best-effort plan (the least p99 found there) still goes live
                self._failed(now, "infeasible", "infeasible", lams=job.lams, target_ms=job.target, reason=job.reason,
                             best_effort=None if out is None else out.spec)
                if out is not None and not _same(out, self._live) and out not in self._blocked:
                    self._swap(out, job, seconds, "best_effort", "best-effort")
            elif not Plan.usable(out, self.sizes, job.target):
                self._failed(now, "solve-unusable", reason=job.reason)
            elif out in self._blocked or _same(out, self._live):  # the live plan stays: back off (module doc)
                self._fails, self._kept = 0, self._kept + 1
                self._not_before = max(self._not_before, job.start + self._backoff(self._kept))
                if not _same(out, self._live):  # rolled back at this load before
                    self._count("kept", "blocked", reason=job.reason, lam=out.lam, setting=out.spec, target_ms=job.target)
                else:  # the same table and timer: nothing to swap, keep judging it
                    self._live = replace(out, id=self._live.id, target_ms=job.target)
                    self._count("kept", "kept", reason=job.reason, lam=out.lam, p99_ms=out.p99_ms, target_ms=job.target,
                                seconds=round(seconds, 4), next_in_s=round(self._not_before - now, 3))
            else:
                self._fails = self._kept = 0
                self._swap(out, job, seconds)

    def _swap(self, out: Plan, job: Job, seconds: float, key: str = "swaps", event: str = "swap") -> None:
        self._previous, self._live = self._good, replace(out, id=next(_IDS), target_ms=job.target)
        self._seen, self._windows, self._watching, self._watch_ok = 0, 0, True, 0
        self._breach.reset()
        if self.control is not None:
            self.control.swapped()
        self._count(key, event, reason=job.reason, lam=out.lam, p99_ms=out.p99_ms, power_w=out.power_w,
                    timer_ms=out.timer_ms, target_ms=job.target, seconds=round(seconds, 4), setting=out.spec,
                    latency_ms=[round(float(x), 3) for x in job.latency], outside_p99_ms=self._outside.planned_p99_ms)

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s for the solves in flight (tests, shutdown), one a solve's end starts for a change
        found while it ran included; True when none is left running."""
        end = None if timeout is None else time.monotonic() + timeout
        while (job := self._job) is not None and job.thread is not None:  # (clock mode: no thread to wait for)
            job.thread.join(None if end is None else max(end - time.monotonic(), 0.0))
            if job.thread.is_alive() or self._job is job:
                break  # timed out
        return self._job is None

    # ------------------------------------------------------------------ metrics
    @property
    def metrics(self) -> AutopilotMetrics:
        """A snapshot of the counters and estimates (what :mod:`smdp_batch.autopilot.prometheus` exports)."""
        with self._lock:
            live, c, batches = self._live, dict(self._c), tuple(self._batches)
            p50, p99 = self._resp.percentiles((50, 99))
            solve_s, event, excess, target = self._last_solve_s, self._event, self._excess, self._target()
            outside = self._outside.p99_at(self.rate.rate or self._live.lam) if self._outside.learned() else math.nan
        zeta = self._energy_hat(self.service.latency_ms())
        power = None if self.meter is None else self.meter.power_w()
        source = "model" if zeta is None else "observe_energy" if power is None else self.meter.name
        return AutopilotMetrics(
            c["swaps"], c["rollbacks"], c["failed_solves"], c["infeasible"], c["out_of_range"], c["solves"],
            c["late_results"], solve_s, live.id, live.lam, live.mean_ms, live.p99_ms, live.power_w,
            self.max_wait_ms, self.rate.rate, self.rate.band(), tuple(float(x) for x in self.service.latency_ms()),
            p99, self.rate.rejected + self.service.rejected + self.energy.rejected + self._hook_errors, event, p50,
            self.sizes, batches, tuple(float(x) for x in (self.energy.energy_mj() if zeta is None else zeta)), excess,
            self.overhead_ms, target, self.solve_in, c["kept"], c["best_effort"],
            source, math.nan if power is None else power[0], 1.0 if self.control is None else self.control.scale,
            "served" if self._served else "batcher", outside, self._outside.return_ms)

    def __repr__(self) -> str:
        return f"<Autopilot table {self._live.id} at λ = {self._live.lam:.4g}/ms, p99 SLO {self.slo_ms:g} ms>"
