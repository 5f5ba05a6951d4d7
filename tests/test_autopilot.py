"""The Autopilot (smdp_batch.autopilot.pilot): re-solves on a rate step and on a slowdown, swaps only plans that
meet the SLO, rolls back on observed p99, and keeps serving through solver faults, NaN readings and clock jumps.
Driven by synthetic clocks and streams; the solver is the real SLO optimiser where it matters, a fake elsewhere."""

from __future__ import annotations

from dataclasses import replace

import asyncio
import functools
import json
import logging
import math
import threading
import time

import numpy as np
import pytest

from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime import DynamicBatcher, PolicyTable
from smdp_batch.autopilot import Autopilot, Plan, RateChange, slo_plan

SLO = 40.0


class Clock:
    """A synthetic solve clock (s)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def control(q: int, bmax: int = 32) -> np.ndarray:
    s = np.arange(bmax + 1)
    return np.where(s >= q, np.minimum(s, bmax), 0)


class FakeSolver:
    """Records each problem; answers a control-limit table with made-up planned metrics (or misbehaves)."""

    def __init__(self, mode: str = "ok"):
        self.mode, self.calls, self.release = mode, [], threading.Event()

    def __call__(self, problem, slo_ms, lams):
        self.calls.append((problem, slo_ms, list(lams)))
        if self.mode == "raise":
            raise RuntimeError("solver bug")
        if self.mode == "hang":
            self.release.wait(30)
        if self.mode == "none":
            return None
        q = 2 + len(self.calls) % 2  # alternate two tables
        p99 = math.nan if self.mode == "nan" else 0.5 * slo_ms
        return Plan(PolicyTable(control(q), problem.batch_sizes, {"inputs": {"lam": lams[0]}}), lams[0], None,
                    5.0, p99, 20.0, True, f"control:{q}")


class FreshSolver(FakeSolver):
    """A new table every call: none of them is one rolled back before (blocked at its load)."""

    def __call__(self, problem, slo_ms, lams):
        plan = super().__call__(problem, slo_ms, lams)
        q = 1 + len(self.calls)
        return replace(plan, table=PolicyTable(control(q), problem.batch_sizes, plan.table.meta), spec=f"control:{q}")


def make(solver=None, clock=None, **kw) -> tuple[Autopilot, BatchingProblem]:
    p = BatchingProblem.basic(rho=0.3)
    start = Plan(PolicyTable(control(8), p.batch_sizes, {"inputs": {"lam": p.lam}}), p.lam, None, 8.0, 30.0, 15.0)
    opts = {"min_interval_s": 0.0, "rate_tol": 10.0, **kw}  # no band re-solve unless a test asks for one
    return Autopilot(p, SLO, start, solver=solver or FakeSolver(), clock=clock or Clock(), **opts), p


def feed(ap: Autopilot, lam: float, n: int, rng, t0: float = 0.0) -> float:
    t = t0
    for x in rng.exponential(1.0 / lam, n):
        t += x
        ap.observe_arrival(t)
    return t


# ------------------------------------------------------------------ the real optimiser
def test_a_3x_rate_step_re_solves_and_swaps_to_a_table_solved_near_the_new_rate():
    p = BatchingProblem.basic(rho=0.3)
    solver = functools.partial(slo_plan, requests=5000)
    ap = Autopilot(p, SLO, solver=solver, clock=Clock(), min_interval_s=0.0, rate_tol=10.0)
    first = ap.plan
    assert first.meets and first.p99_ms <= SLO and ap.decide(0) == 0
    rng = np.random.default_rng(1)
    t = feed(ap, p.lam, 1500, rng)
    assert ap.metrics.solves == 0  # a stationary stream: no re-solve
    feed(ap, 3 * p.lam, 600, rng, t)
    assert ap.join(30)
    m = ap.metrics
    assert m.swaps == 1 and m.failed_solves == 0 and m.live_table != first.id
    assert ap.plan.lam == pytest.approx(3 * p.lam, rel=0.2)
    assert m.planned_p99_ms <= SLO and math.isfinite(m.planned_power_w) and m.planned_lam == ap.plan.lam
    assert ap.plan.table.lam == ap.plan.lam
    new_table = not np.array_equal(ap.table.policy, first.table.policy)
    assert new_table or ap.plan.timer_ms != first.timer_ms  # a table (or a timer) for the new load
    assert ap.plan.power_w > first.power_w  # three times the requests draw more power


def test_a_1_5x_slowdown_re_solves_with_the_measured_curve():
    solver = FakeSolver()
    ap, p = make(solver)
    rng = np.random.default_rng(2)
    t = feed(ap, p.lam, 300, rng)
    l = p.latency_ms()
    for _ in range(8):
        b = int(rng.integers(1, 33))
        ap.observe_batch(b, 1.5 * l[b - 1] * 1e-3 * rng.gamma(100, 0.01), True)
    ap.join(10)
    assert len(solver.calls) == 1
    solved, slo_ms, lams = solver.calls[0]
    assert slo_ms == SLO and lams[0] == pytest.approx(p.lam, rel=0.25)
    ratio = solved.latency_ms() / l
    assert np.median(ratio) == pytest.approx(1.5, rel=0.1)  # observed sizes measured, the others scaled
    assert ap.metrics.swaps == 1 and ap.metrics.last_event == "swap"
    assert not ap.service.drift()  # rebased on the curve the solve used
    feed(ap, p.lam, 50, rng, t)
    assert len(solver.calls) == 1


def test_a_rate_step_found_during_a_solve_is_solved_for_when_it_ends_without_another_request():
    """A service re-solve (a 1.5× slowdown) runs while the rate steps up 1.6×; the traffic then pauses.  The step is
    solved for as soon as the first solve ends, not at the next request (a CI run: the only swap went to the old rate, 7 s of solve
    having outlasted the step, and no request came after it to start the next)."""
    solver = FakeSolver("hang")
    ap, p = make(solver, solve_in="thread")
    rng = np.random.default_rng(2)
    t = feed(ap, p.lam, 300, rng)
    l = p.latency_ms()
    for _ in range(8):  # a slowdown: the service re-solve starts and hangs
        b = int(rng.integers(1, 33))
        ap.observe_batch(b, 1.5 * l[b - 1] * 1e-3 * rng.gamma(100, 0.01), True)
    assert len(solver.calls) == 1
    feed(ap, 1.6 * p.lam, 600, rng, t)  # the step, while that solve runs; then no more requests
    assert len(solver.calls) == 1
    solver.release.set()
    for _ in range(50):
        if ap.join(10) and len(solver.calls) == 2:
            break
    assert len(solver.calls) == 2 and solver.calls[1][2][0] == pytest.approx(1.6 * p.lam, rel=0.15)
    assert ap.metrics.swaps == 2 and ap.plan.lam == pytest.approx(1.6 * p.lam, rel=0.15)


# ------------------------------------------------------------------ guards
def _step(ap, p, seed=3):
    rng = np.random.default_rng(seed)
    t = feed(ap, p.lam, 1000, rng)
    return feed(ap, 3 * p.lam, 600, rng, t), rng


def test_a_raising_solver_keeps_the_table_and_counts(caplog):
    ap, p = make(FakeSolver("raise"))
    live = ap.plan
    with caplog.at_level(logging.INFO, logger="smdp_batch"):
        _step(ap, p)
        ap.join(10)
    m = ap.metrics
    assert m.failed_solves >= 1 and m.swaps == 0 and ap.plan is live and ap.decide(8) == 8
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autopilot ")]
    event = json.loads(lines[0].split(" ", 1)[1])
    assert event["event"] == "solve-error" and "solver bug" in event["error"] and event["live_table"] == live.id


def test_a_failed_solve_is_retried_after_a_backoff():
    clock = Clock()
    solver = FakeSolver("raise")
    ap, p = make(solver, clock, min_interval_s=1.0)
    t, rng = _step(ap, p)
    ap.join(10)
    assert len(solver.calls) == 1
    feed(ap, 3 * p.lam, 10, rng, t)
    assert len(solver.calls) == 1  # backoff: 2 s
    clock.t = 2.5
    solver.mode = "ok"
    feed(ap, 3 * p.lam, 10, rng, t + 100)
    ap.join(10)
    assert len(solver.calls) == 2 and ap.metrics.swaps == 1


def test_a_hung_solver_is_abandoned_past_its_budget_and_its_late_result_dropped():
    clock = Clock()
    solver = FakeSolver("hang")
    ap, p = make(solver, clock, budget_s=5.0, min_interval_s=1.0)
    live = ap.plan
    t, rng = _step(ap, p)
    assert ap.metrics.solves == 1 and ap._job is not None
    clock.t = 6.0  # past the budget, on the solve clock
    t = feed(ap, 3 * p.lam, 5, rng, t)
    m = ap.metrics
    assert m.failed_solves == 1 and m.last_event == "solve-timeout" and ap.plan is live
    assert ap.decide(10) == 10  # serving goes on
    thread = ap._abandoned[0]
    solver.release.set()
    thread.join(10)
    assert ap.metrics.late_results == 1 and ap.plan is live and ap.metrics.swaps == 0


def test_hung_solves_never_take_more_than_max_threads():
    clock = Clock()
    solver = FakeSolver("hang")
    ap, p = make(solver, clock, budget_s=1.0, max_threads=2, min_interval_s=0.0)
    t, rng = _step(ap, p)
    for _ in range(6):
        clock.t += 100.0  # every retry's backoff over, and its budget too
        t = feed(ap, 3 * p.lam, 3, rng, t)
    for _ in range(500):  # the second solve's thread may not have run yet on a loaded machine
        if len(solver.calls) >= 2:
            break
        time.sleep(0.01)
    time.sleep(0.05)  # room for a third, which must not come
    assert len(solver.calls) == 2 and ap.metrics.failed_solves == 2
    solver.release.set()


@pytest.mark.parametrize("mode, counter", [("nan", "failed_solves"), ("none", "infeasible")])
def test_a_nan_or_infeasible_answer_is_not_swapped(mode, counter):
    ap, p = make(FakeSolver(mode))
    live = ap.plan
    _step(ap, p)
    ap.join(10)
    assert getattr(ap.metrics, counter) == 1 and ap.metrics.swaps == 0 and ap.plan is live


def test_nan_timings_and_bad_readings_are_ignored_and_counted():
    solver = FakeSolver()
    ap, p = make(solver)
    for bad in (math.nan, math.inf, -1.0, 0.0, "x", None):
        ap.observe_batch(4, bad, True)
    ap.observe_batch(999, 0.01, True)  # not an allowed size
    ap.observe_batch(4, 50.0, False)  # a failed batch teaches nothing
    ap.observe_energy(4, math.nan)
    ap.observe_response([math.nan, -3.0, "x"])
    ap.observe_response("not a number")
    ap.observe_arrival(math.nan)
    m = ap.metrics
    assert m.rejected_inputs == 9 and m.solves == 0 and math.isnan(m.observed_p99_ms)
    assert ap.service.count == 0


def test_clock_jumps_neither_stop_serving_nor_block_solves():
    clock = Clock()
    solver = FakeSolver()
    ap, p = make(solver, clock, min_interval_s=1.0)
    clock.t = -1e6  # the solve clock steps back: no time passes
    t, rng = _step(ap, p)
    ap.join(10)
    assert ap.metrics.swaps == 1
    ap.observe_arrival(t + 3.6e6)  # the arrival clock jumps an hour forward
    assert ap.rate.clipped >= 1
    clock.t = 1e9  # and the solve clock forward
    feed(ap, 3 * p.lam, 500, rng, t + 3.6e6)
    ap.join(10)
    m = ap.metrics
    assert m.failed_solves == 0 and ap.decide(5) in (0, 5)


def test_an_estimate_beyond_the_stable_rate_keeps_the_table():
    ap, p = make(FakeSolver())
    live = ap.plan
    rng = np.random.default_rng(4)
    t = feed(ap, p.lam, 1000, rng)
    feed(ap, 1.2 * p.max_lam, 600, rng, t)
    ap.join(10)
    assert ap.metrics.out_of_range == 1 and ap.plan is live and ap.metrics.swaps == 0


# ------------------------------------------------------------------ rollback
def test_a_swap_that_breaks_the_slo_in_service_is_rolled_back():
    ap, p = make(FakeSolver(), window=200, grace=50)
    before = ap.plan
    _step(ap, p)
    ap.join(10)
    assert ap.metrics.swaps == 1 and ap.plan is not before
    ap.observe_response([10.0] * 50)  # the grace: requests that waited under the old table
    ap.observe_response([10.0] * 190 + [80.0] * 10)  # p99 of this window: 80 ms > 1.1 × SLO
    m = ap.metrics
    assert m.rollbacks == 1 and ap.plan is before and m.live_table == before.id and m.last_event == "rollback"


@pytest.mark.parametrize("old_here, rolled_back", [(math.nan, True), (70.0, False), (30.0, True)])
def test_the_rollback_judges_the_replaced_plan_at_the_new_load(old_here, rolled_back):
    """Counterfactual: the old plan's last window read 20 ms (at the old load), the new plan's reads 50 ms, over
    the 44 ms limit.  Simulated at the new load the old plan would read ``old_here`` (plus the excess it showed
    over its planned 30 ms: none): at 70 ms the new plan is the better one and stays; at 30 ms, or unknown (then
    the old window's 20 ms is all there is), it goes."""
    def solver(problem, slo_ms, lams):
        plan = FakeSolver()(problem, slo_ms, lams)
        return replace(plan, incumbent_p99_ms=old_here)

    ap, p = make(solver, window=200, grace=50)
    before = ap.plan
    ap.observe_response(np.full(250, 20.0))  # the grace, then the old plan's window at the old load
    _step(ap, p)
    assert ap.join(10) and ap.metrics.swaps == 1
    ap.observe_response(np.full(50, 10.0))  # the grace
    ap.observe_response(np.full(200, 50.0))
    assert (ap.metrics.rollbacks == 1 and ap.plan is before) == rolled_back


@pytest.mark.parametrize("share, rolled_back", [(0.1, True), (0.01, False)])
def test_the_sequential_test_judges_a_swap_after_100_responses_not_a_window_of_500(share, rolled_back):
    ap, p = make(FakeSolver(), window=500, grace=50)
    before = ap.plan
    _step(ap, p)
    assert ap.join(10) and ap.metrics.swaps == 1
    ap.observe_response(np.full(50, 10.0))  # the grace
    k = round(share * 100)
    for _ in range(4):  # 400 responses, fewer than a window
        ap.observe_response(np.r_[np.full(100 - k, 10.0), np.full(k, 80.0)])
        if ap.metrics.rollbacks:
            break
    assert (ap.metrics.rollbacks == 1 and ap.plan is before) == rolled_back
    assert ap._windows == 0  # no full window was needed


def test_a_plan_rolled_back_is_not_swapped_in_again_at_that_load():
    """The solver insists on the plan that broke the SLO live: it stays rolled back (``blocked``, counted with the
    kept plans) while solves plan it within 25 % of the load it failed at, and may return at another load."""
    def insists(problem, slo_ms, lams):
        return Plan(PolicyTable(control(3), problem.batch_sizes, {"inputs": {"lam": lams[0]}}), lams[0], None, 5.0,
                    0.5 * slo_ms, 20.0, True, "control:3")

    ap, p = make(insists, window=200, grace=50)
    before = ap.plan
    t, rng = _step(ap, p)
    assert ap.join(10) and ap.metrics.swaps == 1
    failed = ap.plan
    ap.observe_response([10.0] * 50)
    ap.observe_response([10.0] * 190 + [80.0] * 10)  # breaks the SLO: rolled back
    assert ap.metrics.rollbacks == 1 and ap.plan is before
    ap._trigger("service")  # a re-solve at the same load: the same plan again
    t = feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10)
    m = ap.metrics
    assert m.solves == 2 and m.swaps == 1 and m.kept == 1 and m.last_event == "blocked" and ap.plan is before
    assert m.solves == m.swaps + m.kept + m.failed_solves + m.infeasible
    assert replace(failed, lam=2.0 * failed.lam) not in ap._blocked  # at another load it may be tried again


