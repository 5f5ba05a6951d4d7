"""The energy meter: batch power from a cumulative counter that moves in 100 ms steps (as NVML's did on an
H200), checked against the true powers of a simulated GPU and against a plain least-squares fit."""

import math

import numpy as np
import pytest

from smdp_batch.autopilot.energy_meter import EnergyMeter, PowerRegression, open_meter
from smdp_batch.autopilot.plan import Job

SIZES = (1, 2, 4, 8)
IDLE_W = 80.0
TRUE_W = {1: 150.0, 2: 190.0, 4: 260.0, 8: 400.0}  # board power while running a batch of b (W)
L_MS = {1: 3.0, 2: 3.5, 4: 5.0, 8: 8.0}


TICK = 0.0005  # s: the simulation's time step; the meter reads every 10 ticks (5 ms)


class _Gpu:
    """A simulated board: power IDLE_W, or TRUE_W[b] while a batch runs; the counter (mJ) is the true
    energy at its latest refresh, refreshed every 100 ms ± 20 ms."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.ticks = 0
        self.energy = 0.0  # J, true
        self.counter = 0.0  # mJ, as read
        self.next_refresh = 200

    @property
    def t(self) -> float:
        return self.ticks * TICK

    def advance(self, seconds: float, watts: float, meter: EnergyMeter) -> float:
        """Run ``seconds`` (rounded to ticks, at least one) at ``watts``; the time actually run (s)."""
        n = max(1, round(seconds / TICK))
        for _ in range(n):
            self.ticks += 1
            self.energy += watts * TICK
            if self.ticks >= self.next_refresh:
                self.counter = self.energy * 1e3
                self.next_refresh += int(self.rng.integers(160, 241))
            if self.ticks % 10 == 0:
                meter.sample()
        return n * TICK


def _run(seconds: float, sizes=SIZES, seed=0, model_w=None, overlap=False):
    gpu = _Gpu(seed)
    model_w = [TRUE_W[b] for b in SIZES] if model_w is None else model_w
    meter = EnergyMeter(lambda: gpu.counter, SIZES, model_w, thread=False, clock=lambda: gpu.t)
    rng = np.random.default_rng(seed + 1)
    while gpu.t < seconds:
        gpu.advance(rng.exponential(0.004), IDLE_W, meter)
        b = int(rng.choice(sizes))
        d = gpu.advance(L_MS[b] / 1e3 * rng.uniform(0.8, 1.2), TRUE_W[b], meter)
        meter.batch(b, d)
        if overlap and rng.random() < 0.3:  # a second batch reported over the same time
            meter.batch(b, d)
    return meter


def test_the_powers_are_recovered_from_a_counter_that_moves_in_100_ms_steps():
    meter = _run(60.0, model_w=[0.5 * TRUE_W[b] for b in SIZES])  # a model off by 2×
    idle, p = meter.power_w()
    assert meter.intervals > 500 and meter.overlapping == 0 and meter.errors == 0
    assert idle == pytest.approx(IDLE_W, rel=0.02)
    # within 4 %: each refresh time is known to ± half the 5 ms between reads, and the fit forgets all
    # but its latest ≈ 600 intervals (1.0-2.6 % measured on three seeds, at 60 s and at 240 s alike)
    assert p == pytest.approx([TRUE_W[b] for b in SIZES], rel=0.04)
    zeta = meter.energy_mj([L_MS[b] for b in SIZES])  # W × ms = mJ
    assert zeta == pytest.approx([TRUE_W[b] * L_MS[b] for b in SIZES], rel=0.04)


def test_a_size_never_run_follows_the_measured_scale_of_the_model():
    """The model is right in shape, 10× low in scale; size 8 never runs: ŝ·m_8 carries it."""
    meter = _run(60.0, sizes=(1, 2, 4), model_w=[TRUE_W[b] / 10 for b in SIZES])
    _, p = meter.power_w()
    assert p[-1] == pytest.approx(TRUE_W[8], rel=0.05)


def test_the_regression_is_plain_least_squares_when_the_prior_is_negligible():
    """A second algorithm: numpy's lstsq on the same rows (idle, busy per size) → (p₀, p_b)."""
    rng = np.random.default_rng(3)
    model = np.array([TRUE_W[b] for b in SIZES]) * 0.7
    reg = PowerRegression(model, prior_s=1e-9, memory=10**9)
    rows, ys = [], []
    for _ in range(300):
        busy = rng.uniform(0, 0.025, len(SIZES)) * (rng.random(len(SIZES)) < 0.6)
        idle = 0.1 - busy.sum()
        y = IDLE_W * idle + busy @ np.array([TRUE_W[b] for b in SIZES]) + rng.normal(0, 0.5)
        reg.add(idle, busy, y)
        rows.append(np.concatenate([[idle], busy]))
        ys.append(y)
    direct = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)[0]
    idle_w, p = reg.power_w()
    assert idle_w == pytest.approx(direct[0], rel=1e-7) and p == pytest.approx(direct[1:], rel=1e-7)


def test_overlapping_batches_are_not_fitted_and_bad_inputs_are_ignored():
    meter = _run(10.0, overlap=True)
    assert meter.overlapping > 0
    assert meter.intervals + meter.overlapping >= 90  # every interval either fitted or counted
    before = len(meter._batches)
    for b, s in ((3, 0.01), (True, 0.01), ("2", 0.01), (2, math.nan), (2, -1.0), (2, "x"), (2, 1e9)):
        meter.batch(b, s)
    assert len(meter._batches) == before


