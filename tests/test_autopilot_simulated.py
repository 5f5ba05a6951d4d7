"""The Autopilot on a simulated clock (smdp_batch.autopilot.simulated): the simulated batcher agrees with the exact
evaluation of a table and keeps the safety bound; an Autopilot run is deterministic, a solve goes live
solve_seconds after it starts, a plan that breaks the SLO in service is rolled back and blocked, and stationary
traffic starts no service re-solve."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest

from smdp_batch.autopilot import Autopilot, Plan, slo_plan
from smdp_batch.autopilot.simulated import Phase, SimClock, arrivals, simulate
from smdp_batch.model.laws import Deterministic
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime import PolicyTable
from smdp_batch.solvers import solve

SLO = 40.0


def control(q: int, bmax: int = 32) -> np.ndarray:
    s = np.arange(bmax + 1)
    return np.where(s >= q, np.minimum(s, bmax), 0)


def table(pol, p, timer=None) -> PolicyTable:
    return PolicyTable(pol, p.batch_sizes, {"inputs": {"lam": p.lam}, "max_wait_ms": timer})


def test_a_table_in_the_simulator_has_the_mean_latency_and_power_of_its_exact_evaluation():
    """An independent check of the event loop: 3·10⁵ requests of the optimal table at ρ = 0.5 against eq. 21's
    exact metrics of the same table."""
    p = BatchingProblem.basic(rho=0.5)
    sol = solve(p)
    run = simulate(table(sol.table, p), p, [Phase(200.0, p.lam)], seed=1, max_wait_ms=None)
    ev = sol.deployed
    assert run.response_ms.size > 250_000 and np.all(np.isfinite(run.response_ms))
    assert run.response_ms.mean() == pytest.approx(ev.mean_latency_ms, rel=0.01)
    assert run.batch_size.mean() == pytest.approx(ev.mean_batch_size, rel=0.01)
    span = run.batch_start_ms[-1] + run.batch_ms[-1]
    assert run.batch_energy_mj.sum() / span == pytest.approx(ev.mean_power_w, rel=0.01)  # mJ/ms = W
    assert run.batch_size.sum() == run.response_ms.size  # every request served once


def test_the_safety_bound_caps_the_oldest_wait_and_the_forced_batch_is_the_largest_size_that_fits():
    p = BatchingProblem.basic(rho=0.05, service=Deterministic())
    run = simulate(table(control(32), p), p, [Phase(20.0, p.lam)], seed=2, max_wait_ms=5.0)
    lat = {b: float(p.latency(np.float64(b))) for b in range(1, 33)}
    served_in = np.repeat(run.batch_size, run.batch_size)  # requests are served oldest first, batch by batch
    wait = run.response_ms - np.array([lat[b] for b in served_in])
    assert wait.max() <= 5.0 + 1e-9 and run.forced_batches > 0
    assert set(run.batch_size) <= set(p.batch_sizes)
    # the timer-table form: the table's own timer is the bound under "auto"
    auto = simulate(table(control(32), p, timer=5.0), p, [Phase(20.0, p.lam)], seed=2)
    np.testing.assert_array_equal(auto.response_ms, run.response_ms)


def test_a_forced_batch_pads_up_where_the_table_was_planned_so():
    """Sizes 1, 2, 4, 8, 16, 32 and a table that waits for 32: with "pad-up" (or "auto" on a table whose meta says
    pad-up) a forced batch of n < 32 runs as the next allowed size, its time and energy that size's."""
    p = BatchingProblem.basic(rho=0.05, service=Deterministic(), batch_sizes=(1, 2, 4, 8, 16, 32))
    ph = [Phase(20.0, p.lam)]
    padded = simulate(table(control(32), p, timer=5.0), p, ph, seed=6, short_batch="pad-up")
    meta = {"inputs": {"lam": p.lam}, "max_wait_ms": 5.0, "short_batch": "pad-up"}
    auto = simulate(PolicyTable(control(32), p.batch_sizes, meta), p, ph, seed=6)
    np.testing.assert_array_equal(auto.batch_energy_mj, padded.batch_energy_mj)
    run_as = np.array([next(s for s in p.batch_sizes if s >= b) for b in padded.batch_size])
    zeta = {b: float(p.energy(np.float64(b))) for b in p.batch_sizes}
    np.testing.assert_allclose(padded.batch_energy_mj, [zeta[b] for b in run_as])
    np.testing.assert_allclose(padded.batch_ms, [float(p.latency(np.float64(b))) for b in run_as])
    assert np.any(padded.batch_size != run_as)  # some batches were padded
    served = simulate(table(control(32), p, timer=5.0), p, ph, seed=6)  # "serve": the largest size that fits
    assert set(served.batch_size) <= set(p.batch_sizes)


