"""The event simulator: exact agreement on hand-built arrivals, agreement with the exact evaluation,
paper 004 Table I by simulation, and one-line errors (issue: simulator and server rules)."""

import json
import re

import numpy as np
import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.baselines import parse_policy
from smdp_batch.baselines.servers import parse_rule, ray_serve, tf_serving, torchserve, triton
from smdp_batch.cli import main
from smdp_batch.solvers.evaluation import evaluate_deployed
from smdp_batch.analysis.simulate import simulate

# every batch takes 10 ms except size 4 (20 ms); energy 1 mJ per request in the batch
TOY = BatchingProblem(lam=0.01, batch_sizes=range(1, 5), latency="table:1=10,2=10,3=10,4=20",
                      energy="table:1=1,2=2,3=3,4=4", service="det")


def _run(rule, arrivals, problem=TOY):
    res = simulate(problem, rule, arrivals=np.asarray(arrivals, float), warmup=0.0, batches=2, keep_responses=True)
    return res


def _resp(rule, arrivals, problem=TOY):
    # hand-built sequences are shorter than the statistics need, so repeat them far apart in time
    base = np.asarray(arrivals, float)
    reps = 10
    arr = np.concatenate([base + 1000.0 * i for i in range(reps)])
    res = simulate(problem, rule, arrivals=arr, warmup=0.0, batches=2, keep_responses=True)
    return res.response_ms[: base.size], res


def test_triton_with_zero_delay_serves_whatever_is_queued():
    # 0: alone (done 10); at 10 the queue holds 1, 2, 3 → one batch of 3 (done 20); 12 waits until 20
    r, _ = _resp(triton(4, 0), [0, 1, 2, 3, 12])
    assert np.allclose(r, [10, 19, 18, 17, 18])


def test_triton_delay_bounds_the_oldest_wait():
    r, _ = _resp(triton(4, 5000), [0, 1, 2])  # waits until 0 + 5 ms, then serves 3
    assert np.allclose(r, [15, 14, 13])
    r, _ = _resp(triton(4, 5000), [0, 1, 2, 3])  # 4 = max_batch_size at t = 3: sent at once (20 ms)
    assert np.allclose(r, [23, 22, 21, 20])


def test_triton_sends_a_preferred_size_as_soon_as_it_can_be_formed():
    r, _ = _resp(triton(4, 5000, preferred=[2]), [0, 1, 1.5])
    # at 1 a batch of 2 is formable → sent (done 11); 1.5 then waits until 1.5 + 5 = 6.5 but the
    # server is busy until 11 → served at 11 alone (done 21)
    assert np.allclose(r, [11, 10, 19.5])
    r, _ = _resp(triton(4, 0, preferred=[2, 4]), [0, 0.5, 0.6, 0.7, 0.8])
    # 0 alone (no preferred formable, no delay) → at 10 four are queued: largest preferred ≤ 4 is 4
    assert np.allclose(r, [10, 29.5, 29.4, 29.3, 29.2])


def test_tf_serving_pads_to_allowed_sizes():
    r, res = _resp(tf_serving(4, 5000, allowed=[2, 4]), [0, 1, 2])
    assert np.allclose(r, [25, 24, 23])  # 3 requests padded to 4: 20 ms
    assert res.batch_size_counts == {4: 10}
    # ζ(4) = 4 mJ per padded batch, 10 batches, over the arrival span plus one mean gap (9002·30/29 ms)
    assert res.mean_power_w == pytest.approx(10 * 4 / (9002 * 30 / 29), rel=1e-12)


def test_ray_batches_close_by_time_or_size_whatever_the_executor_does():
    """Ray Serve 2.60's ``_BatchQueue`` (measured on a real deployment, README "model vs real server"): a batch
    opens at its first request, closes T later (or at max_batch_size), and queues for the one executor."""
    r, _ = _resp(ray_serve(4, 0.005), [1, 2])  # opens at 1, closes at 6 with both (done 16)
    assert np.allclose(r, [15, 14])
    # 0 closes alone at 5 (runs 5–15); 6, 7, 8 form the next batch, closed at 11, started when the executor frees
    r, _ = _resp(ray_serve(4, 0.005), [0, 6, 7, 8])
    assert np.allclose(r, [15, 19, 18, 17])
    # timeout 0: every request is its own batch, however long the executor's queue (the defaults' trap)
    r, res = _resp(ray_serve(4, 0.0), [0, 1, 2])
    assert np.allclose(r, [10, 19, 28]) and res.batch_size_counts == {1: 30}
    # max_batch_size closes a batch at once: 1..4 close at 4 (runs 4–24), 5 opens the next one
    r, _ = _resp(ray_serve(4, 0.005), [1, 2, 3, 4, 5])
    assert np.allclose(r, [23, 22, 21, 20, 29])  # 5: closes at 10, runs when the executor frees at 24