def test_a_shorter_timer_rolled_back_bars_every_plan_as_short_at_that_load_and_raises_no_margin():
    """A plan that timed shorter than the plan put back and did worse: its smaller batches raised what no plan models
    (on real Ray Serve with a CPU-bound model: an outside delay learned at a 3× step planned 2.9 ms, then 7.5 ms, where
    27 ms ran).  A margin would tighten the next plans further (it did: down to timeout 0, client p99 100 ms), so none
    is kept, and every plan on the same sizes as short or shorter is barred at that load, a best effort too; a longer
    timer may go live, and at another load the shorter one may be tried."""
    p = BatchingProblem.basic(rho=0.3)

    def plan(timer: float, meets: bool = True) -> Plan:
        return Plan(PolicyTable(control(8), p.batch_sizes, {"inputs": {"lam": 3 * p.lam}}), 3 * p.lam, timer, 5.0,
                    0.5 * SLO, 20.0, meets, f"timer {timer}")

    answers = iter([plan(5.0), plan(3.0), plan(5.0), plan(2.0, meets=False), plan(10.0)])
    clock = Clock()
    ap = Autopilot(p, SLO, replace(plan(20.0), lam=p.lam), solver=lambda problem, slo_ms, lams: next(answers),
                   clock=clock, min_interval_s=0.0, rate_tol=10.0, window=200, grace=50)
    start = ap.plan  # the 20 ms plan, as the Autopilot holds it
    t, rng = _step(ap, p)
    assert ap.join(10) and ap.metrics.swaps == 1 and ap.plan.timer_ms == 5.0
    ap.observe_response([10.0] * 50)
    ap.observe_response([10.0] * 190 + [80.0] * 10)  # worse than the 20 ms plan: rolled back
    m = ap.metrics
    assert m.rollbacks == 1 and ap.plan is start and m.target_p99_ms == SLO and ap._margin.ms == 0.0
    for timer, event in ((3.0, "blocked"), (5.0, "blocked"), (2.0, "infeasible")):
        clock.t += 100.0  # past any back-off
        ap._trigger("service")
        t = feed(ap, 3 * p.lam, 5, rng, t)
        assert ap.join(10) and ap.metrics.last_event == event and ap.plan is start, timer
    assert ap.metrics.swaps == 1 and ap.metrics.kept == 2 and ap.metrics.infeasible == 1
    clock.t += 100.0
    ap._trigger("service")
    feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and ap.metrics.swaps == 2 and ap.plan.timer_ms == 10.0  # longer than the one that failed
    assert replace(plan(3.0), lam=2 * plan(3.0).lam) not in ap._blocked and plan(3.0) in ap._blocked


