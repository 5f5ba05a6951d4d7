"""Autopilot: a policy that re-solves its own table when the traffic or the server changes.

Use it wherever a table goes (``DynamicBatcher(infer, Autopilot(problem, slo_p99_ms))``).  It serves one
live *plan* — a :class:`~smdp_batch.runtime.PolicyTable` and its timer — and learns from the batcher's hooks:

* ``observe_arrival(t_ms)`` feeds a :class:`~smdp_batch.runtime.estimators.RateChange` (λ̂ and its change
  points);
* ``observe_batch(b, seconds, ok)`` feeds a :class:`~smdp_batch.runtime.estimators.ServiceEstimator` (l̂(b)
  and its drift) and counts the batch per size (the metrics' histogram); ``observe_energy(b, mJ)`` an
  :class:`~smdp_batch.runtime.estimators.EnergyEstimator`;
* ``observe_response(ms)`` (one response time, or a batch's list) feeds the observed p99 window.

When the rate estimator declares a change (and its post-change estimate has ``min_samples`` gaps), or the
service estimator drifts, the Autopilot builds the problem at λ̂ with the l̂(b) curve (ζ̂(b) where energy is
measured) and re-solves it **in a worker thread** with a time budget.  The default solver is the SLO
optimiser (:func:`smdp_batch.analysis.slo.optimise`, family ``smdp``: the least-power SMDP table + timer
whose simulated p99 plus its 95 % half-width meets the SLO at λ̂ and at the upper one-σ edge of λ̂'s band).
The new plan goes live only if it meets the SLO with finite planned metrics; the swap is one reference
assignment, and ``decide(n)`` reads that reference once, so every batch is decided wholly by one table.

Rollback: after a swap, the response times of the next requests (after ``grace`` of them, which may have
waited under the old table) are watched in windows of ``window``; a window whose p99 exceeds the SLO by more
than ``tolerance`` puts the previous plan back.  After ``watch`` clean windows the new plan is the last good.

Guards: a solver that raises, returns nothing usable (NaN metrics, a table not meeting the SLO, unknown
batch sizes) or runs past ``budget_s`` (it is abandoned: a thread cannot be killed, so at most
``max_threads`` run at once and a late result is dropped), and an estimate out of range (λ̂ at or above 98 %
of the stable rate Bmax/l̂(Bmax)) never stop serving: the live plan stays, the event is counted in
:class:`AutopilotMetrics` and logged as one JSON line on the ``smdp_batch`` logger.  A failed solve (or an out-of-range
estimate) is retried after max(``min_interval_s``, 0.1 s) × 2^(failures in a row), at most 300 s.  The solve clock (``clock``,
seconds) is made monotone: a step back counts as no time passing; a step forward may time out a solve.

The hooks never raise.  Importing this module needs numpy only; the default solver imports the analysis
(numba, scipy) when it first runs.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

import numpy as np

from .estimators import EnergyEstimator, RateChange, ServiceEstimator, _num, _size_arg
from .table import PolicyTable

__all__ = ["Autopilot", "AutopilotMetrics", "Plan", "slo_plan"]

log = logging.getLogger("smdp_batch")
_IDS = itertools.count(1)
_RETRY_MAX_S = 300.0


@dataclass(frozen=True)
class Plan:
    """A table and its timer, with the metrics planned for it at ``lam`` (1/ms): W̄ and p99 in ms, P̄ in W."""

    table: PolicyTable
    lam: float
    timer_ms: float | None = None
    mean_ms: float = math.nan
    p99_ms: float = math.nan
    power_w: float = math.nan
    meets: bool = True
    spec: str = ""
    id: int = 0


@dataclass(frozen=True)
class AutopilotMetrics:
    """A snapshot of the Autopilot's counters and estimates (ms, W, 1/ms)."""

    swaps: int
    rollbacks: int
    failed_solves: int  # raised, timed out, or returned no usable plan
    infeasible: int  # solved, but no table meets the SLO at the estimated load
    out_of_range: int  # an estimate the model cannot take (λ̂ ≥ 98 % of the stable rate)
    solves: int  # started
    late_results: int  # results of abandoned solves, dropped
    last_solve_seconds: float
    live_table: int
    planned_lam: float
    planned_mean_ms: float
    planned_p99_ms: float
    planned_power_w: float
    timer_ms: float | None
    lam_hat: float | None
    lam_band: tuple[float, float] | None
    latency_hat_ms: tuple[float, ...]
    observed_p99_ms: float
    rejected_inputs: int
    last_event: str
    observed_p50_ms: float = math.nan  # of the same window as observed_p99_ms
    batch_sizes: tuple[int, ...] = ()  # 𝓑, the order of the per-size fields below
    batches: tuple[int, ...] = ()  # executed batches of each size (failed ones too), since the start
    energy_hat_mj: tuple[float, ...] = ()  # ζ̂(b)


