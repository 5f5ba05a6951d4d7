"""The served-delay model: what a real server adds, measured (calibrate), and planned with (simulate, optimise).

Each figure is checked against an independent computation: a constant outside delay shifts every percentile by
itself; a per-batch time on a deterministic law is the same as a longer l(b); the fit recovers the parts of a
synthetic server built from known ones, and the plan with the fitted model reproduces that server's p99.
"""

import json
import math
import os

import numpy as np
import pytest

from smdp_batch.analysis.served import CalibrationRun, fit_served, p99_halfwidth
from smdp_batch.analysis.simulate import poisson_arrivals, response_times, simulate
from smdp_batch.analysis.slo import SLO, optimise
from smdp_batch.baselines.servers import parse_rule
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.model.served import ServedDelay

STANDIN = dict(batch_sizes=range(1, 17), latency="affine:0.5,2", service="det")
ONNX_PROFILE = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "data", "onnx_mlp_cpu.csv")


def _sd(a=0.0, c=0.0, r=0.0, outside=(0.0,), loads=(100.0,), **kw):
    return ServedDelay(a, c, r, tuple(loads), tuple(np.atleast_1d(np.asarray(o, dtype=float)) for o in outside), **kw)


# ------------------------------------------------------------------------------------------- the model
def test_a_constant_outside_delay_shifts_every_percentile_by_itself():
    p = BatchingProblem.basic(rho=0.5)
    rule = parse_rule("triton:max=32,delay_us=5000", p)
    bare = simulate(p, rule, requests=20_000, seed=3)
    zero = simulate(p, rule, requests=20_000, seed=3, served=_sd())
    two = simulate(p, rule, requests=20_000, seed=3, served=_sd(outside=[np.full(50, 2.0)]))
    assert zero.percentiles == bare.percentiles and zero.mean_latency_ms == bare.mean_latency_ms
    for k, v in bare.percentiles.items():
        assert two.percentiles[k] == pytest.approx(v + 2.0, abs=1e-9)
    assert two.mean_latency_ms == pytest.approx(bare.mean_latency_ms + 2.0, abs=1e-9)
    assert two.mean_power_w == bare.mean_power_w  # the outside delay holds no instance


def test_a_stream_drawn_at_a_calibrated_load_draws_that_loads_delay_though_its_own_rate_runs_a_little_high():
    """The SLO search simulates samples drawn at each load (``tail="continue"``): a stream whose own rate ran 1 %
    above a calibrated load drew the next load's outside delay (a plan at 15/s drew the 26/s delays about half the
    time).  A given trace (``tail="end"``) keeps its own rate."""
    p = BatchingProblem(lam=0.1, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=0", p)
    sd = _sd(outside=[np.full(50, 1.0), np.full(50, 30.0)], loads=(100.0, 200.0))
    arr = poisson_arrivals(0.1, 5000, np.random.default_rng(0))
    arr = arr * ((arr.size - 1) / (arr[-1] - arr[0]) / 0.101)  # its own rate 1 % above the problem's
    bare = simulate(p, rule, arrivals=arr, seed=1, tail="continue").mean_latency_ms
    sample = simulate(p, rule, arrivals=arr, seed=1, tail="continue", served=sd).mean_latency_ms
    trace = simulate(p, rule, arrivals=arr, seed=1, tail="end", served=sd).mean_latency_ms
    assert sample == pytest.approx(bare + 1.0, abs=0.05) and trace > bare + 29.0


def test_a_per_batch_time_is_a_longer_batch_on_a_deterministic_law():
    p = BatchingProblem(lam=0.6, **STANDIN)
    longer = p.replace(latency="affine:0.6,2.8")  # l(b) + 0.8 + 0.1·b
    rule = parse_rule("triton:max=16,delay_us=4000,preferred=4/5/6/7/8/9/10/11/12/13/14/15/16", p)
    a = simulate(p, rule, requests=20_000, seed=1, served=_sd(a=0.8, c=0.1))
    b = simulate(longer, rule, requests=20_000, seed=1)
    assert a.percentiles == pytest.approx(b.percentiles, abs=1e-9)
    assert a.mean_batch_size == pytest.approx(b.mean_batch_size)
    assert a.mean_power_w == pytest.approx(b.mean_power_w)  # ζ(b) per batch: the same batches


def test_a_per_batch_time_shifts_random_batch_times_exactly():
    """Exponential batch times: with one request per batch at a light load, the mean response is l(1) + a (the
    draw's shape is not scaled up by a)."""
    p = BatchingProblem(lam=0.002, batch_sizes=[1], latency="table:1=4", service="exp")
    arr = poisson_arrivals(p.lam, 20_000, np.random.default_rng(0))
    rule = parse_rule("static:1", p)
    base = response_times(p, rule, arr, seed=2)
    shifted = response_times(p, rule, arr, seed=2, per_batch=lambda s: 3.0)
    d = shifted - base
    # the same draws, each 3 ms longer: exactly 3 for a request that found the server idle both times (nearly all)
    assert np.mean(np.abs(d - 3.0) < 1e-9) > 0.95
    assert np.mean(d) == pytest.approx(3.0, abs=0.05)


def test_the_return_of_each_position_adds_k_r_within_a_batch():
    p = BatchingProblem(lam=0.5, batch_sizes=[4], latency="table:4=3", service="det")
    arr = np.arange(1, 4001, dtype=float) * 2.0  # one request every 2 ms: batches of 4 every 8 ms
    bare = response_times(p, parse_rule("static:4", p), arr)
    sd = _sd(r=0.25, loads=(500.0,))
    resp = bare.copy()
    sd.add_to(arr, resp, 0.5, seed=0)
    k = np.arange(arr.size) % 4
    assert np.allclose(resp - bare, 0.25 * k)


def test_the_plan_draws_from_the_nearest_calibrated_load_at_or_above():
    sd = _sd(outside=[np.full(9, 1.0), np.full(9, 2.0), np.full(9, 3.0)], loads=(100.0, 200.0, 300.0))
    assert [float(sd.outside_at(x / 1e3)[0]) for x in (50, 100, 150, 200, 250, 300, 900)] == [1, 1, 2, 2, 3, 3, 3]


def test_its_sample_widens_the_interval_of_a_served_percentile():
    p = BatchingProblem.basic(rho=0.5)
    rule = parse_rule("triton:max=32,delay_us=5000", p)
    o = np.random.default_rng(0).exponential(1.0, 300)
    few = simulate(p, rule, requests=20_000, seed=3, served=_sd(outside=[o]))
    many = simulate(p, rule, requests=20_000, seed=3, served=_sd(outside=[np.tile(o, 100)]))
    assert few.percentile_ci["p99_ms"] > many.percentile_ci["p99_ms"] + 0.5
    assert few.percentile_ci["p99_ms"] > _sd(outside=[o]).halfwidth(p.lam, 99) * 0.99


def test_a_round_trip_through_its_file(tmp_path):
    sd = _sd(0.5, 0.05, 0.1, [np.arange(5.0), np.arange(6.0)], (100.0, 300.0), carried_per_s=300.0,
             served_latency_ms={1: 2.5}, idle_power_w=30.0, stats=({"load_per_s": 100.0}, {"load_per_s": 300.0}),
             source={"server": "triton"})
    path = tmp_path / "s.json"
    sd.save(str(path))
    back = ServedDelay.load(str(path))
    assert back.as_dict() == sd.as_dict()


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(format="x"), "not a served-delay file"),
    (lambda d: d.update(version=9), "version 9"),
    (lambda d: d.pop("a_ms"), "a_ms is missing"),
    (lambda d: d.update(a_ms=float("nan")), "a must be a number"),
    (lambda d: d.update(return_ms=-1), "return per position"),
    (lambda d: d.update(loads_per_s=[300.0, 100.0]), "increasing"),
    (lambda d: d.update(outside_ms=[[1.0]]), "one outside-delay sample per calibrated load"),
    (lambda d: d.update(outside_ms=[[1.0], ["x"]]), "served-delay file"),
    (lambda d: d.update(outside_ms=[[1.0], [1e9]]), "finite ms"),
    (lambda d: d.update(a_ms=0.0, c_ms=-1.0), r"a \+ c·b must be ≥ 0"),
    (lambda d: d.update(stats=[{"new_run_share": 50.0}, {}]), r"new run's share at 100 req/s .* got 50.0"),
    (lambda d: d.update(stats=[{}, {"new_run_share": "wide"}]), r"new run's share at 300 req/s .* got 'wide'"),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, change, words):
    d = _sd(outside=[[1.0], [2.0]], loads=(100.0, 300.0)).as_dict()
    change(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match=words):
        ServedDelay.load(str(path))