def test_a_per_batch_time_holds_the_instance_after_each_batch_unseen_by_the_hooks():
    p = BatchingProblem.basic(rho=0.3, service=Deterministic())
    seen = []

    class Seen(PolicyTable):
        def observe_batch(self, b, seconds, ok=True):
            seen.append(seconds * 1e3)

    t = Seen(control(8), p.batch_sizes, {"inputs": {"lam": p.lam}, "max_wait_ms": 10.0})
    run = simulate(t, p, [Phase(5.0, p.lam)], seed=8, per_batch_ms=4.0)
    gaps = run.batch_start_ms[1:] - (run.batch_start_ms[:-1] + run.batch_ms[:-1])
    assert gaps.min() >= 4.0 - 1e-9 and np.any(gaps < 4.0 + 1e-6)  # back to back under load: exactly 4 ms apart
    np.testing.assert_allclose(seen, run.batch_ms)  # the hooks see the batch, not the 4 ms
    with pytest.raises(ValueError, match="per_batch_ms"):
        simulate(t, p, [Phase(1.0, p.lam)], per_batch_ms=-1.0)


def test_a_calibrated_served_delay_adds_its_return_per_position_its_outside_draw_at_the_load_and_its_batch_times():
    """With ``outside_ms`` a ServedDelay (``smdp-batch calibrate``'s file) the simulated server adds what that real
    one was measured to add: against the same trace without it, each response is later by k·r (the k-th of its
    batch) plus a draw of the outside delay at the calibrated load nearest at or above the traffic's rate (here one
    value per load: 3 ms at 20 req/s, 7 ms at 100 req/s); batches take l(b) as served and hold the instance a + c·b
    more."""
    from smdp_batch.model.served import ServedDelay

    p = BatchingProblem.basic(rho=0.3, service=Deterministic())
    t = table(control(4), p, timer=10.0)
    phases = [Phase(3.0, 0.015), Phase(3.0, 0.08)]  # 15 req/s (drawn at 20), then 80 req/s (at 100)
    cal = ServedDelay(0.0, 0.0, 0.25, (20.0, 100.0), (np.array([3.0]), np.array([7.0])))
    plain, served = simulate(t, p, phases, seed=4), simulate(t, p, phases, seed=4, outside_ms=cal)
    np.testing.assert_array_equal(plain.batch_start_ms, served.batch_start_ms)  # no hold, no l(b) change: same batches
    extra = served.response_ms - plain.response_ms
    for k, outside in ((0, 3.0), (1, 7.0)):
        pos = (extra[plain.phase == k] - outside) / 0.25  # the position in the batch: 0, 1, 2, …
        np.testing.assert_allclose(pos, np.round(pos), atol=1e-9)
        assert pos.min() == pytest.approx(0.0) and 1 <= pos.max() <= p.batch_sizes[-1] - 1
    held = ServedDelay(2.0, 0.5, 0.0, (20.0,), (np.array([0.0]),),
                       served_latency_ms={b: 9.0 + 0.1 * b for b in p.batch_sizes})
    run = simulate(t, p, [Phase(3.0, 0.05)], seed=4, outside_ms=held)
    assert run.batch_ms.size > 50
    np.testing.assert_allclose(run.batch_ms, 9.0 + 0.1 * run.batch_size)  # l(b) as that server ran it
    gaps = run.batch_start_ms[1:] - (run.batch_start_ms[:-1] + run.batch_ms[:-1])
    assert np.all(gaps >= 2.0 + 0.5 * run.batch_size[:-1] - 1e-9)  # each batch holds the instance a + c·b more
    with pytest.raises(ValueError, match="ServedDelay"):
        simulate(t, p, phases, outside_ms="3 ms")


