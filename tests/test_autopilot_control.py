"""The Autopilot's closed loop (smdp_batch.autopilot.control): the integral law on the share of responses over the
limit, its dead band, its bounds and the retimed table the batcher reads; and, on the simulated clock, a slowdown
the plans cannot answer held by the timer alone, in our batcher and in Ray's own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smdp_batch.autopilot import Autopilot, Plan
from smdp_batch.autopilot.control import BreachTest, TimerControl
from smdp_batch.autopilot.simulated import Phase, SimClock, simulate
from smdp_batch.model.laws import Deterministic
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime import PolicyTable

SLO = 40.0


def control(q: int, bmax: int = 32) -> np.ndarray:
    s = np.arange(bmax + 1)
    return np.where(s >= q, np.minimum(s, bmax), 0)


def plan(p, timer=25.0, q=16) -> Plan:
    t = PolicyTable(control(q), p.batch_sizes, {"inputs": {"lam": p.lam}, "max_wait_ms": timer})
    return Plan(t, p.lam, timer, 10.0, 30.0, 20.0, True, f"control:{q}")


def test_the_integral_law_tightens_at_once_holds_within_the_noise_and_relaxes_back_to_the_plan():
    c = TimerControl()
    assert c.add(np.full(99, 1.0), 10.0) is False and c.windows == 0  # not a full window yet
    assert c.add(np.array([50.0]), 10.0) is False and c.windows == 1 and c.u == 0.0  # 1 of 100: the target share
    assert c.add(np.r_[np.full(90, 1.0), np.full(10, 50.0)], 10.0)  # 10 % over: the largest step
    assert c.u == pytest.approx(-0.45) and c.scale == pytest.approx(math.exp(-0.45))
    assert not c.add(np.r_[np.full(98, 1.0), np.full(2, 50.0)], 10.0)  # 2 of 100: within the noise of 1 %
    assert c.u == pytest.approx(-0.45)
    assert c.add(np.r_[np.full(97, 1.0), np.full(3, 50.0)], 10.0) and c.u == pytest.approx(-0.55)  # 3: by 10 %
    assert c.add(np.full(100, 1.0), 10.0) and c.u == pytest.approx(-0.5375)  # a clean window relaxes by 1.25 %
    for _ in range(60):
        c.add(np.full(100, 1.0), 10.0)
    assert c.u == 0.0  # never looser than the plan (hi = 1)
    for _ in range(200):
        c.add(np.full(100, 50.0), 10.0)
    assert c.scale == pytest.approx(0.05)  # at most 20× tighter


def _window(k: int) -> np.ndarray:
    return np.r_[np.full(100 - k, 1.0), np.full(k, 50.0)]


def test_tightening_that_makes_it_worse_twice_in_a_row_goes_back_to_the_plans_timer_and_rests():
    """The sign of the effect: 5 over, then 8, 12, 15 while the timer tightens (smaller batches costing the host
    more); the third and fourth are beyond the first's noise (5 + 2√5 + 1 ≈ 10.5): back to m = 1, and 30 windows
    of rest in which breaches do not tighten."""
    c = TimerControl()
    for k in (5, 8, 12):
        assert c.add(_window(k), 10.0)
    assert c.u < 0 and c.inversions == 0  # one window worse: the lag of requests queued before, perhaps
    assert c.add(_window(15), 10.0) and c.u == 0.0 and c.inversions == 1
    for _ in range(29):
        assert not c.add(_window(20), 10.0)  # resting: hold
    assert c.u == 0.0 and c.add(_window(20), 10.0) and c.u < 0  # rested: tightens again
    d = TimerControl()
    for k in (5, 8, 12, 6, 14):  # worse, better, worse: never twice in a row
        d.add(_window(k), 10.0)
    assert d.inversions == 0 and d.u < -1.0


def test_the_sequential_breach_test_fires_on_a_5x_share_within_100_responses_and_not_on_the_target():
    t = BreachTest()
    ten = np.tile(np.r_[np.full(9, 1.0), 50.0], 10)  # 10 % over, spread evenly
    assert not t.add(ten[:60], 10.0) and t.s >= t.h  # the evidence is there, but fewer than 100 responses
    assert t.add(ten[60:], 10.0) and t.n == 100
    t.reset()
    one = np.tile(np.r_[np.full(99, 1.0), 50.0], 50)  # 1 % over: 5 000 responses, never
    assert not any(t.add(one[i:i + 100], 10.0) for i in range(0, one.size, 100))
    with pytest.raises(ValueError, match="p0 < p1"):
        BreachTest(p0=0.05, p1=0.01)


def test_the_timer_in_force_and_the_table_the_batcher_reads():
    p = BatchingProblem.basic(rho=0.2)
    pl = plan(p)
    c = TimerControl()
    assert c.table(pl) is pl.table and c.timer_ms(pl) == 25.0
    c.u = math.log(0.5)
    t = c.table(pl)
    assert t is not pl.table and t.meta["max_wait_ms"] == pytest.approx(12.5) and pl.table.meta["max_wait_ms"] == 25.0
    assert c.table(pl) is t  # built once per plan and step
    assert np.array_equal(t.policy, pl.table.policy) and t.decide(20) == pl.table.decide(20)
    untimed = Plan(pl.table, p.lam, None, 10.0, 30.0, 20.0)
    assert c.timer_ms(untimed) == pytest.approx(15.0)  # no timer of its own: m × its planned p99
    c.reset()
    assert c.timer_ms(untimed) is None
    with pytest.raises(ValueError, match="target_share"):
        TimerControl(target_share=0.0)


def _slowed(ctl) -> np.ndarray:
    """A 3× slowdown no solve answers (the solver finds nothing): the in-batcher times of its last 25 s."""
    p = BatchingProblem.basic(rho=0.2, service=Deterministic())
    clock = SimClock()
    ap = Autopilot(p, SLO, plan(p), solver=lambda *a: None, clock=clock, solve_in="clock", energy_meter=None,
                   control=ctl)
    run = simulate(ap, p, [Phase(10.0, p.lam), Phase(30.0, p.lam, slowdown=3.0)], seed=7, clock=clock)
    late = run.arrival_ms > 15_000.0
    return run.response_ms[late], ap


def test_on_the_simulated_clock_the_loop_holds_a_slowdown_the_plans_cannot_answer():
    """Timer 25 ms + l(16) ≈ 31 ms in-batcher; slowed 3×, a request that waits for the timer takes ≈ 43 ms > 40.
    Without the loop 1 in 18 requests miss; with it the timer shrinks until fewer than 1 % do."""
    off, _ = _slowed(False)
    on, ap = _slowed(True)
    assert np.mean(off > SLO) > 0.05
    assert np.mean(on > SLO) <= 0.01 and ap.metrics.timer_scale < 0.95
    assert ap.max_wait_ms == pytest.approx(25.0 * ap.metrics.timer_scale) and ap.plan.timer_ms == 25.0


def _outside(served: bool):
    """Steady traffic with 9 ms + Exp(2 ms) per response outside the batcher, no overhead budgeted: the in-batcher
    times (≤ timer 25 + l(16) ≈ 31 ms) never reach the SLO; the end-to-end ones do for the requests that wait."""
    p = BatchingProblem.basic(rho=0.2, service=Deterministic())
    clock = SimClock()
    ap = Autopilot(p, SLO, plan(p), solver=lambda *a: None, clock=clock, solve_in="clock", energy_meter=None)
    run = simulate(ap, p, [Phase(40.0, p.lam)], seed=7, clock=clock, served=served,
                   outside_ms=lambda rng, n: 9.0 + rng.exponential(2.0, n))
    return run.response_ms[run.arrival_ms > 15_000.0], ap


def test_told_the_end_to_end_times_the_loop_holds_the_slo_the_batchers_view_cannot_see():
    blind, ap_blind = _outside(False)
    told, ap_told = _outside(True)
    assert np.mean(blind > SLO) > 0.05 and ap_blind.metrics.timer_scale == 1.0  # the hooks' view looks fine
    assert ap_blind.metrics.responses_from == "batcher" and ap_blind.metrics.observed_p99_ms < 32.0
    assert np.mean(told > SLO) <= 0.01 and ap_told.metrics.timer_scale < 0.9
    assert ap_told.metrics.responses_from == "served" and ap_told.metrics.observed_p99_ms > 35.0


def test_on_rays_own_batcher_the_loop_sets_a_shorter_timeout_live_and_holds_the_unplanned_outside_delay():
    """The loop on Ray's batcher (``simulate_ray``: batches close on the timeout in force as they open, whatever the
    model does): planned with no budget for 9 ms + Exp(2 ms) outside it, the plan's own timeout leaves a third of
    the requests over the SLO; the loop, told the end-to-end times, shortens the timeout until at most 1 % are."""
    from smdp_batch.autopilot import slo_plan
    from smdp_batch.autopilot.simulated import simulate_ray

    p = BatchingProblem.basic(rho=0.2, service=Deterministic())
    first = slo_plan(p, SLO, [p.lam], family="ray", requests=5000)
    over = {}
    for ctl in (False, True):
        clock = SimClock()
        ap = Autopilot(p, SLO, first, solver=lambda *a, **k: None, clock=clock, solve_in="clock", energy_meter=None,
                       control=ctl)
        run = simulate_ray(p, [Phase(40.0, p.lam)], 32, ap, seed=7, clock=clock,
                           outside_ms=lambda rng, n: 9.0 + rng.exponential(2.0, n))
        over[ctl] = np.mean(run.response_ms[run.arrival_ms > 15_000.0] > SLO)
    assert over[False] > 0.2 and ap.plan.spec == first.spec and ap.metrics.swaps == 0  # no solve: the loop alone
    assert over[True] <= 0.01 and ap.metrics.timer_scale < 0.8
    assert ap.max_wait_ms == pytest.approx(first.timer_ms * ap.metrics.timer_scale)


def test_served_times_replace_the_batchers_view_from_their_first_call():
    p = BatchingProblem.basic(rho=0.2, service=Deterministic())
    ap = Autopilot(p, SLO, plan(p), solver=lambda *a: None, solve_in="thread", energy_meter=None)
    ap.observe_response(np.full(100, 10.0))
    assert ap.metrics.observed_p99_ms == 10.0 and ap.metrics.responses_from == "batcher"
    ap.observe_served([50.0, math.nan, -1.0, "x"])  # a non-number list is left out whole; then the view switches
    ap.observe_served(np.full(100, 20.0))
    ap.observe_response(np.full(400, 90.0))  # the batcher's hook, now left out
    assert ap.metrics.responses_from == "served"
    assert ap.metrics.observed_p99_ms == pytest.approx(20.0)
    ap.observe_served(10 ** 400)  # does not fit a float: left out, never raises
    assert ap.metrics.rejected_inputs == 0