def test_a_file_that_is_not_json_or_not_there(tmp_path):
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(InputError, match="not readable JSON"):
        ServedDelay.load(str(tmp_path / "x.json"))
    with pytest.raises(InputError, match="does not exist"):
        ServedDelay.load(str(tmp_path / "none.json"))


# ------------------------------------------------------------------------------------------- the fit
def _synthetic_run(problem, rule, lam_per_s, seed, *, a=0.0, r=0.0, inbound=0.4, outside=None, drop=0, hop=None):
    """A server built from known parts: the simulator's batches with a per-batch time a, every response k·r after
    the first of its batch, a constant ``inbound`` to the batcher and an outside draw on the way back.  ``hop``
    (a draw of ms per request): the server says when each request reached it (as Ray Serve's replica does), and
    its batcher takes that much more to queue each one."""
    rng = np.random.default_rng(seed)
    sent = poisson_arrivals(lam_per_s / 1e3, 3000, rng)
    sent -= sent[0]
    queued = sent + inbound + (0.0 if hop is None else hop(rng, sent.size))
    order = np.argsort(queued, kind="stable")  # the batcher serves in the order requests queued (FIFO)
    end = np.empty(sent.size)
    end[order] = queued[order] + response_times(problem.replace(lam=lam_per_s / 1e3), rule, queued[order], seed,
                                                lambda s: a)
    first = np.concatenate(([True], np.abs(np.diff(end[order])) > 1e-9))
    batch_of, pos = np.empty(sent.size, dtype=np.int64), np.empty(sent.size, dtype=np.int64)
    batch_of[order] = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    pos[order] = np.arange(sent.size) - starts[batch_of[order]]
    sizes = np.bincount(batch_of)
    lat = dict(zip(problem.batch_sizes, problem.latency_ms()))
    batches = {k: (int(b), int(b)) for k, b in enumerate(sizes)}
    times = {k: (float(end[order[starts[k]]] - lat[int(b)]), float(end[order[starts[k]]])) for k, b in enumerate(sizes)}
    back = outside(rng, sent.size) if outside is not None else np.full(sent.size, 1.0)
    latency = end + r * pos + back - sent
    if drop:
        latency[-drop:] = np.nan
    return CalibrationRun(lam_per_s, sent, latency, batch_of, pos, batches, times, np.zeros(sent.size),
                          entered_ms=None if hop is None else sent + inbound)