def test_rays_batcher_on_the_simulated_clock_answers_as_the_product_simulator_of_rays_rule():
    """``simulate_ray`` (Ray 2.60's ``serve.batch``: a batch closes on its own timer or at its size, whatever the
    model does, and closed batches run one at a time) gives every request the response time of the product's
    ``ray:`` rule (``analysis.simulate.response_times``, a second implementation) on the same arrivals, at loads
    where the model is free and where it is not; with a timeout of 0 every request is its own batch."""
    from smdp_batch.analysis.simulate import response_times
    from smdp_batch.autopilot.simulated import simulate_ray
    from smdp_batch.baselines.servers import ray_serve

    p = BatchingProblem.basic(rho=0.3, service=Deterministic())
    for lam, timeout in ((0.05, 20.0), (1.5, 4.0), (3.0, 12.0)):
        run = simulate_ray(p, [Phase(4.0, lam)], 16, timeout, seed=2)
        ref = response_times(p, ray_serve(16, timeout / 1e3), run.arrival_ms)
        np.testing.assert_allclose(run.response_ms, ref, rtol=1e-12, atol=1e-9)
        assert run.batch_size.max() <= 16 and run.batch_size.sum() == run.arrival_ms.size
    alone = simulate_ray(p, [Phase(2.0, 0.5)], 16, 0.0, seed=2)
    assert np.all(alone.batch_size == 1)
    with pytest.raises(ValueError, match="max_batch_size"):
        simulate_ray(p, [Phase(1.0, 0.5)], 64, 1.0)
    with pytest.raises(ValueError, match="timeout_ms"):
        simulate_ray(p, [Phase(1.0, 0.5)], 8, -1.0)


class _Stepped(Autopilot):
    """An Autopilot whose timer in force is 5 ms before 2 s of simulated time, 0 until 4 s (Ray's batches of one),
    then 20 ms."""

    @property
    def max_wait_ms(self):
        t = self._clock()
        return 5.0 if t < 2.0 else 0.0 if t < 4.0 else 20.0


def test_an_autopilot_on_rays_batcher_sets_the_timeout_each_batch_reads_as_it_opens():
    """``simulate_ray(..., autopilot)``: Ray's batcher reads ``batch_wait_timeout_s`` as a batch opens.  An Autopilot
    whose timer never moves (no solver, no loop) answers every request as the fixed timeout does, draw for draw; a
    timer stepped from 5 ms to 0 and then to 20 ms closes each batch on the timer in force at its first request; the
    Autopilot hears of every arrival and batch, and of each response's end-to-end time beside its batcher view."""
    from smdp_batch.autopilot.simulated import simulate_ray

    p = BatchingProblem.basic(rho=0.2, service="gamma:11")
    first = slo_plan(p, SLO, [p.lam], family="ray", requests=5000)
    phases = [Phase(6.0, p.lam)]
    clock = SimClock()
    ap = Autopilot(p, SLO, first, solver=lambda *a, **k: None, clock=clock, solve_in="clock", energy_meter=None,
                   control=False)
    run = simulate_ray(p, phases, 32, ap, seed=3, clock=clock, outside_ms=4.0)
    fixed = simulate_ray(p, phases, 32, first.timer_ms, seed=3, outside_ms=4.0)
    np.testing.assert_array_equal(run.response_ms, fixed.response_ms)
    m = ap.metrics
    assert m.responses_from == "served" and m.observed_p99_ms == pytest.approx(
        np.percentile(run.response_ms[-500:], 99), rel=0.05)
    assert sum(m.batches) == run.batch_size.size  # every size Ray formed is one the profile has

    clock = SimClock()
    ap = _Stepped(p, SLO, first, solver=lambda *a, **k: None, clock=clock, solve_in="clock", energy_meter=None)
    low = [Phase(6.0, 0.02)]  # 20 requests/s: batches close on their timer, the model is free
    run = simulate_ray(p, low, 32, ap, seed=1, clock=clock)
    firsts = run.arrival_ms[np.concatenate([[0], np.cumsum(run.batch_size)[:-1]])]
    wait = run.batch_start_ms - firsts
    np.testing.assert_allclose(wait, np.select([firsts < 2000.0, firsts < 4000.0], [5.0, 0.0], 20.0), atol=1e-9)
    assert np.all(run.batch_size[(firsts >= 2000.0) & (firsts < 4000.0)] == 1)
    with pytest.raises(ValueError, match="family='ray'"):
        clock = SimClock()
        own = Autopilot(p, SLO, slo_plan(p, SLO, [p.lam], requests=5000), solver=lambda *a, **k: None, clock=clock,
                        solve_in="clock", energy_meter=None)  # a table + timer: Ray's batcher cannot run it
        simulate_ray(p, phases, 32, own, clock=clock)
    with pytest.raises(ValueError, match="solve_in='clock'"):
        simulate_ray(p, phases, 32, ap)