def test_after_a_rollback_the_next_plans_keep_a_margin_halved_by_each_swap_that_holds():
    """The plan planned p99 = SLO/2 and measured 80 ms: the next solves plan for SLO − the overshoot (capped at a
    quarter of the SLO); a swap that then holds through its watch halves that margin and re-plans with it, until
    the target moves by less than max(2 ms, 5 % of the SLO): one rollback must not cost energy for ever (on Ray
    Serve a margin kept the plan at 37.5 of 50 ms through 40 s of steady traffic)."""
    solver = FreshSolver()
    ap, p = make(solver, window=200, grace=50, watch=2)
    t, rng = _step(ap, p)
    assert ap.join(10) and ap.metrics.swaps == 1
    ap.observe_response([10.0] * 50)
    ap.observe_response([10.0] * 190 + [80.0] * 10)
    assert ap.metrics.rollbacks == 1
    assert ap.metrics.target_p99_ms == pytest.approx(SLO - 0.25 * SLO)  # overshoot 80 − SLO/2, capped at SLO/4
    ap._trigger("service")
    t = feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and solver.calls[-1][1] == pytest.approx(0.75 * SLO) and ap.metrics.swaps == 2
    ap.observe_response(np.full(50 + 2 * 200, 10.0))  # the grace, then two clean windows: it holds
    assert not ap._watching and ap.metrics.target_p99_ms == pytest.approx(SLO - 0.125 * SLO)
    assert ap._dirty == "margin"  # the live plan was made for 0.75·SLO: a re-plan for 0.875·SLO is due
    t = feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and solver.calls[-1][1] == pytest.approx(0.875 * SLO) and ap.metrics.swaps == 3
    ap.observe_response(np.full(50 + 2 * 200, 10.0))  # holds: margin SLO/16 = 2.5 ms, target 37.5 against 35
    assert ap._dirty == "margin" and ap.metrics.target_p99_ms == pytest.approx(SLO - SLO / 16)
    t = feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and ap.metrics.swaps == 4
    ap.observe_response(np.full(50 + 2 * 200, 10.0))  # holds: 1.25 ms of margin left, a move of 1.25 ms: no re-plan
    assert ap._dirty is None and ap.metrics.target_p99_ms == pytest.approx(SLO - SLO / 32)
    feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and ap.metrics.swaps == 4 and ap.metrics.solves == 4


