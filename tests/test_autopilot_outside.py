"""The outside delay learned online (smdp_batch.autopilot.outside): the difference of the end-to-end and the batcher's
times per rate bin, the return per position from batches told in order, the quantile average between loads, a
calibration's loads kept, bad input left out; the Autopilot re-plans when it moves, and on the simulated clock a
front end that slows with load is planned with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smdp_batch.autopilot import Autopilot
from smdp_batch.autopilot.outside import BIN_SIZE, MIN_BATCHES, MIN_SAMPLES, OutsideLearner
from smdp_batch.autopilot.simulated import Phase, SimClock, simulate
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.model.served import ServedDelay

from test_autopilot import SLO, FakeSolver, make


def _feed(ol: OutsideLearner, lam: float, outside, batches: int, b: int, rng, r: float = 0.0) -> None:
    """``batches`` batches of ``b`` told in FIFO order at rate λ (1/ms): outside = draw + r·k for the k-th."""
    for _ in range(batches):
        batch = rng.uniform(5.0, 30.0, b)
        ol.observe(lam, batch, batch + outside(rng, b) + r * np.arange(b), positions=True)


def test_the_difference_is_learned_per_rate_bin_with_the_return_per_position():
    rng = np.random.default_rng(0)
    ol = OutsideLearner()
    assert ol.model([0.5]) is None and ol.p99_at(0.5) == 0.0 and not ol.learned()
    _feed(ol, 0.5, lambda g, n: 2.0 + g.exponential(1.0, n), 60, 8, rng, r=0.4)
    _feed(ol, 2.0, lambda g, n: 8.0 + g.exponential(3.0, n), 60, 8, rng, r=0.4)
    assert ol.learned() and ol.batches == 120 >= MIN_BATCHES and ol.pairs == 960
    assert ol.return_ms == pytest.approx(0.4, abs=0.1)  # the slope within batches, not the loads' difference
    (x0, lo), (x1, hi) = ol.points()
    assert x0 == pytest.approx(500.0) and x1 == pytest.approx(2000.0)
    assert np.percentile(lo, 99) == pytest.approx(2.0 + 1.0 * math.log(100), rel=0.25)  # Exp's p99: mean·ln 100
    assert np.percentile(hi, 99) == pytest.approx(8.0 + 3.0 * math.log(100), rel=0.25)
    assert np.all(np.diff(lo) >= 0)  # sorted, as ServedDelay keeps its samples
    m = ol.model([2.0, 1.6, 2.5])
    assert isinstance(m, ServedDelay) and m.loads_per_s == pytest.approx((1600.0, 2000.0, 2500.0))
    assert m.return_ms == pytest.approx(ol.return_ms) and m.a_ms == 0.0 and m.c_ms == 0.0
    assert np.array_equal(m.outside_at(2.5), hi)  # beyond the points: the nearest one's


def test_between_two_loads_the_delays_are_their_quantile_average_by_log_load():
    ol = OutsideLearner()
    for lam, v in ((1.0, 4.0), (4.0, 10.0)):
        for _ in range(MIN_SAMPLES):
            ol.observe(lam, [1.0], [1.0 + v], positions=False)
    assert ol.return_ms == 0.0 and ol.batches == 0  # told one at a time: no positions
    assert np.allclose(ol.sample_at(2.0), 7.0)  # the geometric middle: half-way
    assert np.allclose(ol.sample_at(0.1), 4.0) and np.allclose(ol.sample_at(40.0), 10.0)
    assert ol.p99_at(2.0) == pytest.approx(7.0)


def test_a_calibration_keeps_its_loads_outside_the_learned_bins_and_its_per_batch_time():
    base = ServedDelay(1.5, 0.2, 0.3, (100.0, 1000.0), (np.full(50, 3.0), np.full(50, 20.0)), carried_per_s=1000.0,
                       stats=({"why": "x"}, {"new_run_share": 0.01}), source={"server": "triton"})
    ol = OutsideLearner(base)
    first = ol.model([0.1])  # before a bin fills: the calibration (less its spread)
    assert all(map(np.array_equal, first.outside_ms, base.outside_ms)) and ol.return_ms == 0.3
    for _ in range(MIN_SAMPLES):
        ol.observe(0.1, [2.0], [7.0], positions=False)  # 100 req/s: 5 ms, where the calibration said 3
    pts = ol.points()
    assert [x for x, _ in pts] == pytest.approx([100.0, 1000.0]) and np.allclose(pts[0][1], 5.0)
    m = ol.model([0.5])
    assert (m.a_ms, m.c_ms, m.return_ms, m.carried_per_s) == (1.5, 0.2, 0.3, 1000.0)
    assert m.loads_per_s == pytest.approx((500.0, 1000.0))  # the calibrated 100/s, which a bin covers, is gone: a
    # simulation at 500/s whose stream ran a little low would otherwise draw its calibrated delays, not the learned
    f = 5.0 / 3.0  # this deployment's delay against the calibration's, where both are known: its calibrated 1 000/s
    assert np.allclose(m.outside_at(0.5), 5.0 + (20.0 * f - 5.0) * math.log(5.0) / math.log(10.0))  # scales by it
    assert m.stats[0] == {}  # the calibrated load a plan at 500/s would have used (less its spread)
    assert "learned online" in m.source["outside"] and m.source["server"] == "triton"


def test_a_load_learned_beyond_the_calibrations_carried_load_is_carried():
    """The server answered at the loads learned: a plan there is not refused for the calibration's carried load
    (a path that did not keep up shows as delays no plan meets); above the learned bins the refusal stands."""
    base = ServedDelay(0.0, 0.0, 0.0, (100.0, 200.0, 400.0), (np.full(50, 3.0),) * 3, carried_per_s=200.0,
                       stats=({}, {}, {"why": "its queue grew"}))
    ol = OutsideLearner(base)
    assert base.beyond(0.3) and ol.model([0.3]).beyond(0.3)  # nothing learned: the calibration refuses 300/s
    for _ in range(MIN_SAMPLES):
        ol.observe(0.3, [2.0], [6.0], positions=False)  # the server answered at 300 req/s
    m = ol.model([0.3, 0.33])
    assert m.beyond(0.3) is None and m.beyond(0.33) is None and 300.0 < m.carried_per_s < 400.0
    assert m.beyond(0.5)  # beyond the learned bin, where the calibration's 400/s did not carry
    assert base.carried_per_s == 200.0


def test_the_spread_between_deployments_is_left_out_of_every_plan_learned_or_not():
    """A calibration's ``new_run_share`` says how far another deployment's p99 may land from its plan (± 172 % on a
    noisy host).  Added to the Autopilot's plans it kept a client p99 of 30-35 ms against 50 on Ray Serve where bins
    were learned, and left no room at all where none was yet (Ray's timeout 0 through a whole phase).  The Autopilot
    watches its own deployment: the spread is left out everywhere, the calibration sample's own interval kept."""
    spread = {"why": "x", "new_run_share": 0.4}
    base = ServedDelay(0.0, 0.0, 0.0, (100.0, 1000.0), (np.linspace(2.0, 4.0, 50), np.full(50, 20.0)),
                       stats=(spread, {"new_run_share": 0.3}))
    ol = OutsideLearner(base)
    first = ol.model([0.1])  # nothing learned: the calibration, less its spread
    assert first.stats == ({"why": "x"}, {}) and np.array_equal(first.outside_ms[0], base.outside_ms[0])
    assert 0.0 < first.halfwidth(0.1, 99.0, 40.0) < 1.0 <= 0.4 * 40.0 <= base.halfwidth(0.1, 99.0, 40.0)
    for _ in range(MIN_SAMPLES):
        ol.observe(0.1, [2.0], [7.0], positions=False)  # learned at 100 req/s
    m = ol.model([0.1, 0.12, 0.5])  # λ̂ and the edge of its band, a bin's width from it; a load of no bin
    assert m.loads_per_s == pytest.approx((100.0, 120.0, 500.0, 1000.0))
    assert m.stats == ({"why": "x"}, {}, {}, {})  # every load: the calibrated load's statistics, no spread
    assert m.halfwidth(0.5, 99.0, 40.0) < 0.3 * 40.0
    assert base.stats[0] is spread and spread["new_run_share"] == 0.4  # the calibration itself untouched


def test_a_calibrated_load_not_learned_yet_is_scaled_by_this_deployments_factor():
    """A calibration is another deployment's (on Ray Serve its outside p99 was 27.4 ms at 15/s where the Autopilot's
    own deployment learned 11-20 ms, and plans at loads not learned yet drew the 27.4): its loads no bin covers are
    scaled by the geometric mean of learned p99 ÷ calibrated p99 over the learned bins, within [1/3, 3]."""
    from smdp_batch.autopilot.outside import FACTOR_MIN

    base = ServedDelay(0.0, 0.0, 0.0, (100.0, 1000.0), (np.full(50, 10.0), np.full(50, 20.0)))
    ol = OutsideLearner(base)
    assert np.allclose(ol.sample_at(1.0), 20.0)  # nothing learned: as calibrated
    for _ in range(MIN_SAMPLES):
        ol.observe(0.1, [2.0], [7.0], positions=False)  # 5 ms at 100/s, where the calibration said 10
    assert np.allclose(ol.sample_at(1.0), 10.0)  # 1 000/s, not learned: 20 × 0.5
    assert np.allclose(ol.model([0.5]).outside_at(1.0), 10.0)  # what a plan draws there, too
    for _ in range(MIN_SAMPLES):
        ol.observe(0.4, [2.0], [2.0 + 2.0 * (10.0 + 10.0 * math.log(4.0) / math.log(10.0))], positions=False)
    # learned at 400/s at 2 × the calibration's there (its quantile average by log-load): factors 0.5 and 2, mean 1
    assert np.allclose(ol.sample_at(1.0), 20.0)
    slow = OutsideLearner(base)
    for _ in range(MIN_SAMPLES):
        slow.observe(0.1, [0.0], [100.0], positions=False)  # 10 × the calibration: taken at 3 at most
    assert np.allclose(slow.sample_at(1.0), 20.0 / FACTOR_MIN)


def test_a_stall_of_the_host_is_planned_with_while_recent_and_forgotten_a_minute_later():
    """A second in which every response waits (a stall of the host) puts ~1.5 % of a bin's delays far out.  On a real
    Ray Serve run a bin kept it for its whole 4 000 delays, and through the deployment factor every unlearned load
    drew it: no setting had room at the next step.  Told the time, a bin plans with its last MAX_AGE_S seconds (at
    least its latest MIN_SAMPLES): the stall counts while it is recent and is gone a minute later, at its own load and
    at the loads the factor scales."""
    from smdp_batch.autopilot.outside import FACTOR_MIN, MAX_AGE_S

    base = ServedDelay(0.0, 0.0, 0.0, (30.0, 100.0), (np.full(50, 4.0), np.full(50, 8.0)))
    ol, rng, t = OutsideLearner(base), np.random.default_rng(5), 0.0

    def serve(seconds: float, outside) -> None:  # 30 requests/s told one at a time, each with its outside delay
        nonlocal t
        for _ in range(int(30 * seconds)):
            t += 1.0 / 30.0
            ol.observe(0.03, [10.0], [10.0 + outside()], positions=False, now_s=t)

    serve(60.0, lambda: rng.uniform(3.0, 5.0))
    quiet, unlearned = ol.p99_at(0.03), ol.p99_at(0.1)
    assert quiet < 5.0 and unlearned < 10.0  # 30/s learned at the calibration's 4 ms: the factor is about 1
    serve(1.0, lambda: 300.0)  # the stall
    serve(10.0, lambda: rng.uniform(3.0, 5.0))
    assert ol.p99_at(0.03) == 300.0  # recent: planned with, here and (the factor at its cap) at the unlearned load
    assert ol.p99_at(0.1) == pytest.approx(8.0 / FACTOR_MIN)
    ol.planning([0.03])  # a plan drew it
    serve(MAX_AGE_S, lambda: rng.uniform(3.0, 5.0))
    assert ol.p99_at(0.03) == pytest.approx(quiet, abs=0.2) and ol.p99_at(0.1) == pytest.approx(unlearned, rel=0.05)
    assert abs(ol.points()[0][1].size - 30 * MAX_AGE_S) <= 1  # the last minute's, of the ring's BIN_SIZE
    assert ol.moved(0.03, 2.0)  # and the Autopilot re-plans when it has gone
    ol.observe(0.3, [10.0], [15.0], positions=False, now_s=t + 600.0)  # the traffic left for another load: the bin
    assert ol.points()[0][1].size == MIN_SAMPLES  # keeps its latest MIN_SAMPLES, what was last learned there


def test_a_stationary_minute_does_not_re_plan_on_its_p99s_own_noise_but_a_real_move_does():
    """A minute's p99 at 15 requests/s rests on 9 values above it: from one check to the next it moves by a few ms
    with nothing changed (2.7 re-plans in five stationary minutes on the simulated clock, where 4 000 delays per bin
    had given none).  A move re-plans only beyond the sample's own 99.9 % interval for its p99 as well as the
    tolerance; a real one (the same delays 50 % longer) still does, within a minute."""
    ol, rng, t = OutsideLearner(), np.random.default_rng(11), 0.0

    def serve(seconds: float, scale: float) -> int:  # 15 requests/s; how many checks found a move
        nonlocal t
        moves = 0
        for _ in range(int(15 * seconds)):
            t += 1.0 / 15.0
            ol.observe(0.015, [10.0], [10.0 + scale * (2.0 + rng.exponential(3.0))], positions=False, now_s=t)
            if ol.moved(0.015, 2.0):
                moves += 1
                ol.planning([0.015])  # as the Autopilot's re-solve does
        return moves

    serve(30.0, 1.0)
    ol.planning([0.015])
    assert serve(300.0, 1.0) == 0  # five stationary minutes
    assert serve(60.0, 1.5) >= 1  # the delays grow by half (p99 ≈ 16 → 24 ms): found


def test_bad_pairs_are_left_out_and_never_raise():
    ol = OutsideLearner()
    ol.observe(None, [1.0], [2.0], positions=False)  # no rate yet
    ol.observe(0.5, [1.0, 2.0], [2.0], positions=True)  # sizes differ
    ol.observe(0.5, ["x"], [2.0], positions=False)
    ol.observe(math.inf, [1.0], [2.0], positions=False)
    ol.observe(0.5, [1.0, math.nan, 3.0], [2.0, 5.0, 1e9], positions=True)  # one kept; the gap breaks positions
    assert ol.pairs == 1 and ol.batches == 0 and ol.rejected == 7
    for _ in range(BIN_SIZE + 10):  # the ring keeps the latest BIN_SIZE
        ol.observe(0.5, [0.0], [1.0], positions=False)
    assert ol.points()[0][1].size == BIN_SIZE


def test_the_autopilot_re_plans_when_the_learned_outside_delay_moves_and_not_when_told_not_to_learn(caplog):
    """... and each swap's event says what the plan drew: l̂(b) and the outside p99 at λ̂ (a real run's failure
    could not be told apart without them: a slowdown found late, or the delays of a slow minute)."""
    from smdp_batch.autopilot.report import event_fields

    caplog.set_level("INFO", logger="smdp_batch")
    for learn in (True, False):
        solver = FakeSolver()
        ap, p = make(solver, learn_outside=learn)
        t = 0.0
        rng = np.random.default_rng(3)
        for _ in range(400):
            t += rng.exponential(1.0 / p.lam)
            ap.observe_arrival(t)
        assert ap.metrics.solves == 0 and math.isnan(ap.metrics.outside_p99_ms)
        for _ in range(MIN_BATCHES + 10):  # (a bin fills at MIN_SAMPLES pairs; r is fitted from MIN_BATCHES batches)
            batch = rng.uniform(5.0, 20.0, 10)
            ap.observe_served(batch + 6.0 + np.arange(10) * 0.5, batch_ms=batch)  # 6 ms + 0.5 ms per position
        ap.observe_arrival(t + 1.0)  # the next hook starts the re-solve
        assert ap.join(10) and (ap.metrics.solves >= 1) == learn
        if learn:
            assert solver.calls and ap.metrics.last_event in ("swap", "kept")
            assert ap.metrics.outside_p99_ms == pytest.approx(6.0, abs=0.2)
            assert ap.metrics.outside_return_ms == pytest.approx(0.5)
            swaps = [e for r in caplog.records if (e := event_fields(r.getMessage())) and e["event"] == "swap"]
            assert swaps and swaps[-1]["latency_ms"] == pytest.approx(list(solver.calls[-1][0].latency_ms()), abs=1e-3)
            assert swaps[-1]["outside_p99_ms"] == pytest.approx(6.0, abs=0.2)
        else:
            assert math.isnan(ap.metrics.outside_p99_ms)


def test_on_the_simulated_clock_a_front_end_that_slows_with_load_is_planned_with():
    """The server's outside delay grows with load (p99 6.7 ms at λ0, 22 ms at 3·λ0).  Planning with it, the
    Autopilot's plans carry it (the live plan's planned p99 is the served one) and every phase holds 1 %."""
    p = BatchingProblem.basic(rho=0.2)
    lam, rng = p.lam, np.random.default_rng(0)
    true = ServedDelay(0.0, 0.0, 0.0, (lam * 1e3, 2 * lam * 1e3, 3 * lam * 1e3),
                       tuple(m + rng.exponential(s, 5000) for m, s in ((2, 1), (5, 2), (9, 3))))
    clock = SimClock()
    ap = Autopilot(p, SLO, clock=clock, solve_in="clock", energy_meter=None, min_interval_s=2.0)
    run = simulate(ap, p, [Phase(15.0, lam), Phase(15.0, 3 * lam), Phase(15.0, 2 * lam)], seed=1, clock=clock,
                   served=True, outside_ms=true)
    rows = run.summary(SLO)
    assert all(r["over_slo"] <= 0.01 for r in rows), rows
    m = ap.metrics
    assert m.outside_p99_ms == pytest.approx(float(np.percentile(true.outside_ms[1], 99)), rel=0.2)
    assert m.outside_return_ms == pytest.approx(0.0, abs=0.05)  # this server returns a batch at once
    assert any(e["event"] == "swap" and e["reason"] == "outside" for e in run.events)
    assert m.planned_p99_ms > 25.0  # the plan's p99 is the served one: its batcher's part alone is ≤ the timer + l(b)


def test_only_a_hook_that_takes_the_batcher_view_is_told_it():
    from smdp_batch.autopilot.hooks import served_hook
    from smdp_batch.runtime import PolicyTable

    ap, p = make(FakeSolver())
    tell, pairs = served_hook(ap)
    assert pairs and served_hook(object()) == (None, False)
    tell([30.0, 31.0], batch_ms=[10.0, 11.0])  # one batch's pair reaches the learner (no λ̂ yet: left out there);
    tell(30.0)  # a time alone is a response only
    assert ap._outside.pairs + ap._outside.rejected == 2 and ap._seen == 3

    class Told(PolicyTable):  # a policy of the user's whose hook takes end-to-end times alone
        def observe_served(self, ms):
            self.seen = getattr(self, "seen", 0) + np.size(ms)

    table = Told(np.minimum(np.arange(64), 8), p.batch_sizes)
    told, pairs = served_hook(table)
    assert pairs is False
    told([5.0, 6.0], batch_ms=[1.0, 2.0])  # the batcher's view is dropped for a one-argument hook
    assert table.seen == 2
    table.seen = 0
    run = simulate(table, p, [Phase(2.0, p.lam)], served=True, outside_ms=3.0)
    assert table.seen == run.response_ms.size > 0