def test_phases_give_poisson_counts_and_a_ramp_its_shape():
    ph = [Phase(100.0, 0.2), Phase(100.0, 0.6, 0.0)]
    t, k = arrivals(ph, seed=3)
    assert np.all(np.diff(t) >= 0) and t[-1] <= 200_000.0
    n0, n1 = int((k == 0).sum()), int((k == 1).sum())
    assert abs(n0 - 20_000) < 5 * math.sqrt(20_000) and abs(n1 - 30_000) < 5 * math.sqrt(30_000)
    first = int(((k == 1) & (t < 150_000.0)).sum())  # the ramp's first half carries 3/4 of its arrivals
    assert abs(first / n1 - 0.75) < 0.02
    np.testing.assert_array_equal(arrivals(ph, seed=3)[0], t)


class Fake:
    """A deterministic solver: at the rate it is given, a control-limit table with made-up planned metrics;
    ``bad`` answers a table that waits for 32 requests, with no timer, claiming half the SLO."""

    def __init__(self, bad: bool = False):
        self.bad, self.calls = bad, 0

    def __call__(self, problem, slo_ms, lams):
        self.calls += 1
        q = 32 if self.bad else 4
        t = PolicyTable(control(q), problem.batch_sizes, {"inputs": {"lam": lams[0]}, "max_wait_ms": None})
        return Plan(t, lams[0], None, 5.0, 0.5 * slo_ms, 20.0, True, f"control:{q}")


def pilot(p, solver, clock, **kw) -> Autopilot:
    start = Plan(table(control(2), p), p.lam, None, 8.0, 30.0, 15.0)
    opts = {"min_interval_s": 1.0, "energy_meter": None, "solve_in": "clock", "solve_seconds": 3.0, **kw}
    return Autopilot(p, SLO, start, solver=solver, clock=clock, **opts)


def _events(run):
    return [{k: v for k, v in e.items() if k not in ("live_table", "to", "table")} for e in run.events]


def test_an_autopilot_run_is_deterministic_and_a_solve_goes_live_solve_seconds_after_it_starts():
    p = BatchingProblem.basic(rho=0.1)
    trace = [Phase(10.0, p.lam), Phase(10.0, 3 * p.lam)]
    runs = []
    for _ in range(2):
        clock = SimClock()
        runs.append(simulate(pilot(p, Fake(), clock), p, trace, seed=4, clock=clock))
    a, b = runs
    np.testing.assert_array_equal(a.response_ms, b.response_ms)
    assert _events(a) == _events(b)
    swaps = [e for e in a.events if e["event"] == "swap"]
    assert swaps and swaps[0]["reason"] == "rate" and swaps[0]["seconds"] == 3.0
    assert 10.0 + 3.0 <= swaps[0]["t_s"] < 20.0  # the step at 10 s, found, solved, live 3 s of simulated time later
    after = a.batch_start_ms > swaps[0]["t_s"] * 1e3 + 100.0
    assert np.all(a.batch_size[after] >= 4)  # the new table serves from 4 on (the start table from 2)