def _rolled_back():
    """An Autopilot on a synthetic clock whose swap after a 3× step broke the SLO and was rolled back (margin SLO/4):
    (autopilot, problem, clock, solver, last arrival, generator)."""
    clock, solver = Clock(), FreshSolver()
    ap, p = make(solver, clock=clock, window=200, grace=50, watch=2)
    t, rng = _step(ap, p)
    assert ap.join(10) and ap.metrics.swaps == 1
    ap.observe_response([10.0] * 50)
    ap.observe_response([10.0] * 190 + [80.0] * 10)
    assert ap.metrics.rollbacks == 1 and ap.metrics.target_p99_ms == pytest.approx(0.75 * SLO)
    return ap, p, clock, solver, t, rng


def test_the_margin_after_a_rollback_also_halves_with_time_and_re_plans_a_plan_it_made_too_tight():
    """A rollback's margin also halves every 15 s of the clock (at low loads a watch takes minutes, and one overshoot
    says little about the traffic after it: on Ray Serve one hiccup at a step's onset kept the plans 6-12 ms tighter
    for a minute).  A plan made with the margin re-plans once the decay moves the target by over max(2 ms, 5 % of the
    SLO) above it; the plan put back, made for the SLO itself, asks for nothing."""
    from smdp_batch.autopilot.control import Margin

    m = Margin()
    m.raise_to(20.0, 100.0, cap_ms=12.5)
    assert m.ms == 12.5 and m.at(115.0) == pytest.approx(6.25) and m.at(130.0) == pytest.approx(3.125)
    m.raise_to(1.0, 130.0, cap_ms=12.5)  # a smaller overshoot keeps the larger margin
    assert m.ms == pytest.approx(3.125) and m.at(130.0 + 15 * 5) == 0.0  # under 0.1 ms: gone

    ap, p, clock, solver, t, rng = _rolled_back()
    clock.t += 60.0
    calls = len(solver.calls)
    ap.poll()  # the plan put back was made for the SLO: nothing to re-plan, however the margin decays
    assert ap.join(10) and len(solver.calls) == calls and ap._margin.ms == pytest.approx(0.25 * SLO / 16)
    ap.observe_response([10.0] * 190 + [80.0] * 10)  # (not watching: no rollback) a new plan, made with a margin
    ap._margin.raise_to(0.25 * SLO, clock.t, 0.25 * SLO)
    ap._trigger("service")
    t = feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and ap.metrics.swaps == 2 and ap.plan.target_ms == pytest.approx(0.75 * SLO)
    calls = len(solver.calls)
    clock.t += 4.0  # 0.25·SLO·(1 − 2^(−4/15)) = 1.69 ms < max(2 ms, 5 % of the SLO): no re-plan yet
    ap.poll()
    assert ap.join(10) and len(solver.calls) == calls
    clock.t += 11.0  # half: the target moved SLO/8 above the plan's: one re-plan, for it
    ap.poll()
    ap.poll()
    assert ap.join(10) and len(solver.calls) == calls + 1 and solver.calls[-1][1] == pytest.approx(0.875 * SLO)
    assert ap.metrics.swaps == 3 and ap.plan.target_ms == pytest.approx(0.875 * SLO)