def test_the_fit_recovers_a_synthetic_server_and_the_plan_reproduces_its_p99():
    p = BatchingProblem(lam=0.3, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=8000,preferred=6/7/8/9/10/11/12/13/14/15/16", p)
    back = lambda rng, n: 1.0 + rng.exponential(0.8, n)  # noqa: E731
    runs = [_synthetic_run(p, rule, x, i, r=0.3, outside=back) for i, x in enumerate((100.0, 200.0, 400.0))]
    sd = fit_served(p, rule, runs, slo_ms=25.0)
    assert sd.return_ms == pytest.approx(0.3, rel=0.1)
    assert sd.carried_per_s == 400.0 and all(s["carried"] for s in sd.stats)
    for o, st in zip(sd.outside_ms, sd.stats):
        truth = 0.4 + 1.0 + np.random.default_rng(9).exponential(0.8, 200_000)  # inbound + the return leg
        assert np.percentile(o, 50) == pytest.approx(np.percentile(truth, 50), rel=0.08)
        assert np.percentile(o, 99) == pytest.approx(np.percentile(truth, 99), rel=0.15)
        assert st["to_batcher_ms"] == pytest.approx(0.4, abs=0.05)
    for run in runs:  # the plan with the fitted model against the synthetic server's own p99
        planned = simulate(p.replace(lam=run.lam_per_s / 1e3), rule, requests=100_000, seed=5, served=sd)
        assert planned.percentiles["p99_ms"] == pytest.approx(np.percentile(run.latency_ms, 99), rel=0.05)


def _bursts(problem, maxb: int, a: float, bursts: int = 6, unanswered: int = 0) -> CalibrationRun:
    """A probe as the calibration sends it: bursts of 3·maxb requests at once, served as full batches back to back,
    a ms apart (the instance's own time between them), each answered 1 ms after its batch ends."""
    lat = dict(zip(problem.batch_sizes, problem.latency_ms()))[maxb]
    sent, latency, batch_of, pos, batches, times = [], [], [], [], {}, {}
    for j in range(bursts):
        t = 200.0 * j
        start = t + 0.5
        for k in range(3):
            key = 3 * j + k
            times[key], batches[key] = (start, start + lat), (maxb, maxb)
            for i in range(maxb):
                sent.append(t)
                latency.append(start + lat + 1.0 - t)
                batch_of.append(key)
                pos.append(i)
            start += lat + a
    latency = np.asarray(latency)
    if unanswered:
        latency[-unanswered:] = np.nan
    return CalibrationRun(0.0, np.asarray(sent), latency, np.asarray(batch_of), np.asarray(pos), batches, times,
                          np.zeros(len(sent)), probe=True)


def test_bursts_measure_the_time_between_batches_that_a_light_load_never_shows():
    """At 50 req/s with an 8 ms delay no batch is ever waiting when the one before ends: a + c·b goes unmeasured
    (and a plan for a busier setting would leave it out).  The bursts' full batches, back to back, measure it; they
    are not a load: the loads, their verdicts and the spread are the light run's alone."""
    from smdp_batch.model.served import PER_BATCH_MIN_PAIRS

    p = BatchingProblem(lam=0.3, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=8000", p)
    light = _synthetic_run(p, rule, 50.0, 0, a=1.2)
    alone = fit_served(p, rule, [light], slo_ms=25.0)
    assert alone.source["per_batch_pairs"] < PER_BATCH_MIN_PAIRS and alone.a_ms == alone.c_ms == 0.0
    assert "per batch not measured" in alone.summary()
    sd = fit_served(p, rule, [light, _bursts(p, 16, 1.2)], slo_ms=25.0)
    assert sd.a_ms == pytest.approx(1.2) and sd.c_ms == 0.0
    assert sd.source["per_batch_pairs"] >= 12 and sd.source["per_batch_sizes"] == [16]
    assert "per batch 1.2 ms (measured at b = 16 only: taken at every size)" in sd.summary()
    assert sd.loads_per_s == alone.loads_per_s == (50.0,) and len(sd.stats) == 1
    assert sd.stats[0]["carried"] and sd.carried_per_s == 50.0
    void = fit_served(p, rule, [light, _bursts(p, 16, 1.2, unanswered=3)], slo_ms=25.0)
    assert void.a_ms == 0.0 and void.source["per_batch_pairs"] == alone.source["per_batch_pairs"]
    with pytest.raises(InputError, match="no runs at a load"):
        fit_served(p, rule, [_bursts(p, 16, 1.2)])


def test_the_bursts_drain_before_the_next_and_are_sent_at_once():
    from smdp_batch.integrations.calibrate import PROBE_BURSTS, burst_arrivals

    t = burst_arrivals(16, 8.0, 10.0)
    starts = np.unique(t)
    assert t.size == PROBE_BURSTS * 48 and starts.size == PROBE_BURSTS
    assert np.all(np.diff(starts) == 2 * (3 * 10.0 + 8.0) + 50.0)
    assert np.all(np.bincount(np.searchsorted(starts, t)) == 48)


def _recorded_ray_run():
    """A real calibration run: Ray Serve's @serve.batch with the ONNX MLP on the CPU, 2 000 Poisson requests at
    86.6 req/s at real speed on a shared 2-core host (``calibrate(..., server="ray")``), its setting."""
    d = np.load(os.path.join(os.path.dirname(__file__), "data", "ray_onnx_calibration_87rps.npz"))
    bk = d["batches"]
    run = CalibrationRun(float(d["load_per_s"]), d["sent_ms"], d["latency_ms"], d["batch_of"].astype(np.int64),
                         d["position"].astype(np.int64), {int(k): (int(n), int(b)) for k, n, b, _, _ in bk},
                         {int(k): (float(t0), float(t1)) for k, _, _, t0, t1 in bk}, d["lag_ms"],
                         entered_ms=d["entered_ms"])
    return run, str(d["setting"])


def test_a_tail_in_the_batchers_own_hops_is_planned_for_not_read_as_a_host_that_does_not_keep_up():
    # Ray Serve's replica says when each request reached it; its queue and event loop then take a little more,
    # now and then much more (here a mean of 0.4 ms, a p99 of 6 ms): the server's own time, part of the plan.
    # The load was carried (p99 21.8 ms against a 60 ms SLO, no growing queue, the client kept up); a test on
    # the batcher's p99 (above 1.15x the rule's + 1 ms) refused it, and with it every load of the range.
    run, setting = _recorded_ray_run()
    p = BatchingProblem(lam=0.1, batch_sizes="1,2,4,8,16,32", latency=f"csv:{ONNX_PROFILE}",
                        energy=f"csv:{ONNX_PROFILE}")
    rule = parse_rule(setting, p)
    sd = fit_served(p, rule, [run], slo_ms=60.0)
    st = sd.stats[0]
    assert st["carried"] and sd.carried_per_s == run.lam_per_s, st["why"]
    assert st["batcher_p99_ms"] > 1.15 * st["batcher_model_p99_ms"] + 1.0  # what the p99 test refused
    assert 0.2 < st["to_batcher_ms"] < 1.0  # the hops' mean, in the outside delay
    planned = simulate(sd.apply(p).replace(lam=run.lam_per_s / 1e3), rule, requests=50_000, seed=5, served=sd)
    assert planned.percentiles["p99_ms"] == pytest.approx(st["p99_ms"], rel=0.1)
    assert 0 < st["p99_halfwidth_ms"] < 0.5 * st["p99_ms"]


def test_a_batcher_slower_than_its_rule_on_average_is_a_host_that_does_not_keep_up():
    # the server's timer fires 10 ms late (an event loop that cannot keep up): the rule's batches form later
    p = BatchingProblem(lam=0.3, **STANDIN)
    told, ran = parse_rule("ray:max=16,timeout_s=0.005", p), parse_rule("ray:max=16,timeout_s=0.015", p)
    run = _synthetic_run(p, ran, 100.0, 0, inbound=1.0, hop=lambda rng, n: np.zeros(n))
    sd = fit_served(p, told, [run], slo_ms=40.0)
    assert sd.carried_per_s == 0.0 and "the host does not keep up" in sd.stats[0]["why"]


def test_a_runs_p99_interval_is_the_order_statistics_one_and_wider_for_a_stall_than_for_scattered_delays():
    rng = np.random.default_rng(1)
    x = rng.exponential(1.0, 2000)
    # iid Exp(1): the sample p99's sd is sqrt(p (1 - p) / n) / f(q) = 0.22, a 95 % half-width of 0.44
    assert 0.3 < p99_halfwidth(x) < 0.8
    stall, scattered = x.copy(), x.copy()
    stall[1000:1015] += 50.0  # one stall of the host delays a run of consecutive requests together
    scattered[rng.choice(2000, 15, replace=False)] += 50.0
    assert p99_halfwidth(stall) > 1.5 * p99_halfwidth(scattered)
    assert math.isnan(p99_halfwidth(x[:10]))


def _at_8ms():
    """The stand-in under Triton's 8 ms delay (max 16), and a return leg of 1 ms + Exp(0.8 ms) per response."""
    p = BatchingProblem(lam=0.3, **STANDIN)
    return p, parse_rule("triton:max=16,delay_us=8000", p), (lambda rng, n: 1.0 + rng.exponential(0.8, n))


def test_runs_repeated_at_a_load_are_pooled_and_their_spread_between_runs_widens_the_plan():
    p, rule, back = _at_8ms()
    runs = []
    for i, x in enumerate((100.0, 200.0)):
        calm = _synthetic_run(p, rule, x, 10 + i, outside=back)
        stalled = _synthetic_run(p, rule, x, 20 + i, outside=back)
        stalled.latency_ms[1500:1560] += 15.0  # the host stalled 60 consecutive requests in the second run
        runs += [calm, stalled]
    one = fit_served(p, rule, runs[:1])
    sd = fit_served(p, rule, runs, slo_ms=40.0)
    assert sd.loads_per_s == (100.0, 200.0) and sd.source["runs_per_load"] == 2
    for k, st in enumerate(sd.stats):
        assert st["runs"] == 2 and st["requests"] == 6000 and len(st["p99_runs_ms"]) == 2
        assert st["p99_runs_ms"][1] > st["p99_runs_ms"][0] + 5.0
        single = [fit_served(p, rule, [r]).stats[0]["tail_gap_ms"] for r in runs[2 * k:2 * k + 2]]
        assert st["tail_gap_ms"] == pytest.approx(np.mean(single), abs=0.3)  # the shortfalls' mean
        # a new run may land as far as the two runs were apart, not only as far as one run's requests say
        assert st["new_run_halfwidth_ms"] > 3 * one.stats[0]["new_run_halfwidth_ms"]
    res = simulate(p.replace(lam=0.1), rule, requests=20_000, seed=1, served=sd)
    assert res.percentile_ci["p99_ms"] >= sd.stats[0]["new_run_share"] * res.percentiles["p99_ms"]  # of itself


def test_one_run_a_stall_caught_does_not_set_the_spread_between_runs_at_every_load():
    p, rule, back = _at_8ms()
    runs = [_synthetic_run(p, rule, x, 10 * k + i, outside=back) for i, x in enumerate((100.0, 150.0, 200.0))
            for k in (1, 2)]
    runs[-1].latency_ms[1500:1560] += 15.0
    sd = fit_served(p, rule, runs)
    hw = [st["new_run_halfwidth_ms"] for st in sd.stats]
    # a standard deviation pooled over the loads would carry the stall to all three (t, 3 degrees of freedom: 15 ms)
    assert max(hw) < 2.0, hw
    assert sd.stats[2]["p99_runs_ms"][1] > sd.stats[2]["p99_runs_ms"][0] + 5.0


def test_a_load_the_server_did_not_carry_sets_neither_the_spread_nor_the_per_batch_time():
    """Runs whose queue grew (the host fell behind: each at its own pace) are refused at their load; their runs'
    distance from each other is not how far a new run lands at a load that carried, and the gaps between their
    batches are their stalls, not the instance's own time (measured on a slow host: ± 570 % and 50 ms per batch)."""
    p, rule, back = _at_8ms()
    calm = [_synthetic_run(p, rule, 100.0, k, outside=back) for k in (1, 2)]
    alone = fit_served(p, rule, calm, slo_ms=40.0)
    jammed = [_synthetic_run(p, rule, 200.0, k, outside=back) for k in (3, 4)]
    for k, run in enumerate(jammed):  # a queue growing at its own pace in each run; batches 50 ms apart
        run.latency_ms += np.linspace(0.0, 400.0 * (k + 1), run.latency_ms.size)
        run.batch_times = {b: (s0 + 50.0 * b, s1 + 50.0 * b) for b, (s0, s1) in run.batch_times.items()}
    sd = fit_served(p, rule, calm + jammed, slo_ms=40.0)
    assert [st["carried"] for st in sd.stats] == [True, False] and "queue grew" in sd.stats[1]["why"]
    assert sd.carried_per_s == 100.0
    assert sd.stats[0]["new_run_share"] == pytest.approx(alone.stats[0]["new_run_share"], rel=1e-3)
    assert (sd.a_ms, sd.c_ms) == (alone.a_ms, alone.c_ms)


def test_the_spread_between_runs_is_a_prediction_interval_on_the_degrees_of_freedom_it_rests_on():
    """Two runs at each of two loads, the second the first 4 % slower throughout: σ = 1.4826 × the median absolute
    deviation of log(p99 ÷ plan) about each load's mean rests on 2 degrees of freedom, and a new run's 95 %
    half-width is exp(t·σ·√(1 + 1/R)) − 1 with Student's t (4.30 there), not the normal 1.96."""
    import copy

    from scipy.stats import t as student_t

    p, rule, back = _at_8ms()
    runs = []
    for i, x in enumerate((100.0, 200.0)):
        first = _synthetic_run(p, rule, x, 10 + i, outside=back)
        slower = copy.deepcopy(first)
        slower.latency_ms *= 1.04
        runs += [first, slower]
    sd = fit_served(p, rule, runs)
    sigma = 1.4826 * math.log(1.04) / math.sqrt(2.0)  # deviations ±log(1.04)/2 about the mean, over √(1/2)
    for st in sd.stats:
        assert st["new_run_share"] == pytest.approx(math.expm1(student_t.ppf(0.975, 2) * sigma * math.sqrt(1.5)),
                                                    rel=1e-6)


def test_a_per_batch_time_no_run_could_show_is_said_to_be_unmeasured():
    """With the instance never busy when a batch was due, a + c·b is not measured: the summary says so, and that a
    busier setting needs its own run, instead of printing 0 + 0·b ms as if measured."""
    p = BatchingProblem(lam=0.3, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=8000", p)
    sd = fit_served(p, rule, [_synthetic_run(p, rule, 20.0, 0)])
    assert sd.source["per_batch_pairs"] < 5 and (sd.a_ms, sd.c_ms) == (0.0, 0.0)
    assert sd.summary().startswith("per batch not measured (") and "calibrate that setting too" in sd.summary()
    busy = fit_served(p, rule, [_synthetic_run(p, rule, 1500.0, 0, a=0.5)])
    assert busy.source["per_batch_pairs"] >= 5 and busy.summary().startswith("per batch 0.5")  # 0.513: timer slack


def test_runs_of_two_settings_are_each_replayed_with_their_own():
    p = BatchingProblem(lam=0.3, **STANDIN)
    r8, r2 = parse_rule("triton:max=16,delay_us=8000", p), parse_rule("triton:max=16,delay_us=2000", p)
    a, b = _synthetic_run(p, r8, 200.0, 0), _synthetic_run(p, r2, 200.0, 1)
    b.rule = r2
    sd = fit_served(p, r8, [a, b])
    assert sd.stats[0]["runs"] == 2 and sd.stats[0]["to_batcher_ms"] == pytest.approx(0.4, abs=0.05)
    b.rule = None  # replayed with the 8 ms delay it did not run: its batches look early, not late
    assert fit_served(p, r8, [a, b]).stats[0]["to_batcher_ms"] < 0.3


def test_the_fit_finds_the_per_batch_time_between_back_to_back_batches():
    p = BatchingProblem(lam=1.5, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=0", p)
    runs = [_synthetic_run(p, rule, 1500.0, 0, a=0.8)]
    sd = fit_served(p, rule, runs)
    assert sd.source["per_batch_pairs"] > 100
    assert sd.a_ms + sd.c_ms * 8 == pytest.approx(0.8, abs=0.05)


def test_a_load_whose_requests_went_unanswered_is_not_carried_and_plans_beyond_it_are_refused():
    p = BatchingProblem(lam=0.3, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=8000", p)
    runs = [_synthetic_run(p, rule, 100.0, 0), _synthetic_run(p, rule, 200.0, 1),
            _synthetic_run(p, rule, 400.0, 2, drop=50)]
    sd = fit_served(p, rule, runs, slo_ms=25.0)
    assert sd.carried_per_s == 200.0
    assert [s["carried"] for s in sd.stats] == [True, True, False]
    assert "50 of 3000 requests were not answered" in sd.stats[2]["why"]
    with pytest.raises(InputError, match=r"does not carry 300 req/s.*calibrated at 400 req/s, 50 of 3000 requests "
                                         r"were not answered; it carries up to 200 req/s"):
        optimise(p, {"p99": 25.0}, [0.1, 0.3], families=("triton",), requests=2000, defaults=False, served=sd)


@pytest.mark.parametrize("outside_ms, carried", [(30.0, False), (23.0, False), (21.0, True)])
def test_a_load_where_the_fastest_response_alone_reaches_the_slo_is_not_carried(outside_ms, carried):
    """The calibration's verdict is compare's: with an outside delay of 23 ms the path alone stays under 25 ms, but
    l(1) as served on top reaches it, and compare then refuses the load ("no setting can meet"): a load it calls
    carried must be one compare plans for (a CI run printed a next line that compare refused)."""
    from smdp_batch.analysis.slo import _check_served_reachable, served_floor_ms

    p = BatchingProblem(lam=0.3, **STANDIN)
    rule = parse_rule("triton:max=16,delay_us=8000", p)
    sd = fit_served(p, rule, [_synthetic_run(p, rule, 100.0, 0, outside=lambda rng, n: np.full(n, outside_ms))],
                    slo_ms=25.0)
    served = sd.apply(p)
    floor = served_floor_ms(served, "p99", 0.1, sd)
    assert (sd.carried_per_s == 100.0) is carried and (floor < 25.0) is carried
    if carried:
        _check_served_reachable(served, SLO.of({"p99": 25.0}), [0.1], sd)
    else:
        assert f"take p99 {floor:.4g} ms ≥ the SLO 25 ms" in sd.stats[0]["why"], sd.stats[0]["why"]
        assert "the fastest batch alone (l(1) = " in sd.stats[0]["why"]
        with pytest.raises(InputError, match="no setting can meet p99 ≤ 25 ms at 100 req/s"):
            _check_served_reachable(served, SLO.of({"p99": 25.0}), [0.1], sd)


# ------------------------------------------------------------------------------------------- the commands
@pytest.fixture()
def served_file(tmp_path):
    sd = _sd(0.3, 0.02, 0.1, [1.5 + np.random.default_rng(0).exponential(0.5, 2000)] * 2, (400.0, 1600.0),
             carried_per_s=1600.0, source={"server": "triton", "model": "stand-in sleeping l(b)"})
    path = tmp_path / "served.json"
    sd.save(str(path))
    return str(path)


def test_compare_plans_with_the_served_delay_and_says_so(served_file, capsys):
    args = ["compare", "--slo-p99-ms", "20", "--load-range", "500:1500", "--requests", "5000"]
    assert main([*args, "--json"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert main([*args, "--served", served_file, "--json"]) == 0
    served = json.loads(capsys.readouterr().out)
    assert bare["server_time_in_plan"] is False and bare["served_delay"] is None
    assert served["server_time_in_plan"] is True and served["served_delay"]["return_ms"] == 0.1
    # the server's time takes room: the answer waits less, so it draws more power
    assert served["recommended"]["mean_power_w"] > bare["recommended"]["mean_power_w"]
    assert main([*args, "--served", served_file]) == 0
    out = capsys.readouterr().out
    assert "in plan     the server's own time, calibrated on triton" in out and "not in plan" not in out


def test_served_options_refused_in_one_line(served_file, tmp_path, capsys):
    (tmp_path / "t.h5").write_bytes(b"")
    assert main(["solve", "--bmax", "8", "-o", str(tmp_path / "t.h5")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "t.h5"), "--to", "triton", "--served", served_file]) == 2
    assert "--served goes with an SLO" in capsys.readouterr().err
    assert main(["compare", "--slo-p99-ms", "20", "--served", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compare", "--slo-p99-ms", "20", "--load-range", "500:2500", "--served", served_file,
                 "--requests", "2000"]) in (0, 2)
    err = capsys.readouterr().err
    assert err == "" or err.count("\n") == 1


def test_calibrate_refuses_a_setting_its_server_cannot_run(capsys):
    for server, setting, words in (("triton", "control:8+timer:5", "runs its own batcher"),
                                   ("ray", "triton:max=8,delay_us=100", "ray:max=B,timeout_s=T")):
        assert main(["calibrate", "--bmax", "8", "--server", server, "--setting", setting, "--load-range", "100:300",
                     "--slo-p99-ms", "20", "-o", "/tmp/never-written.json"]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1
    for repeats in ("0", "11", "2.5"):
        assert main(["calibrate", "--bmax", "8", "--server", "triton", "--setting", "triton:max=8,delay_us=100",
                     "--load-range", "100:300", "--slo-p99-ms", "20", "--repeats", repeats,
                     "-o", "/tmp/never-written.json"]) == 2
        err = capsys.readouterr().err
        assert "--repeats" in err and repeats in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------- real servers
def _line(out: str, label: str) -> list[str]:
    """The arguments of the printed line that starts with ``label`` (after ``smdp-batch``)."""
    import shlex

    text = next(ln for ln in out.splitlines() if ln.startswith(f"  {label}"))
    return shlex.split(text.split("smdp-batch", 1)[1])


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.exclusive  # judged live at real speed: nothing beside it
def test_export_calibrate_export_on_the_real_triton_each_printed_line_runs(tmp_path, capsys, monkeypatch):
    """The loop as a user runs it, each next line as printed (fewer requests, to keep the suite short): export at
    an SLO prints the calibrate line; it runs the setting on the real Triton at time scale 1 and writes the file;
    its next line (compare --served) runs; export --served prints the line that checks the new setting live."""
    pytest.importorskip("pytriton")
    monkeypatch.chdir(tmp_path)
    assert main(["solve", "--bmax", "16", "--latency", "affine:0.5,2", "--service", "det", "--rps", "300",
                 "-o", "t.h5"]) == 0
    export = ["export", "t.h5", "--to", "triton", "--slo-p99-ms", "30", "--load-range", "100:300", "--requests", "5000"]
    capsys.readouterr()
    assert main(export) == 0
    calibrate_args = _line(capsys.readouterr().out, "calibrate")
    assert calibrate_args[0] == "calibrate" and "--setting" in calibrate_args
    for _ in range(2):  # once more where this host did not carry a load (a stall while the suite runs beside it)
        assert main([*calibrate_args, "--requests", "300"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        if "did not carry the lowest load" not in out:
            break
    else:  # twice: the refusal is what a user on this host must see, with what was measured there
        sd = ServedDelay.load(str(tmp_path / "served.json"))
        assert not sd.stats[0]["carried"] and sd.stats[0]["why"] and "calibrate at lower loads" in out
        return
    sd = ServedDelay.load(str(tmp_path / "served.json"))
    assert sd.source["time_scale"] == 1.0 and sd.source["server"] == "triton"
    assert len(sd.loads_per_s) == 3 and all(st["runs"] == 2 and st["requests"] == 600 for st in sd.stats)
    assert sd.source["deployments"] == 2  # the printed line repeats each load on a fresh deployment
    # what the server adds is real and of the order the docs give: milliseconds, not zero, where the path carried
    # the load; a load it did not carry (its queue grew on a starved host: the outside delay then grows with it)
    # says why in one phrase, and the carried load is the top of the run of carried ones from the lowest
    assert all(np.percentile(o, 50) > 0.2 for o in sd.outside_ms)
    carried = [st["carried"] for st in sd.stats]
    assert carried[0] and all(0.2 < np.percentile(o, 50) < 20 for o, c in zip(sd.outside_ms, carried) if c)
    assert all(st["why"] for st in sd.stats if not st["carried"])
    top = (carried + [False]).index(False)  # the run of carried loads from the lowest
    assert sd.carried_per_s == sd.loads_per_s[top - 1]
    assert set(sd.served_latency_ms) and all(v >= 2.0 for v in sd.served_latency_ms.values())
    assert main([*_line(out, "next"), "--requests", "5000"]) == 0, capsys.readouterr().err
    assert "in plan     the server's own time, calibrated on triton" in capsys.readouterr().out
    rc = main([*export, "--served", "served.json"])
    if rc != 0:  # what this host's calibration measured puts 30 ms out of reach at the top load, or a load of the
        # range beyond what its own path carried there (a CI host: 173 req/s carried, 228 asked): one line says so
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1, err
        carried = sd.carried_per_s is not None and f"it carries up to {sd.carried_per_s:.4g} req/s" in err
        assert err.startswith("smdp-batch: error: no triton setting meets p99 ≤ 30 ms") or (
            err.startswith("smdp-batch: error: the server's own path does not carry") and carried), err
        return
    check = _line(capsys.readouterr().out, "check it")
    assert check[0] == "calibrate" and check[check.index("--setting") + 1] != \
        calibrate_args[calibrate_args.index("--setting") + 1]  # the calibrated setting waits less


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.exclusive  # judged live at real speed: nothing beside it
def test_a_calibrated_triton_setting_holds_its_p99_live_at_real_speed():
    """Export at a p99 SLO → calibrate → export with the served-delay model → run at both ends on fresh streams:
    the measured p99 meets the SLO and lands near the plan (:func:`_lands`; up to two retries on fresh streams: the
    2-core host is shared with the suite's other worker), the plan keeping 3 % of the bound for the measurement's own
    noise."""
    pytest.importorskip("pytriton")
    from smdp_batch.analysis.slo import load_grid
    from smdp_batch.integrations.calibrate import calibrate

    p = BatchingProblem(lam=0.3, **STANDIN)
    slo = 25.0
    lams = load_grid(p, 0.1, 0.3)
    loads = [x * 1e3 for x in (lams[0], lams[4])]  # both ends (the middle loads plan with the top one's sample)
    # 3 % headroom: a p99 measured on 1 000 requests (ten in its tail) moves by a few % from stream to stream, and a
    # plan on the bound itself then reads as a miss about as often as not (measured on the CI host: 25.14 ms against
    # a 25 ms bound, plan 24.74); the headroom is the documented way to keep room for what the plan does not hold
    answer = lambda served=None: optimise(p.replace(lam=lams[-1]), SLO.of({"p99": slo}, ("pct", 3.0)),  # noqa: E731
                                          lams, families=("triton-preferred",), requests=30_000, defaults=False,
                                          served=served)
    refusals: list[str] = []
    unmet: list[dict] = []
    planned = measured = []
    checked = None
    attempts = 3
    for attempt in range(attempts):
        sd = calibrate(p, answer().best["triton-preferred"].rule, loads, requests=1000, seed=attempt, slo_ms=slo)
        try:
            a = answer(sd)
        except InputError as e:  # the host did not keep up with a load (the suite's other worker): said, with figures
            refusals.append(str(e))
            continue
        s = a.best["triton-preferred"]
        if s is None:  # a slow spell in this calibration left no setting room under the bound (CI, twice): the
            unmet.append(a.reach or {})  # answer says how close the best setting came; calibrate again
            continue
        check = calibrate(p, s.rule, loads, requests=1000, seed=100 + attempt, slo_ms=slo)
        checked = s.rule.spec  # the setting run live (a later attempt may find none)
        planned = [x.metrics["p99"] for x in s.loads if round(x.lam * 1e3, 6) in {round(v, 6) for v in loads}]
        measured = [st["p99_ms"] for st in check.stats]
        if all(m <= slo for m in measured) and all(_lands(m, q) for m, q in zip(measured, planned)):
            break
    # a refusal must rest on what was measured at that load; a plan must hold
    assert all("does not carry" in r and "calibrated at" in r for r in refusals), refusals
    # an answer with no setting names the least p99 reached, at which load, by what setting, near the bound: the least
    # at each load may come from different settings, none meeting every load (measured: 24.14 ms against 24.25 at the top)
    assert all(r.get("metric") == "p99" and r["value_ms"] + r["ci_ms"] > 0.9 * slo and r["setting"]
               and any(abs(r["lam"] - x) < 1e-12 for x in lams) for r in unmet), unmet
    # a plan was checked live, or every attempt was refused or left unmet with figures
    assert measured or len(refusals) + len(unmet) == attempts, (refusals, unmet)
    assert all(m <= slo for m in measured), (checked, planned, measured)
    assert all(_lands(m, q) for m, q in zip(measured, planned)), (checked, planned, measured, unmet)


def _lands(measured: float, planned: float) -> bool:
    """A measured p99 within 10 % above its plan (the side that breaks an SLO), and within 25 % below it: on the
    slow 2-core CI host runs of one setting land 20–27 % apart (docs/how-to/slo.md), and a calibration caught in
    a slow spell plans that much on the safe side (CI: plan 22.6 ms, the check run 18.5 ms)."""
    return planned * 0.75 <= measured <= planned * 1.1


@pytest.fixture()
def batching_endpoint():
    """A user's own endpoint on 127.0.0.1: uvicorn serving a bare ASGI app, a DynamicBatcher with control:4 + timer
    3 ms in front of a model whose batch sleeps l(b) = 2 + 0.5·b ms; stopped after the test."""
    import asyncio
    import threading
    import time as _time

    uvicorn = pytest.importorskip("uvicorn")
    from smdp_batch.runtime import DynamicBatcher, PolicyTable

    held: dict = {}

    async def infer(items):
        await asyncio.sleep((2.0 + 0.5 * len(items)) / 1000.0)
        return items

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            msg = await receive()
            body, more = body + msg.get("body", b""), msg.get("more_body", False)
        if "batcher" not in held:  # made in the server's own event loop
            held["batcher"] = DynamicBatcher(infer, PolicyTable.control(4, range(1, 17)), max_wait_ms=3.0)
        await held["batcher"].submit(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = _time.monotonic() + 10
    while not server.started and _time.monotonic() < deadline:
        _time.sleep(0.01)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/infer"
    server.should_exit = True
    thread.join(10)


@pytest.mark.servers
@pytest.mark.exclusive  # times an in-process endpoint at real speed: two CI runs beside the other worker read a
# median outside delay of 94 and 145 ms at one load (its event loop starved), passing alone and on rerun; the
# client and the server share one process, so the loads are ones a slow 2-core host carries (at 100–200 req/s, a
# host a third as fast as the development machine read medians up to 777 ms, alone)
def test_calibrate_a_users_own_http_endpoint(batching_endpoint, tmp_path, capsys):
    """--server http: POSTs at each load to an endpoint that reports no batches; the outside delay is the residual
    of the replay, small for an in-process endpoint, and compare plans with it."""
    pytest.importorskip("httpx")
    body = tmp_path / "body.json"
    body.write_text('{"x": [1.0]}')
    args = ["calibrate", "--bmax", "16", "--latency", "affine:0.5,2", "--service", "det", "--server", "http",
            "--url", batching_endpoint, "--body", str(body), "--setting", "control:4+timer:3", "--load-range",
            "30:60", "--slo-p99-ms", "40", "--requests", "300", "-o", str(tmp_path / "s.json")]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "— (no batches reported)" in out and "not reported by the server" in out
    sd = ServedDelay.load(str(tmp_path / "s.json"))
    assert sd.source["server"] == "http" and sd.served_latency_ms == {} and sd.return_ms == 0.0
    assert all(st["answered"] == 300 and st["errors"] == 0 for st in sd.stats)
    # an in-process endpoint adds little: a few ms, never the SLO's order or a negative residual
    assert all(-5.0 < np.percentile(o, 50) < 40.0 for o in sd.outside_ms), [np.percentile(o, 50) for o in sd.outside_ms]
    assert main(["calibrate", "--bmax", "16", "--server", "http", "--setting", "control:4+timer:3", "--load-range",
                 "100:200", "--slo-p99-ms", "40", "-o", str(tmp_path / "t.json")]) == 2
    assert "--server http needs --url" in capsys.readouterr().err
    assert main(["calibrate", "--bmax", "16", "--server", "triton", "--url", batching_endpoint, "--setting",
                 "triton:max=16,delay_us=10", "--load-range", "100:200", "--slo-p99-ms", "40", "-o",
                 str(tmp_path / "t.json")]) == 2
    assert "--url and --body go with --server http" in capsys.readouterr().err


def test_show_reads_a_served_delay_file_back(served_file, tmp_path, capsys):
    assert main(["show", served_file]) == 0
    out = capsys.readouterr().out
    assert "served-delay file v1, measured on triton (stand-in sleeping l(b))" in out
    assert "per batch 0.3 + 0.02·b ms, 0.1 ms per position" in out
    assert main(["show", served_file, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["path"] == served_file and d["return_ms"] == 0.1 and len(d["outside_ms"]) == 2
    other = tmp_path / "map.json"
    other.write_text('{"D0": [[-1]], "D1": [[1]]}')
    assert main(["show", str(other)]) == 2
    assert "not a served-delay file" in capsys.readouterr().err


def test_a_bound_below_what_the_server_alone_adds_is_refused_at_once():
    """l(1) as served (2.5 ms) plus the outside delay (10 ms): a 12 ms p99 cannot be met, said before any search."""
    p = BatchingProblem(lam=0.3, **STANDIN)
    sd = _sd(outside=[np.full(100, 10.0)], loads=(300.0,), carried_per_s=300.0)
    with pytest.raises(InputError, match=r"no setting can meet p99 ≤ 12 ms at 300 req/s on this server: .* "
                                         r"l\(1\) = 2.5 ms as served .* p99 12.5 ms in all"):
        optimise(p, {"p99": 12.0}, [0.3], requests=2000, served=sd)
    ans = optimise(p, {"p99": 30.0}, [0.3], families=("triton",), requests=2000, defaults=False, served=sd)
    assert ans.best["triton"] is not None
    # the outside delay grows with load (Ray's CPU-bound path): the refusal names the loads where it can be met
    sd = _sd(outside=[np.full(100, 4.0), np.full(100, 6.0), np.full(100, 20.0)], loads=(100.0, 173.0, 300.0),
             carried_per_s=300.0)
    with pytest.raises(InputError, match=r"at 300 req/s on this server: .* p99 22.5 ms in all; use a bound above "
                                         r"that; at 100 and 173 req/s of the range it can$"):
        optimise(p, {"p99": 15.0}, [0.1, 0.173, 0.3], requests=2000, served=sd)


def test_batches_served_too_slowly_for_the_problems_own_rate_fit_and_are_refused_by_load():
    """A loaded host stretched every batch 3×: with l(b) as served, the problem's own λ (a placeholder: plans name
    their loads) is beyond what batches carry.  The fit still answers, and a plan at a load the batches as served
    cannot carry is refused in one line; one they carry is planned."""
    p = BatchingProblem(lam=1.0, **STANDIN)
    assert 3 * p.rho > 1  # unstable with l(b) × 3
    rule = parse_rule("triton:max=16,delay_us=2000", p)
    run = _synthetic_run(p, rule, 100.0, 0)
    run.batch_times.update({k: (e - 3 * (e - s), e) for k, (s, e) in run.batch_times.items()})
    sd = fit_served(p, rule, [run])
    assert all(v == pytest.approx(3 * float(p.latency(np.float64(b))), rel=0.01) for b, v in sd.served_latency_ms.items())
    assert sd.apply(p).max_lam == pytest.approx(p.max_lam / 3, rel=0.01)
    with pytest.raises(InputError, match=r"queue is unstable"):
        optimise(p, {"p99": 200.0}, [1.0], families=("triton",), requests=2000, defaults=False, served=sd)
    ok = optimise(p, {"p99": 200.0}, [0.1], families=("triton",), requests=2000, defaults=False, served=sd)
    assert ok.best["triton"] is not None


def test_when_only_the_lowest_load_was_carried_the_next_line_runs_as_printed(tmp_path, capsys, monkeypatch):
    """The calibration carried its lowest load only (a loaded host): the printed next line plans at that load
    alone, and runs (a range past the carried load, as it once printed, was refused by the served model)."""
    import shlex

    from smdp_batch.integrations import calibrate as cal_mod

    stats = tuple({"load_per_s": x, "requests": 300, "answered": 300, "errors": 0, "p99_ms": p, "batcher_p99_ms": p,
                   "batcher_model_p99_ms": p, "to_batcher_ms": 0.1, "tail_gap_ms": 0.0, "model_p99_ms": 8.0,
                   "outside_p50_ms": 0.5, "outside_p99_ms": o, "client_lag_p99_ms": 0.0, "client_kept_up": True,
                   "carried": ok, "why": "" if ok else f"the server's own path alone took p99 {o:g} ms ≥ the SLO 30 ms",
                   "wall_s": 3.0}
                  for x, p, o, ok in ((100.0, 20.0, 2.0, True), (173.2, 45.0, 39.0, False), (300.0, 60.0, 50.0, False)))
    fake = _sd(0.3, 0.02, 0.1, [1.0 + np.zeros(300)] * 3, (100.0, 173.2, 300.0), carried_per_s=100.0, stats=stats,
               source={"server": "triton", "model": "stand-in", "seconds": 9.0, "time_scale": 1.0})
    monkeypatch.setattr(cal_mod, "calibrate", lambda *a, **k: fake)  # no server: what a loaded host measured
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--server", "triton", "--setting", "triton:max=16,delay_us=5000", "--bmax", "16",
                 "--latency", "affine:0.5,2",
                 "--service", "det", "--slo-p99-ms", "30", "--load-range", "100:300", "-o", "served.json"]) == 0
    nxt = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("next")][0]
    args = shlex.split(nxt.split("smdp-batch", 1)[1])
    assert "--rps" in args and args[args.index("--rps") + 1] == "100" and "--load-range" not in args
    assert main([*args, "--requests", "5000"]) == 0, capsys.readouterr().err


def test_an_answer_without_a_setting_says_whether_the_servers_time_is_in_it(served_file, capsys):
    """Out of reach with the calibrated server's time in it: the reach line and the 'in plan' line, which says
    what the least p99 includes; without a calibration the 'not in plan' line."""
    args = ["compare", "--slo-p99-ms", "6", "--load-range", "500:1500", "--requests", "5000"]
    assert main([*args, "--served", served_file]) == 0
    out = capsys.readouterr().out
    assert "no table+timer setting meets" in out and "  reach       " in out
    assert "in plan     the server's own time, calibrated on triton" in out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "no table+timer setting meets" in out and "not in plan the server's own time" in out


def test_the_fit_counts_the_deployments_its_runs_came_from_and_says_so():
    p, rule, back = _at_8ms()
    runs = [_synthetic_run(p, rule, 100.0, 30 + k, outside=back) for k in range(3)]
    for k, r in enumerate(runs):
        r.deployment = f"triton@t#{min(k, 1)}"  # runs 1 and 2 on the second deployment
    sd = fit_served(p, rule, runs, source={"deployments": 1})
    assert sd.source["deployments"] == 2 and sd.source["runs_per_load"] == 3
    assert "between runs on 2 deployments" in sd.summary()
    for r in runs:
        r.deployment = ""  # runs that do not say where they ran: the calibration's own count stands
    assert fit_served(p, rule, runs, source={"deployments": 1}).source["deployments"] == 1
    assert "between runs)" in fit_served(p, rule, runs).summary()