def test_a_plan_that_breaks_the_slo_in_service_is_rolled_back_and_blocked_at_that_load():
    p = BatchingProblem.basic(rho=0.1)
    clock = SimClock()
    ap = pilot(p, Fake(bad=True), clock, window=100, grace=0, rate_tol=0.25, min_interval_s=0.5)
    run = simulate(ap, p, [Phase(5.0, p.lam), Phase(25.0, 1.5 * p.lam)], seed=5, clock=clock)
    kinds = [e["event"] for e in run.events]
    assert "swap" in kinds and "rollback" in kinds
    assert kinds.index("swap") < kinds.index("rollback")
    rollback = next(e for e in run.events if e["event"] == "rollback")
    assert rollback["observed_p99_ms"] > SLO * 1.1
    later = kinds[kinds.index("rollback") + 1:]
    assert "swap" not in later and "blocked" in later  # the same plan planned at that load again: blocked
    assert ap.plan.spec != "control:32" and ap.metrics.rollbacks == 1
    end = run.arrival_ms > (rollback["t_s"] + 1.0) * 1e3
    assert np.percentile(run.response_ms[end], 99) < SLO  # the plan put back holds it


@pytest.mark.parametrize("service", ["det", "gamma:11", "lognormal:0.3"])
def test_stationary_traffic_starts_no_service_re_solve_with_the_real_optimiser(service):
    """60 s of stationary traffic at ρ = 0.3, batch times deterministic or with a coefficient of variation of 0.3
    (gamma of shape 11, lognormal σ 0.3): the drift test raises no false alarm (three seeds each)."""
    p = BatchingProblem.basic(rho=0.3, service=service)
    solver = functools.partial(slo_plan, requests=5000)
    for seed in range(3):
        clock = SimClock()
        ap = Autopilot(p, SLO, None, solver=solver, clock=clock, solve_in="clock", energy_meter=None)
        run = simulate(ap, p, [Phase(60.0, p.lam)], seed=seed, clock=clock)
        assert not [e for e in run.events if e.get("reason") == "service"], run.events
        assert np.mean(run.response_ms > SLO) <= 0.01


@pytest.mark.parametrize("family", ["ray", "triton"])
def test_an_autopilot_planning_a_servers_batcher_follows_a_3x_step_with_its_plans_and_holds_the_slo(family):
    """family="ray" / "triton" through the whole state machine on the simulated clock: the first plan and every swap
    are the server's rule (max batch Bmax, a delay), solved by the real optimiser, re-timed at the new load; ≤ 1 %
    over the SLO."""
    head = "ray:max=32,timeout_s=" if family == "ray" else "triton:max=32,delay_us="
    p = BatchingProblem.basic(rho=0.1, service="gamma:11")
    clock = SimClock()
    ap = Autopilot(p, SLO, None, clock=clock, solve_in="clock", energy_meter=None, family=family, min_samples=100)
    first = ap.plan
    assert first.table.meta["family"] == family and first.spec.startswith(head)
    run = simulate(ap, p, [Phase(10.0, p.lam), Phase(20.0, 3 * p.lam)], seed=2, clock=clock)
    swaps = [e for e in run.events if e["event"] == "swap"]
    assert swaps and all(e["setting"].startswith(head) for e in swaps), swaps
    assert ap.plan.table.meta["family"] == family and ap.plan.lam > 2.0 * p.lam
    assert ap.plan.timer_ms != first.timer_ms  # re-timed for the new load
    late = run.arrival_ms > 15_000.0
    assert np.mean(run.response_ms[late] > SLO) <= 0.01 and ap.metrics.rollbacks == 0