def test_torchserve_timer_starts_at_the_first_request():
    r, _ = _resp(torchserve(4, 5), [1, 2])  # first request at 1 → sent at 6
    assert np.allclose(r, [15, 14])
    # batch_size 2 is reached at t = 2 (done 12); then 3 is taken at 12 and waits until 12 + 5 (done 27)
    r, _ = _resp(torchserve(2, 5), [1, 2, 3])
    assert np.allclose(r, [11, 10, 24])


def test_table_rules_act_at_the_models_epochs():
    r, _ = _resp(parse_rule("static:2", TOY), [0, 1, 2, 3])
    assert np.allclose(r, [11, 10, 19, 18])
    r, _ = _resp(parse_rule("greedy", TOY), [0, 1, 2, 3, 4, 5])
    assert np.allclose(r, [10, 29, 28, 27, 26, 35])  # 0 alone; at 10 four wait → size 4 (20 ms); 5 waits until 30


@pytest.mark.parametrize("service", ["det", "exp"])
@pytest.mark.parametrize("rho", [0.3, 0.7, 0.9])
def test_simulation_agrees_with_exact_evaluation(rho, service):
    p = BatchingProblem.basic(rho=rho, w2=1.0, service=service)
    sol = solve(p)
    ev = sol.deployed
    res = simulate(p, sol, requests=4_000_000, seed=12345)
    assert abs(res.mean_latency_ms - ev.mean_latency_ms) <= res.mean_latency_ci
    assert abs(res.mean_power_w - ev.mean_power_w) <= res.mean_power_ci
    # no batch-means interval for the batch size; exponential service at ρ = 0.9 is strongly autocorrelated
    # (4e6 requests give W̄ to about ±5 %), so this is only a sanity bound
    assert res.mean_batch_size == pytest.approx(ev.mean_batch_size, rel=0.05)
    assert res.throughput == pytest.approx(p.lam, rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy, paper",
    [
        ("static:8", dict(P=46.27, W=6.85, p50=6.51, p90=9.85, p95=11.34)),
        (1.6, dict(P=44.96, W=6.90, p50=6.83, p90=9.23, p95=9.96)),
        (2.2, dict(P=44.41, W=7.81, p50=7.72, p90=10.45, p95=11.24)),
    ],
)
def test_paper_table_1_by_simulation(policy, paper):
    """Paper 004 Table I (ρ = 0.7), 10⁷ requests: within 1 % of every printed value."""
    if isinstance(policy, str):
        p = BatchingProblem.basic(rho=0.7)
        rule = parse_rule(policy, p)
    else:
        p = BatchingProblem.basic(rho=0.7, w2=policy)
        rule = solve(p)
    res = simulate(p, rule, requests=10_000_000, seed=2024)
    got = dict(P=res.mean_power_w, W=res.mean_latency_ms, p50=res.percentiles["p50_ms"],
               p90=res.percentiles["p90_ms"], p95=res.percentiles["p95_ms"])
    for k, v in paper.items():
        assert got[k] == pytest.approx(v, rel=0.01), (k, got[k], v)


def test_runs_are_deterministic_for_a_seed():
    p = BatchingProblem.basic(rho=0.5, service="exp")
    a = simulate(p, parse_rule("greedy", p), requests=20_000, seed=7)
    b = simulate(p, parse_rule("greedy", p), requests=20_000, seed=7)
    c = simulate(p, parse_rule("greedy", p), requests=20_000, seed=8)
    assert a.mean_latency_ms == b.mean_latency_ms and a.percentiles == b.percentiles
    assert a.mean_latency_ms != c.mean_latency_ms