def slo_plan(problem: Any, slo_ms: float, lams: list[float], *, requests: int = 20_000, seed: int = 0) -> Plan | None:
    """The SLO optimiser's least-power SMDP table + timer meeting p99 ≤ ``slo_ms`` at every load in ``lams``
    (1/ms; planned metrics at ``lams[0]``), or None when no table meets it."""
    from ..analysis.slo import optimise
    from ..limits import SLO_MAX_MS

    ans = optimise(problem.replace(lam=max(lams)), {"p99": slo_ms, "mean": SLO_MAX_MS}, list(lams), families=("smdp",),
                   requests=requests, seed=seed, defaults=False)
    s = ans.best.get("smdp")
    if s is None or s.policy is None or not s.meets:
        return None
    at = min(s.loads, key=lambda x: abs(x.lam - lams[0]))
    tau = s.knobs.get("tau_ms")
    timer = float(tau) if tau is not None and math.isfinite(tau) else None
    sizes = s.knobs.get("batch_sizes") or list(problem.batch_sizes)
    meta = {"inputs": {"lam": float(lams[0])}, "max_wait_ms": timer, "setting": s.spec,
            "short_batch": "pad-up" if s.knobs.get("forced") == "pad" else "serve"}
    table = PolicyTable(np.asarray(s.policy, dtype=np.int64), sizes, meta)
    return Plan(table, float(lams[0]), timer, at.metrics["mean"], at.metrics["p99"], at.power_w, True, s.spec)


class _Job:
    __slots__ = ("thread", "start", "reason", "latency", "lams")

    def __init__(self, start: float, reason: str, latency: np.ndarray, lams: list[float]):
        self.thread: threading.Thread | None = None
        self.start, self.reason, self.latency, self.lams = start, reason, latency, lams