def test_a_slowdown_in_the_middle_of_service_starts_a_solve_within_48_batches():
    """The whole path (estimator, materiality, schedule) on the simulated clock, on the heavy ONNX profile of the
    five-phase benchmark (7-24 ms batches, 50 requests/s): 30 s steady, then every batch 1.5× slower, batch times
    with a coefficient of variation of 0.3; the solve (it finds nothing) starts within 48 batches of the change in
    each of 10 seeds (over 50 seeds: median 14, at most 28; no event before the change in any)."""
    csv = f"csv:{Path(__file__).resolve().parents[1] / 'benchmarks' / 'data' / 'onnx_mlp_x4_cpu.csv'}"
    p = BatchingProblem(0.05, batch_sizes=(1, 2, 4, 8, 16, 32), latency=csv, energy=csv, service="gamma:11")
    n = np.arange(33)
    largest = np.array([max(b for b in p.batch_sizes if b <= k) if k >= 4 else 0 for k in n])  # from 4 on
    start = Plan(PolicyTable(largest, p.batch_sizes, {"inputs": {"lam": p.lam}, "max_wait_ms": 25.0}), p.lam, 25.0,
                 20.0, 45.0, 15.0)
    found = []
    for seed in range(10):
        clock = SimClock()
        ap = Autopilot(p, 50.0, start, solver=lambda *a: None, clock=clock, solve_in="clock", solve_seconds=0.0,
                       energy_meter=None, min_interval_s=0.0)
        run = simulate(ap, p, [Phase(30.0, p.lam), Phase(10.0, p.lam, slowdown=1.5)], seed=seed, clock=clock)
        assert not [e for e in run.events if e["t_s"] < 30.0], run.events[:3]  # no false alarm before
        t = next(e["t_s"] for e in run.events if e.get("reason") == "service")
        found.append(int(np.count_nonzero((run.batch_start_ms >= 30_000.0) & (run.batch_start_ms < t * 1e3))))
    assert max(found) <= 48 and np.median(found) <= 20, found


def test_bad_inputs_get_one_clear_error():
    p = BatchingProblem.basic(rho=0.1)
    t = table(control(2), p)
    with pytest.raises(ValueError, match="phase 1: seconds = -1"):
        simulate(t, p, [Phase(-1.0, p.lam)])
    with pytest.raises(ValueError, match="phase 2: rate = nan"):
        simulate(t, p, [Phase(1.0, p.lam), Phase(1.0, math.nan)])
    with pytest.raises(ValueError, match="at least one phase"):
        simulate(t, p, [])
    with pytest.raises(ValueError, match="at most 5e"):
        simulate(t, p, [Phase(1e6, 10.0)])
    with pytest.raises(ValueError, match="max_wait_ms"):
        simulate(t, p, [Phase(1.0, p.lam)], max_wait_ms="soon")
    with pytest.raises(ValueError, match="short_batch must be"):
        simulate(t, p, [Phase(1.0, p.lam)], short_batch="pad")
    with pytest.raises(ValueError, match="returned 3 at queue length 1"):
        simulate(_Returns(3), p, [Phase(1.0, p.lam)])
    thread = Autopilot(p, SLO, Plan(t, p.lam), solver=Fake(), energy_meter=None)
    with pytest.raises(ValueError, match="solve_in='clock'"):
        simulate(thread, p, [Phase(1.0, p.lam)])
    with pytest.raises(TypeError, match="decide"):
        simulate(object(), p, [Phase(1.0, p.lam)])


class _Returns:
    def __init__(self, b):
        self.b = b

    def decide(self, n):
        return self.b