def test_batch_dependent_laws_and_mmpp_arrivals(capsys):
    p = BatchingProblem.from_rho(0.6, batch_sizes=range(1, 17), service="max:uniform:1,20", energy="const:100")
    res = simulate(p, parse_rule("greedy", p), requests=200_000, seed=1)
    ev = evaluate_deployed(p, parse_policy("greedy", p.batch_sizes, 16))
    assert abs(res.mean_latency_ms - ev.mean_latency_ms) <= 2 * res.mean_latency_ci
    assert main(["simulate", "--rho", "0.5", "--policy", "greedy", "--arrivals", "mmpp:3,0.5,0.01,0.01",
                 "--requests", "50000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["requests"] == 50000 and d["p99_ms"] > d["p50_ms"]


def test_cli_simulate_json_contract(tmp_path, capsys):
    out = tmp_path / "pol.h5"
    assert main(["solve", "--rho", "0.7", "--w2", "1.6", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--policy", str(out), "--requests", "200000", "--seed", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_latency_ms", "mean_latency_ci_ms", "mean_power_w",
                "mean_power_ci_w", "p95_ci_ms", "throughput", "mean_batch_size", "seed"):
        assert key in d
    assert d["mean_latency_ms"] == pytest.approx(6.90, rel=0.02)


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--lam", "-2"], "must be > 0, got -2"),
        (["--arrivals", "trace:EMPTY"], "holds no arrival times"),
        (["--arrivals", "trace:UNSORTED"], "timestamps must be sorted; 3 is followed by 2"),
        (["--arrivals", "trace:BADCELL"], "line 3: 'soon' is not a time"),
        (["--arrivals", "mmpp:1,2,3"], "mmpp needs L1,L2,R12,R21"),
        (["--policy", "POLICY16", "--bmax", "32"], "was solved for batch sizes"),
        (["--policy", "triton:max=64"], "executes batch size 33, which the problem does not allow"),
        (["--policy", "triton:max=8,delay_us=-1"], "max_queue_delay_microseconds must be a finite number ≥ 0"),
        (["--policy", "ray:max=8,wait=1"], "unknown setting 'wait=1'"),
        (["--requests", "10"], "--requests must be ≥ 100"),
        (["--policy", "fifo"], "unknown policy or rule 'fifo'"),
    ],
)
def test_bad_inputs_get_one_line_errors(tmp_path, capsys, args, msg):
    files = {"EMPTY": "arrival_ms\n", "UNSORTED": "1\n3\n2\n", "BADCELL": "arrival_ms\n1\nsoon\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    pol16 = tmp_path / "p16.h5"
    assert main(["solve", "--bmax", "16", "--rho", "0.5", "-o", str(pol16)]) == 0
    capsys.readouterr()
    paths = {"EMPTY": tmp_path / "EMPTY", "UNSORTED": tmp_path / "UNSORTED", "BADCELL": tmp_path / "BADCELL",
             "POLICY16": pol16}
    args = [str(paths[a]) if a in paths else a.replace("trace:", "trace:" + str(tmp_path) + "/") if a.startswith("trace:") else a
            for a in args]
    if "--policy" not in args:
        args += ["--policy", "greedy"]
    if "--requests" not in args:
        args += ["--requests", "20000"]
    rc = main(["simulate", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert re.search(msg, err), err


def test_compare_at_the_papers_slo(capsys):
    """Paper 004 §VII-B3's SLO (p95 < 10 ms at ρ = 0.7): every server rule, best-tuned by the SLO optimiser on
    the same arrivals, draws at least as much power as the table + timer answer; compare prints it in words."""
    assert main(["compare", "--rho", "0.7", "--slo-p95-ms", "10", "--requests", "20000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d["best"]) == ["table+timer", "smdp", "triton", "triton-preferred", "tfserving", "ray", "torchserve"]
    rec = d["recommended"]
    assert rec["meets_slo"] and rec["worst_load"]["metrics_ms"]["p95"] <= 10.0
    for fam in ("triton", "triton-preferred", "tfserving"):  # members of the family: never below it
        assert d["best"][fam]["mean_power_w"] >= rec["mean_power_w"]
    assert main(["compare", "--rho", "0.7", "--slo-p95-ms", "10", "--requests", "20000"]) == 0
    out = capsys.readouterr().out
    assert "+-" not in out and ("less than" in out or "same power" in out)
    assert main(["compare", "--rho", "0.7"]) == 2
    assert "give an SLO" in capsys.readouterr().err


def test_mmpp_long_run_rate_and_queue_histogram():
    from smdp_batch.analysis.simulate import mmpp_arrivals

    rates, switch = (3.0, 0.5), (0.02, 0.05)  # leave phase 0 at 0.02/ms, phase 1 at 0.05/ms
    arr = mmpp_arrivals(rates, switch, 400_000, np.random.default_rng(5))
    p0 = switch[1] / (switch[0] + switch[1])  # stationary share of time in phase 0
    assert np.all(np.diff(arr) >= 0)
    assert arr.size / arr[-1] == pytest.approx(p0 * rates[0] + (1 - p0) * rates[1], rel=0.03)
    p = BatchingProblem.basic(rho=0.5)
    res = simulate(p, parse_rule("greedy", p), requests=50_000, seed=1)
    assert res.queue_at_start.sum() == sum(res.batch_size_counts.values())


@pytest.mark.parametrize("rule", ["triton:max=16,delay_us={us}", "ray:max=16,timeout_s={s}",
                                  "torchserve:batch=16,delay_ms={ms}", "static:16+timer:{ms}"])
def test_timer_batches_counts_the_batches_a_delay_closed(rule):
    """``timer_batches``: the batches of the stream a delay closed.  None closed at a delay d: any longer delay
    serves the stream in the same batches (the SLO search's delay search stops there); a short delay closes
    some.  Loops that do not count say None."""
    p = BatchingProblem.basic(rho=0.5)
    spell = lambda ms: parse_rule(rule.format(us=int(ms * 1000), s=ms / 1000, ms=ms), p)
    short = simulate(p, spell(2), requests=20_000, seed=3)
    assert short.timer_batches is not None and short.timer_batches > 0
    long_ = simulate(p, spell(400), requests=20_000, seed=3, keep_responses=True)
    assert long_.timer_batches == 0
    longer = simulate(p, spell(4000), requests=20_000, seed=3, keep_responses=True)
    assert longer.timer_batches == 0
    assert np.array_equal(long_.response_ms, longer.response_ms)
    assert long_.mean_power_w == longer.mean_power_w and long_.as_dict()["timer_batches"] == 0


def test_timer_batches_is_none_where_the_loop_does_not_count():
    p = BatchingProblem.basic(rho=0.5).replace(instances=2)
    res = simulate(p, parse_rule("ray:max=16,timeout_s=0.002", p), requests=20_000, seed=3)
    assert res.timer_batches is None and "timer_batches" not in res.as_dict()


def test_group_percentiles_are_the_sorted_order_statistics_interpolated_on_ties_small_groups_and_every_level():
    from smdp_batch.analysis.quantiles import group_percentiles

    def by_sorting(x, qs):  # the module's definition, from a full sort
        y = np.sort(x)
        out = []
        for q in qs:
            p = q / 100.0 * (y.size - 1)
            lo = int(np.floor(p))
            hi = min(lo + 1, y.size - 1)
            out.append(y[lo] + (p - lo) * (y[hi] - y[lo]))
        return np.array(out)

    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 4000))
        x = rng.lognormal(0.0, 1.0, n) if trial % 2 else np.round(rng.random(n) * 4)  # many ties
        groups = int(rng.integers(1, min(n, 25) + 1))
        edges = np.linspace(0, n, groups + 1).astype(np.int64)
        if np.any(np.diff(edges) < 1):
            continue
        qs = (99.0,) if trial % 3 else (0.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0)
        before = x.copy()
        by, whole = group_percentiles(x, edges, qs)
        assert np.array_equal(x, before)  # the responses are left as they were
        assert np.array_equal(whole, by_sorting(x, qs))
        assert np.allclose(whole, np.percentile(x, qs), rtol=1e-14, atol=0.0)  # numpy's, up to its own rounding
        for g in range(groups):
            assert np.array_equal(by[g], by_sorting(x[edges[g]:edges[g + 1]], qs))
    with pytest.raises(ValueError, match="edges"):
        group_percentiles(np.arange(10.0), [0, 5, 5, 10], (99,))