def test_the_margin_decays_while_solves_are_due_too():
    """The margin's decay is read whatever is due: while solves kept being asked for (infeasible at the tighter
    target, retried), the target stayed at the margin of the rollback for a minute on Ray Serve (37.5 of 50 ms from
    a 12.5 ms margin, never decayed, every retry infeasible)."""
    ap, p, clock, solver, t, rng = _rolled_back()
    assert ap.join(10) and ap._dirty is None
    calls = len(solver.calls)
    clock.t += 15.0  # one half-life
    ap._trigger("service")  # a solve is due: the one it starts has half the margin, and it is the only one
    feed(ap, 3 * p.lam, 5, rng, t)
    assert ap.join(10) and [c[1] for c in solver.calls[calls:]] == [pytest.approx(0.875 * SLO)]
    assert ap.metrics.target_p99_ms == pytest.approx(0.875 * SLO)


def test_a_rollback_to_a_plan_made_for_another_load_re_solves_at_once_with_the_margin():
    """The plan put back was made for the load before a 3× step.  Once the load ends (or a replica stops being
    polled) no arrival would ask for a solve again, and the server would keep a plan for a third of its traffic: the
    rollback itself asks for one at λ̂, with the margin of the overshoot (seen on Ray Serve in CI: a swap at 90/s
    rolled back to the 30/s plan on a starved host, near the end of the load)."""
    solver = FakeSolver()
    ap, p = make(solver, window=200, grace=50)  # the step: one solve, at its change point (no band re-solve while the
    _step(ap, p)  # thread solves: how many would start then depends on its timing)
    assert ap.join(10) and ap.metrics.swaps == 1
    ap.rate_tol = 0.25  # then the default: the plan put back is 3× off λ̂
    failed, calls = ap.plan, len(solver.calls)
    ap.observe_response([10.0] * 50)
    ap.observe_response([10.0] * 190 + [80.0] * 10)  # breaks the SLO: rolled back to the plan for λ
    assert ap.metrics.rollbacks == 1 and ap.plan.lam == p.lam
    ap.poll()  # the next hook, with no arrival
    assert ap.join(10) and len(solver.calls) == calls + 1
    _, target, lams = solver.calls[-1]
    assert target == pytest.approx(0.75 * SLO) and lams[0] == pytest.approx(failed.lam, rel=0.05)  # λ̂ again, with the margin
    assert ap.metrics.swaps == 2 and ap.plan.lam == pytest.approx(failed.lam, rel=0.05) and ap.plan.spec != failed.spec