class Autopilot:
    """A self-re-solving policy for :class:`~smdp_batch.runtime.DynamicBatcher` (module docstring).

    ``problem``: the :class:`~smdp_batch.model.problem.BatchingProblem` (λ, 𝓑, l(b), ζ(b), service law);
    ``slo_p99_ms``: the p99 response-time SLO (ms).  ``table``: the initial table (a PolicyTable or a
    :class:`Plan`); default: solved now by ``solver`` at ``problem.lam``.  ``solver(problem, slo_ms, lams)``
    returns a :class:`Plan` or None (default :func:`slo_plan`); ``budget_s``: its time budget (s).
    """

    def __init__(self, problem: Any, slo_p99_ms: float, table: PolicyTable | Plan | None = None, *,
                 solver: Callable[..., Plan | None] | None = None, budget_s: float = 10.0,
                 rate: RateChange | None = None, service: ServiceEstimator | None = None,
                 energy: EnergyEstimator | None = None, min_samples: int = 200, window: int = 1000,
                 grace: int = 200, tolerance: float = 0.1, watch: int = 3, min_interval_s: float = 1.0,
                 max_threads: int = 2, clock: Callable[[], float] = time.monotonic):
        slo = _num(slo_p99_ms)
        if not (math.isfinite(slo) and slo > 0):
            raise ValueError(f"slo_p99_ms must be a finite number of ms > 0, got {slo_p99_ms!r}")
        for name, v in (("budget_s", budget_s), ("tolerance", tolerance), ("min_interval_s", min_interval_s)):
            if not (math.isfinite(_num(v)) and _num(v) >= 0):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
        if not (window >= 100 and grace >= 0 and watch >= 1 and max_threads >= 1 and min_samples >= 2):
            raise ValueError("need window ≥ 100, grace ≥ 0, watch ≥ 1, max_threads ≥ 1 and min_samples ≥ 2")
        self.problem, self.slo_ms = problem, slo
        self.solver = solver or slo_plan
        self.budget_s, self.tolerance, self.min_interval_s = float(budget_s), float(tolerance), float(min_interval_s)
        self.min_samples, self.window, self.grace, self.watch = int(min_samples), int(window), int(grace), int(watch)
        self.max_threads = int(max_threads)
        self.sizes = tuple(problem.batch_sizes)
        self.rate = rate or RateChange()
        self.service = service or ServiceEstimator(self.sizes, problem.latency_ms())
        self.energy = energy or EnergyEstimator(self.sizes, problem.energy_mj())
        self._clock, self._tlast, self._offset = clock, -math.inf, 0.0
        self._lock = threading.RLock()
        self._job: _Job | None = None
        self._abandoned: list[threading.Thread] = []  # at most max_threads (pruned when they end)
        self._dirty: str | None = None
        self._not_before = -math.inf
        self._fails = 0
        self._resp = np.full(self.window, math.nan)  # the latest response times (ring)
        self._resp_i = 0
        self._index = {b: i for i, b in enumerate(self.sizes)}
        self._batches = [0] * len(self.sizes)  # executed batches per size (the metrics' histogram)
        self._watch_seen = -1  # responses seen since the swap; -1: not watching
        self._watch_ok = 0
        self._c = dict(swaps=0, rollbacks=0, failed_solves=0, infeasible=0, out_of_range=0, solves=0, late_results=0)
        self._last_solve_s = math.nan
        self._event = "start"
        plan: Plan
        if table is None:
            solved = self.solver(problem, slo, [float(problem.lam)])
            if solved is None or not self._usable(solved):
                raise ValueError(f"no table meets p99 ≤ {slo:g} ms at λ = {problem.lam:.6g}/ms (initial solve)")
            plan = solved
        elif isinstance(table, Plan):
            plan = table
        elif isinstance(table, PolicyTable):
            t = table.meta.get("max_wait_ms")
            plan = Plan(table, float(table.lam or problem.lam), t if isinstance(t, (int, float)) else None)
        else:
            raise TypeError("table must be a PolicyTable, a Plan or None")
        self._live: Plan = replace(plan, id=next(_IDS))
        self._good: Plan = self._live
        self._previous: Plan | None = None

    # ------------------------------------------------------------------ the policy
    def decide(self, n: int) -> int:
        """Batch size at queue length n, from the live table (one reference read)."""
        return self._live.table.decide(n)

    @property
    def table(self) -> PolicyTable:
        """The live table (its ``meta["max_wait_ms"]`` is the batcher's bound under ``max_wait_ms="auto"``)."""
        return self._live.table

    @property
    def plan(self) -> Plan:
        return self._live

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self._live.table.batch_sizes

    @property
    def max_wait_ms(self) -> float | None:
        """The live plan's timer (ms), or None for none."""
        return self._live.timer_ms

    # ------------------------------------------------------------------ hooks (never raise)
    def observe_arrival(self, t_ms: Any) -> None:
        if self.rate.observe(t_ms):
            self._trigger("rate")
        self._poll()

    def observe_batch(self, b: Any, seconds: Any, ok: bool = True) -> None:
        """One executed batch of size b that took ``seconds``; a failed batch (``ok`` False) teaches nothing."""
        i = _size_arg(b, self._index)
        if i is not None:
            with self._lock:
                self._batches[i] += 1
        if ok and self.service.observe(b, _num(seconds) * 1e3) and self.service.drift():
            self._trigger("service")
        self._poll()

    def observe_energy(self, b: Any, mj: Any) -> None:
        self.energy.observe(b, mj)

    def observe_response(self, ms: Any) -> None:
        """One response time (ms), or an iterable of them (a batch's requests)."""
        try:
            vals = np.asarray(list(ms) if isinstance(ms, Iterable) else [ms], dtype=np.float64).ravel()
        except (TypeError, ValueError):
            return
        vals = vals[np.isfinite(vals) & (vals >= 0)]
        k = vals.size
        if k == 0:
            return
        vals = vals[-self.window:]
        with self._lock:
            self._resp[(self._resp_i + np.arange(vals.size)) % self.window] = vals
            self._resp_i = (self._resp_i + vals.size) % self.window
            if self._watch_seen < 0:
                return
            before, self._watch_seen = self._watch_seen, self._watch_seen + k
            while before < self.grace + self.window * (self._watch_ok + 1) <= self._watch_seen:  # a full window
                p99 = float(np.percentile(self._resp, 99))
                if p99 > self.slo_ms * (1.0 + self.tolerance) and self._previous is not None:
                    bad, self._live = self._live, self._previous
                    self._previous, self._watch_seen = None, -1
                    self._good = self._live
                    self._count("rollbacks", "rollback", table=bad.id, to=self._live.id, observed_p99_ms=p99)
                else:
                    self._watch_ok += 1
                    if self._watch_ok >= self.watch:
                        self._good, self._previous, self._watch_seen = self._live, None, -1

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
            self._dirty = reason if self._dirty is None else self._dirty

    def _count(self, key: str | None, event: str, level: int = logging.INFO, **info: Any) -> None:
        if key is not None:
            self._c[key] += 1
        self._event = event
        line = {"event": event, "live_table": self._live.id, **info}
        log.log(level, "autopilot %s", json.dumps(line, sort_keys=True, default=str))

    def _poll(self) -> None:
        try:
            with self._lock:
                now = self._now()
                job = self._job
                if job is not None and now - job.start > self.budget_s:
                    self._job = None
                    if job.thread is not None:
                        self._abandoned.append(job.thread)
                    self._failed(now, "solve-timeout", seconds=now - job.start)
                if self._job is None and self._dirty is not None and now >= self._not_before:
                    self._start(now)
        except Exception as exc:  # noqa: BLE001 - a hook never stops serving
            self._count("failed_solves", "internal-error", logging.WARNING, error=repr(exc)[:200])

    def _failed(self, now: float, event: str, key: str = "failed_solves", **info: Any) -> None:
        """Count and log a failure; try again after max(min_interval_s, 0.1 s) × 2^(failures in a row), ≤ 300 s."""
        self._fails += 1
        self._dirty = self._dirty or "retry"
        self._not_before = now + min(max(self.min_interval_s, 0.1) * 2.0 ** self._fails, _RETRY_MAX_S)
        self._count(key, event, logging.WARNING, **info)

    def _start(self, now: float) -> None:
        reason = self._dirty or ""
        lam = self.rate.rate
        if lam is None or (reason == "rate" and self.rate.samples < self.min_samples):
            return  # not enough post-change data yet: stay dirty
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        if len(self._abandoned) >= self.max_threads:
            return  # hung solves hold every slot: wait for one to end
        latency = self.service.latency_ms()
        band = self.rate.band(1.0)
        max_lam = self.sizes[-1] / float(latency[-1])
        if not (math.isfinite(lam) and 1e-12 <= lam < 0.98 * max_lam and np.all(np.isfinite(latency))):
            self._failed(now, "out-of-range", "out_of_range", lam_hat=lam, max_lam=max_lam)
            return
        self._dirty = None
        lams = [lam]
        if band is not None and band[1] > 1.01 * lam:
            lams.append(min(band[1], 0.98 * max_lam))
        job = self._job = _Job(now, reason, latency, lams)
        self._c["solves"] += 1
        self._not_before = now + self.min_interval_s
        self.service.rebase(latency)  # drift is now measured from the curve this solve uses
        job.thread = threading.Thread(target=self._work, args=(job,), name="smdp-autopilot-solve", daemon=True)
        job.thread.start()

    def _problem(self, job: _Job) -> Any:
        from ..model.curves import Table

        changes: dict[str, Any] = {"lam": job.lams[0], "latency": Table(self.sizes, tuple(map(float, job.latency)))}
        if self.energy.measured:
            changes["energy"] = Table(self.sizes, tuple(map(float, self.energy.energy_mj())))
        return self.problem.replace(**changes)

    def _work(self, job: _Job) -> None:
        t0 = time.perf_counter()
        try:
            out: Any = self.solver(self._problem(job), self.slo_ms, job.lams)
        except Exception as exc:  # noqa: BLE001 - counted, the live plan stays
            out = exc
        self._finish(job, out, time.perf_counter() - t0)

    def _usable(self, plan: Any) -> bool:
        if not isinstance(plan, Plan) or not isinstance(plan.table, PolicyTable):
            return False
        if not set(plan.table.batch_sizes) <= set(self.sizes):
            return False
        vals = (plan.lam, plan.p99_ms, plan.power_w, plan.mean_ms)
        return plan.meets and all(math.isfinite(_num(v)) for v in vals) and plan.p99_ms <= self.slo_ms

    def _finish(self, job: _Job, out: Any, seconds: float) -> None:
        with self._lock:
            now = self._now()
            if self._job is not job:  # abandoned past its budget
                self._count("late_results", "solve-late", seconds=seconds)
                return
            self._job = None
            self._last_solve_s = seconds
            if now - job.start > self.budget_s:
                self._failed(now, "solve-timeout", seconds=seconds)
            elif isinstance(out, BaseException):
                self._failed(now, "solve-error", error=repr(out)[:200], reason=job.reason)
            elif out is None:
                self._fails = 0
                self._count("infeasible", "infeasible", logging.WARNING, lams=job.lams, reason=job.reason)
            elif not self._usable(out):
                self._failed(now, "solve-unusable", reason=job.reason)
            else:
                self._fails = 0
                self._previous, self._live = self._good, replace(out, id=next(_IDS))
                self._watch_seen, self._watch_ok = 0, 0
                self._count("swaps", "swap", reason=job.reason, lam=out.lam, p99_ms=out.p99_ms, power_w=out.power_w,
                            timer_ms=out.timer_ms, seconds=round(seconds, 4))

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the solve in flight (tests, shutdown); True when none is left running."""
        job = self._job
        if job is not None and job.thread is not None:
            job.thread.join(timeout)
        return self._job is None

    # ------------------------------------------------------------------ metrics
    @property
    def metrics(self) -> AutopilotMetrics:
        """A snapshot of the counters and estimates (what :mod:`smdp_batch.runtime.autopilot_metrics` exports)."""
        with self._lock:
            live, c, ring, batches = self._live, dict(self._c), self._resp.copy(), tuple(self._batches)
            solve_s, event = self._last_solve_s, self._event
        resp = ring[np.isfinite(ring)]
        p50, p99 = (float(x) for x in np.percentile(resp, [50, 99])) if resp.size else (math.nan, math.nan)
        return AutopilotMetrics(
            c["swaps"], c["rollbacks"], c["failed_solves"], c["infeasible"], c["out_of_range"], c["solves"],
            c["late_results"], solve_s, live.id, live.lam, live.mean_ms, live.p99_ms, live.power_w,
            live.timer_ms, self.rate.rate, self.rate.band(), tuple(float(x) for x in self.service.latency_ms()),
            p99, self.rate.rejected + self.service.rejected + self.energy.rejected, event, p50, self.sizes,
            batches, tuple(float(x) for x in self.energy.energy_mj()))

    def __repr__(self) -> str:
        return f"<Autopilot table {self._live.id} at λ = {self._live.lam:.4g}/ms, p99 SLO {self.slo_ms:g} ms>"