def test_the_autopilot_benchmark_runs_its_simulated_trace_and_refuses_an_unknown_setting():
    """``benchmarks/bench_autopilot.py --simulated`` end to end on a short trace (2 s phases), a setting whose name
    holds a comma picked by ``--only``, and an unknown one refused with one line and exit code 2."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_autopilot.py"
    run = subprocess.run([sys.executable, str(script), "--simulated", "--lam", "0.05", "--phase-seconds", "2",
                          "--repeats", "1", "--only",
                          "autopilot, open loop,autopilot on Triton's batcher,autopilot on Ray's batcher,tuned server"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "| 5 steady | autopilot, open loop |" in run.stdout and "| 1 steady | tuned server |" in run.stdout
    assert "| 5 steady | autopilot on Triton's batcher |" in run.stdout
    assert "| 5 steady | autopilot on Ray's batcher |" in run.stdout  # Ray's own batcher, its timeout set live
    assert "| 1 steady | static table |" not in run.stdout
    bad = subprocess.run([sys.executable, str(script), "--simulated", "--only", "autopilot,nonsense"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "--only: unknown setting 'nonsense'; valid: autopilot; autopilot, open loop; autopilot on Triton's batcher; "
        "autopilot on Ray's batcher; tuned server; λ-bank; static table"]
    grid = subprocess.run([sys.executable, str(script), "--simulated", "--bank", "8:48"],
                          capture_output=True, text=True, timeout=120)
    assert grid.returncode == 2 and grid.stderr.strip().splitlines() == [
        "--bank: expected lo:hi:count (ms, ms, members), got '8:48'"]


def test_bench_autopilot_finds_the_best_static_setting_in_hindsight(tmp_path):
    """``--static-delays`` adds Triton's batcher at fixed delays (simulated here) and prints the best static setting
    in hindsight: the least energy among those within 1 % over the SLO in every phase; ``--combine`` does it over
    saved runs; ``--stationary`` runs five steady phases; bad grids and files get one line and exit code 2."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_autopilot.py"
    out = tmp_path / "sim.json"
    run = subprocess.run([sys.executable, str(script), "--simulated", "--lam", "0.05", "--phase-seconds", "2",
                          "--repeats", "1", "--only", "autopilot on Triton's batcher", "--static-delays", "5,30",
                          "--stationary", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "| 1 steady | Triton at 5 ms |" in run.stdout and "| 4 steady | Triton at 30 ms |" in run.stdout
    assert "slow" not in run.stdout and "best static setting on the simulated clock in hindsight over 1 runs" in run.stdout
    assert "| 1 steady | Ray at 5 ms |" in run.stdout  # and Ray's (simulate_ray)
    res = json.loads(out.read_text())
    rows = {k: v["rows"][0] for k, v in res.items() if not k.startswith("_")}
    energy = {k: sum(r["mj_per_request"] * r["requests"] for r in v) / sum(r["requests"] for r in v)
              for k, v in rows.items()}
    assert energy["Triton at 30 ms"] < energy["Triton at 5 ms"]  # the longer delay batches more
    assert energy["Ray at 30 ms"] < energy["Ray at 5 ms"]
    # --combine over two saved runs with made-up results: the one within 1 % everywhere wins, on each server the
    # runs share (Ray's statics against the Autopilot on Ray's batcher)
    def saved(path, over, ray=True):
        row = {"requests": 100, "over_slo": 0.0, "mj_per_request": 10.0}
        res = {"triton": {"autopilot on Triton's batcher": {"rows": [dict(row, mj_per_request=11.0)] * 5},
                          "Triton at 10 ms": {"rows": [dict(row, mj_per_request=12.0)] * 5},
                          "Triton at 20 ms": {"rows": [dict(row, over_slo=over)] * 5}},
               "ray": {"autopilot on Ray's batcher": {"rows": [dict(row, mj_per_request=9.0)] * 5},
                       "Ray at 15 ms": {"rows": [dict(row, mj_per_request=10.0)] * 5},
                       "Ray at 25 ms": {"rows": [dict(row, over_slo=over, mj_per_request=8.0)] * 5}}}
        if not ray:
            del res["ray"]
        path.write_text(json.dumps(res))
        return str(path)

    both = subprocess.run([sys.executable, str(script), "--combine", saved(tmp_path / "a.json", 0.005),
                           saved(tmp_path / "b.json", 0.02)], capture_output=True, text=True, timeout=120)
    assert both.returncode == 0, both.stderr
    assert "best static: Triton at 10 ms (12.00 mJ/request" in both.stdout
    assert "0.917, 0.917 × the best static" in both.stdout
    assert "best static setting on ray in hindsight over 2 runs" in both.stdout
    assert "best static: Ray at 15 ms (10.00 mJ/request" in both.stdout and "0.900, 0.900 × the best static" in both.stdout
    one = subprocess.run([sys.executable, str(script), "--combine", saved(tmp_path / "c.json", 0.0),
                          saved(tmp_path / "d.json", 0.0, ray=False)], capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and "on triton" in one.stdout and "on ray" not in one.stdout  # Ray not in every file
    for args, line in ((["--static-delays", "5,x"], "--static-delays: expected delays in 0..1000 ms, comma-separated, "
                        "got '5,x'"),
                       (["--combine", str(tmp_path / "missing.json")], None)):
        bad = subprocess.run([sys.executable, str(script), "--simulated", *args], capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        if line:
            assert bad.stderr.strip() == line