def test_a_rollback_at_the_load_the_plan_put_back_was_made_for_asks_for_no_solve():
    ap, p = make(FakeSolver(), window=200, grace=50, rate_tol=0.25)
    ap.observe_response(np.full(250, 20.0))  # the grace, then the start plan's window
    rng = np.random.default_rng(5)
    feed(ap, p.lam, 300, rng)
    ap._trigger("service")  # a service drift at the same load: a swap
    ap.poll()
    assert ap.join(10) and ap.metrics.swaps == 1 and ap.plan.lam == pytest.approx(ap.rate.rate)
    ap.observe_response([10.0] * 50)
    ap.observe_response([10.0] * 190 + [80.0] * 10)
    assert ap.metrics.rollbacks == 1 and ap._dirty is None


def test_a_swap_that_holds_the_slo_becomes_the_last_good_table():
    ap, p = make(FakeSolver(), window=200, grace=50, watch=2)
    _step(ap, p)
    ap.join(10)
    new = ap.plan
    ap.observe_response(np.full(450, 12.0))
    assert ap._previous is None and ap._good is new and not ap._watching
    ap.observe_response(np.full(300, 90.0))  # later breaches are not the swap's: no rollback
    assert ap.metrics.rollbacks == 0 and ap.plan is new and ap.metrics.observed_p99_ms == pytest.approx(90.0)