def test_read_errors_a_counter_reset_and_too_few_intervals():
    values = iter([5.0, 5.0, math.nan, None, 2.0, 9.0])  # None: the read raises; 5 → 2: a driver reload
    t = [0.0]

    def read():
        v = next(values)
        if v is None:
            raise OSError("NVML went away")
        return v

    meter = EnergyMeter(read, SIZES, [TRUE_W[b] for b in SIZES], thread=False, clock=lambda: t[0])
    for _ in range(6):
        t[0] += 0.05
        meter.sample()
    assert meter.errors == 2  # the NaN and the exception
    assert meter.power_w() is None and meter.energy_mj([1, 2, 3, 4]) is None  # before min_intervals
    # the drop 5 → 2 restarted the chain at the new counter's first refresh: no interval spans the reload
    assert list(meter._pending) == [(pytest.approx(0.175), pytest.approx(0.275), 7.0)]


def test_open_meter_specs():
    from smdp_batch.model.problem import BatchingProblem

    prob = BatchingProblem.basic()
    assert open_meter(None, prob.batch_sizes, prob) is None
    m = EnergyMeter(lambda: 0.0, prob.batch_sizes, prob.energy_mj() / prob.latency_ms(), thread=False)
    assert open_meter(m, prob.batch_sizes, prob) is m
    for bad in ("nvml", object(), 3):
        with pytest.raises(ValueError, match="energy_meter"):
            open_meter(bad, prob.batch_sizes, prob)


def test_the_autopilot_plans_with_the_metered_energy():
    """A meter that has fitted its intervals gives ζ̂(b) = p̂_b·l̂(b) to the metrics and to the re-solve."""
    from smdp_batch.model.problem import BatchingProblem
    from smdp_batch.runtime import PolicyTable
    from smdp_batch.autopilot import Autopilot, Plan

    prob = BatchingProblem.basic()
    sizes = prob.batch_sizes

    class Meter:
        name = "test counter"

        def __init__(self):
            self.seen = []

        def batch(self, b, s):
            self.seen.append((b, s))

        def power_w(self):
            return 50.0, np.full(len(sizes), 300.0)

        def energy_mj(self, latency_ms):
            return self.power_w()[1] * np.asarray(latency_ms)

        def close(self):
            self.closed = True

    meter = Meter()
    start = Plan(PolicyTable(np.minimum(np.arange(64), max(sizes)), sizes), prob.lam, None, 5.0, 10.0, 20.0)
    ap = Autopilot(prob, 50.0, start, solver=lambda *a: None, energy_meter=meter)
    ap.observe_batch(4, 0.002)
    ap.observe_batch(4, math.nan, ok=False)
    assert meter.seen == [(4, 0.002)]  # only batches that ran
    m = ap.metrics
    assert m.energy_source == "test counter" and m.idle_power_w == 50.0
    assert m.energy_hat_mj == pytest.approx(300.0 * np.array(m.latency_hat_ms))
    lat = np.array(m.latency_hat_ms)
    solved = Job(0.0, "energy", lat, [prob.lam], 50.0, ap._energy_hat(lat)).problem(prob)  # as _start makes it
    assert solved.energy_mj() == pytest.approx(300.0 * np.array(m.latency_hat_ms))
    ap.close()
    assert meter.closed
    plain = Autopilot(prob, 50.0, start, solver=lambda *a: None)  # no GPU here: "auto" finds no counter
    assert plain.meter is None and plain.metrics.energy_source == "model"
    assert math.isnan(plain.metrics.idle_power_w)


def test_a_metered_energy_that_leaves_the_curve_of_the_last_solve_triggers_a_re_solve():
    """The model says ≈ 22 W while running a batch; the meter measures 300 W: after 64 metered batches the
    Autopilot re-solves with ζ̂(b) = 300 W × l̂(b), and the new curve is then the reference (no second solve)."""
    from smdp_batch.model.problem import BatchingProblem
    from smdp_batch.runtime import PolicyTable
    from smdp_batch.autopilot import Autopilot, Plan

    prob = BatchingProblem.basic(rho=0.3)
    sizes = prob.batch_sizes
    calls = []

    class Meter:
        name = "test counter"
        ready = False

        def batch(self, b, s):
            pass

        def power_w(self):
            return (50.0, np.full(len(sizes), 300.0)) if self.ready else None

        def energy_mj(self, latency_ms):
            p = self.power_w()
            return None if p is None else p[1] * np.asarray(latency_ms)

        def close(self):
            pass

    def solver(problem, slo_ms, lams):
        calls.append(problem.energy_mj())
        return Plan(PolicyTable(np.minimum(np.arange(64), max(sizes)), sizes), lams[0], None, 5.0, 10.0, 20.0,
                    True, "greedy")

    meter = Meter()
    start = Plan(PolicyTable(np.minimum(np.arange(64), max(sizes)), sizes), prob.lam, None, 5.0, 10.0, 20.0)
    ap = Autopilot(prob, 50.0, start, solver=solver, energy_meter=meter, min_interval_s=0.0, rate_tol=10.0)
    t = 0.0
    for _ in range(100):  # a rate estimate to solve at
        t += 1.0 / prob.lam
        ap.observe_arrival(t)
    l4 = float(prob.latency_ms()[3]) / 1e3
    for _ in range(128):  # the meter not ready: nothing moves
        ap.observe_batch(4, l4)
    assert not calls and ap.metrics.solves == 0
    meter.ready = True
    for _ in range(64):
        ap.observe_batch(4, l4)
    ap.join(10)
    assert len(calls) == 1 and ap.metrics.solves == 1
    assert calls[0] == pytest.approx(300.0 * np.asarray(ap.metrics.latency_hat_ms))
    for _ in range(256):  # the reference is now the metered curve
        ap.observe_batch(4, l4)
    ap.join(10)
    assert len(calls) == 1