# ------------------------------------------------------------------ in a real batcher
class HeldRate(RateChange):
    """λ̂ held where the test put it: a burst of 10⁵ in about a second is beyond this model's stable rate."""

    def observe(self, t_ms):
        return False


class Recording(Autopilot):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.decisions: list[tuple[int, int, int]] = []

    def decide(self, n):
        plan = self._live  # what decide reads: one reference
        b = plan.table.decide(n)
        self.decisions.append((plan.id, n, b))
        return b


def test_a_burst_through_a_real_batcher_during_swaps_loses_and_splits_nothing():
    """10⁵ requests; a thread reports slow batches so the Autopilot re-solves and swaps while the batcher serves."""
    p = BatchingProblem.basic(rho=0.3)
    sizes = p.batch_sizes
    greedy = lambda cap: np.minimum(np.arange(cap + 1), cap)  # noqa: E731
    tables = iter([greedy(32), greedy(16)] * 1000)

    def solver(problem, slo_ms, lams):
        return Plan(PolicyTable(next(tables), sizes, {"inputs": {"lam": lams[0]}}), lams[0], None, 5.0, 10.0, 20.0)

    start = Plan(PolicyTable(greedy(8), sizes, {"inputs": {"lam": p.lam}}), p.lam, None, 5.0, 10.0, 20.0)
    ap = Recording(p, SLO, start, solver=solver, min_interval_s=0.0, min_samples=2, rate=HeldRate())
    for _ in range(300):
        ap.rate.observe_gap(1.0 / p.lam)
    served: list[int] = []

    async def infer(items):
        served.append(len(items))
        await asyncio.sleep(0)
        return items

    stop = threading.Event()
    l8 = float(p.latency_ms()[7]) * 1e-3

    def slowdowns():
        k = 0
        while not stop.is_set():
            k += 1
            ap.observe_batch(8, l8 * (1 + (k // 20) % 2), True)  # batch times flip 1× ↔ 2×, from another thread
            stop.wait(0.002)

    async def main():
        batcher = DynamicBatcher(infer, ap, max_wait_ms=None)
        th = threading.Thread(target=slowdowns)
        th.start()
        try:
            out = []
            for chunk in range(10):
                out += await asyncio.gather(*(batcher.submit(i) for i in range(chunk * 10_000, (chunk + 1) * 10_000)))
        finally:
            stop.set()
            th.join()
        await batcher.close()
        return out, batcher.metrics

    out, m = asyncio.run(main())
    assert out == list(range(100_000)) and m.completed == 100_000 and m.failed == 0
    assert ap.metrics.swaps >= 2, ap.metrics
    served_by_decide = [b for _, _, b in ap.decisions if b > 0]
    assert served == served_by_decide  # every batch is exactly one decision's batch: nothing split by a swap
    ids = {i for i, _, _ in ap.decisions}
    assert len(ids) >= 3  # the decisions came from several tables


def test_the_batcher_reports_each_batch_and_its_response_times():
    seen: list[tuple] = []

    class Probe:
        batch_sizes = (1, 2, 4)

        def decide(self, n):
            return min(n, 4)

        def observe_batch(self, b, seconds, ok):
            seen.append(("batch", b, seconds, ok))

        def observe_response(self, ms):
            seen.append(("resp", len(ms), min(ms)))

    async def infer(items):
        if "boom" in items:
            raise ValueError("boom")
        return items

    async def main():
        bt = DynamicBatcher(infer, Probe(), max_wait_ms=None)
        assert await bt.submit(1) == 1
        with pytest.raises(ValueError):
            await bt.submit("boom")
        await bt.close()

    asyncio.run(main())
    assert [s[0] for s in seen] == ["batch", "resp", "batch"]
    assert seen[0][1] == 1 and seen[0][2] >= 0 and seen[0][3] is True and seen[2][3] is False


def test_the_live_timer_is_the_batchers_auto_bound():
    p = BatchingProblem.basic(rho=0.3)
    table = PolicyTable(control(8), p.batch_sizes, {"inputs": {"lam": p.lam}, "max_wait_ms": 7.5})
    ap = Autopilot(p, SLO, Plan(table, p.lam, 7.5, 5.0, 10.0, 20.0), solver=FakeSolver())
    bt = DynamicBatcher(lambda items: items, ap)
    assert ap.max_wait_ms == 7.5 and bt.max_wait_ms == pytest.approx(7.5)
    ap._live = Plan(PolicyTable(control(4), p.batch_sizes, {"inputs": {"lam": p.lam}, "max_wait_ms": 3.0}), p.lam, 3.0)
    assert bt.max_wait_ms == pytest.approx(3.0)  # follows the live plan


def test_bad_settings_are_refused():
    p = BatchingProblem.basic(rho=0.3)
    with pytest.raises(ValueError):
        Autopilot(p, math.nan, PolicyTable(control(2), p.batch_sizes))
    with pytest.raises(ValueError):
        Autopilot(p, SLO, PolicyTable(control(2), p.batch_sizes), window=10)
    with pytest.raises(TypeError):
        Autopilot(p, SLO, "table.h5")
    with pytest.raises(ValueError):
        Autopilot(p, SLO, solver=FakeSolver("none"))  # no initial table meets the SLO


def test_when_no_table_meets_the_target_the_best_effort_goes_live_and_the_search_is_retried():
    """A solver that finds nothing meeting the target but offers a best effort (meets=False): it goes live
    (``best_effort``), the solve counts as infeasible (solves = swaps + kept + failed + infeasible still), and
    a retry is scheduled; the same best effort again is not swapped twice."""

    class BestEffort(FakeSolver):
        def __call__(self, problem, slo_ms, lams):
            self.calls.append((problem, slo_ms, list(lams)))
            return Plan(PolicyTable(control(1), problem.batch_sizes, {"inputs": {"lam": lams[0]}}), lams[0], None,
                        9.0, 3.0 * slo_ms, 40.0, False, "greedy (best effort)")

    solver, clock = BestEffort(), Clock()
    ap, p = make(solver, clock)
    rng = np.random.default_rng(3)
    t = feed(ap, p.lam, 400, rng)
    t = feed(ap, 3 * p.lam, 400, rng, t)
    assert ap.join(10)
    m = ap.metrics
    assert m.best_effort == 1 and m.infeasible >= 1 and m.swaps == 0
    assert m.solves == m.swaps + m.kept + m.failed_solves + m.infeasible
    assert ap.plan.spec == "greedy (best effort)" and ap.plan.meets is False and ap.plan.lam > 2 * p.lam
    clock.t += 10.0  # past the back-off: retried, and the same best effort is not put live again
    t = feed(ap, 3 * p.lam, 200, rng, t)
    assert ap.join(10) and ap.metrics.best_effort == 1 and len(solver.calls) >= 2


def test_the_default_solver_offers_the_greedy_table_as_best_effort_only_when_it_beats_the_live_plan():
    from smdp_batch.baselines import parse_policy

    p = BatchingProblem.basic(rho=0.5)
    l1 = float(p.latency_ms()[0])
    for target in (1.1 * l1, 0.5 * l1):  # unreachable at this load; below what any rule reaches (l(1) alone)
        got = slo_plan(p, target, [p.lam], requests=5000)
        assert got is not None and got.meets is False and got.spec == "greedy (best effort)"
        assert np.array_equal(got.table.policy, parse_policy("greedy", p.batch_sizes, p.bmax))
        assert got.p99_ms > target and got.lam == p.lam
        assert slo_plan(p, target, [p.lam], requests=5000, incumbent=got) is None  # already the best effort


def test_batches_that_ran_beside_a_solve_are_left_out_of_the_service_estimate():
    """A solve takes CPU from the server: the batches that ran while it did (or ended less than their own time
    after it) are checked but not learned from; once it is over, batches teach l̂(b) again."""
    clock = Clock()
    solver = FakeSolver("hang")
    ap, p = make(solver, clock, budget_s=100.0)
    t, rng = _step(ap, p)
    assert ap._job is not None  # a solve is running
    before = ap.service.count
    for _ in range(20):
        ap.observe_batch(8, 0.040)  # 40 ms: a stretched batch beside the solve
    assert ap.service.count == before and ap.overlapped == 20
    ap.observe_batch(33, 0.01)  # still checked: a size the server cannot run is rejected
    assert ap.metrics.rejected_inputs == 1
    solver.release.set()
    ap.join(10)
    assert ap._job is None
    clock.t += 0.01  # 10 ms after the solve ended: a 40 ms batch overlapped it, a 5 ms one did not
    ap.observe_batch(8, 0.040)
    assert ap.service.count == before and ap.overlapped == 21
    ap.observe_batch(8, 0.005)
    assert ap.service.count == before + 1 and ap.overlapped == 21
