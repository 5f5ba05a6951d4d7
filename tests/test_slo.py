"""The SLO answer: table + timer rules, the one optimiser behind compare / pareto / export, load ranges,
the exact response-time law of a table (an independent check of the simulator's tail), bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from smdp_batch.analysis.simulate import poisson_arrivals, response_times, simulate
from smdp_batch.analysis.slo import SLO, load_grid, optimise
from smdp_batch.analysis.tail import sojourn_law
from smdp_batch.baselines.servers import parse_rule, table_timer, triton, triton_table
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers import solve

REQ = "20000"  # per candidate and load in the CLI tests: fast, and the same for every command compared


def _run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------ table + timer: one semantics
@pytest.mark.parametrize("service", ["det", "exp", "hyperexp:0.3/0.2,0.7/1.343"])
def test_tritons_rule_is_a_table_plus_timer_request_by_request(service):
    """Triton (with and without preferred sizes) and TF-Serving run identically to their table + timer."""
    p = BatchingProblem.basic(rho=0.7, service=service)
    arr = poisson_arrivals(p.lam, 60_000, np.random.default_rng(11))
    for pref, d_us in [((), 0.0), ((), 1500.0), ((), 9000.0), ((8, 16, 32), 4000.0), (tuple(range(12, 33)), 700.0),
                       ((1,), 3000.0)]:
        a = response_times(p, triton(32, d_us, pref), arr, seed=4)
        b = response_times(p, table_timer(triton_table(32, pref), p.batch_sizes, d_us / 1000.0), arr, seed=4)
        assert np.array_equal(a, b), (pref, d_us)
    tf = response_times(p, parse_rule("tfserving:max=32,timeout_us=2500", p), arr, seed=4)
    assert np.array_equal(tf, response_times(p, table_timer(triton_table(32), p.batch_sizes, 2.5), arr, seed=4))


@pytest.mark.parametrize("service", ["det", "exp"])
def test_with_padded_profiles_tritons_rule_is_a_table_plus_timer_whose_forced_batches_pad_up(service):
    sizes = (1, 2, 4, 8, 16, 32)
    p = BatchingProblem.basic(rho=0.6, batch_sizes=sizes, service=service)
    arr = poisson_arrivals(p.lam, 60_000, np.random.default_rng(5))
    for pref, d_us in [((), 0.0), ((), 3000.0), ((8, 16, 32), 2000.0), ((16, 32), 800.0)]:
        a = response_times(p, triton(32, d_us, pref, sizes), arr, seed=3)
        b = response_times(p, table_timer(triton_table(32, pref), sizes, d_us / 1000.0, forced="pad"), arr, seed=3)
        assert np.array_equal(a, b, equal_nan=True), (pref, d_us)
    assert parse_rule("control:8+timer:2:pad", p).mode == "timer-pad"


def test_the_runtime_pads_forced_batches_up_as_the_simulator_does():
    """DynamicBatcher(short_batch="pad-up"): a forced batch of n takes min(n, Bmax) and pads to the next size."""
    import asyncio

    from smdp_batch.runtime import DynamicBatcher, PolicyTable

    table = PolicyTable(triton_table(32), (1, 2, 4, 8, 16, 32))
    seen = []

    def infer(items):
        seen.append(len(items))
        return items

    async def main():
        bt = DynamicBatcher(infer, table, max_wait_ms=5.0, short_batch="pad-up", pad_item=None)
        got = await asyncio.gather(*(bt.submit(i) for i in range(5)))
        await bt.close()
        return got

    assert asyncio.run(main()) == list(range(5)) and seen == [8]


def test_timer_inf_is_the_pure_table_and_the_timer_bounds_the_oldest_wait():
    p = BatchingProblem.basic(rho=0.3)
    sol = solve(p.replace(w2=4.0))
    pol = np.asarray(sol.policy)[: sol.s_max + 1]
    arr = poisson_arrivals(p.lam, 50_000, np.random.default_rng(2))
    pure = response_times(p, pol, arr)
    assert np.array_equal(pure, response_times(p, table_timer(pol, p.batch_sizes, math.inf), arr), equal_nan=True)
    # with τ, no request waits longer than τ before its batch starts: response ≤ τ + the longest batch
    # time plus the batch in service when the timer fired
    tau = 3.0
    timed = response_times(p, table_timer(pol, p.batch_sizes, tau), arr)
    lmax = float(p.latency_ms()[-1])
    assert np.nanmax(timed) <= tau + 2 * lmax + 1e-9 < np.nanmax(pure)
    # the spelling: a table, +timer:MS
    r = parse_rule("control:8+timer:2.5", p)
    assert r.mode == "timer" and r.delay == 2.5 and r.spec == "control:8+timer:2.5"
    for bad in ("triton:max=32+timer:3", "greedy+timer:-1", "greedy+timer:x", "greedy+timerx"):
        with pytest.raises(InputError):
            parse_rule(bad, p)


def test_forced_batches_follow_the_runtime_rule_with_noncontiguous_sizes():
    """A forced batch serves the largest allowed size ≤ n; fewer than the smallest are padded up to it."""
    p = BatchingProblem.basic(rho=0.3, batch_sizes=(4, 8, 16, 32))
    table = np.zeros(33, dtype=np.int64)
    table[32] = 32  # wait for 32
    rule = table_timer(table, p.batch_sizes, 1.0)
    res = simulate(p, rule, requests=20_000, seed=1)
    assert set(res.batch_size_counts) <= {4, 8, 16, 32}


# ------------------------------------------------------------------ the optimiser
def test_table_plus_timer_never_loses_to_the_tuned_rules_and_meets_the_slo_on_a_fresh_seed():
    p = BatchingProblem.basic(rho=0.5)
    ans = optimise(p, {"p99": 20.0}, requests=50_000, seed=3)
    rec = ans.recommended
    assert rec is not None and rec.meets
    for fam in ("triton", "triton-preferred", "tfserving", "smdp"):  # members: never below, exactly
        assert ans.best[fam] is None or ans.best[fam].power_w >= rec.power_w
    for fam in ("ray", "torchserve"):  # searched beside it: not below it beyond the simulation's interval
        s = ans.best[fam]
        assert s is None or s.power_w >= rec.power_w - 2 * math.hypot(s.power_ci, rec.power_ci)
    # the default settings run at the SLO's loads and are reported, and the savings are worded from them
    assert {d.spec.split(":")[0] for d in ans.defaults} == {"triton", "tfserving", "ray", "torchserve"}
    assert ans.savings()[0]["against"] == "best tuned rule"
    fresh = simulate(p, rec.rule, requests=400_000, seed=99)
    assert fresh.percentiles["p99_ms"] <= 20.0


def test_a_load_range_is_met_at_every_load_off_peak_included():
    """HI/LO = 3: the answer is checked at ≥ 5 loads, the low end included, and meets the SLO at each in a
    fresh simulation with another seed; a count-only table cannot (it waits for its batch off-peak)."""
    p = BatchingProblem.basic(rho=0.6)
    lams = load_grid(p, p.lam / 3, p.lam)
    assert len(lams) >= 5 and lams[0] == pytest.approx(p.lam / 3) and lams[-1] == pytest.approx(p.lam)
    ans = optimise(p, {"p99": 15.0}, lams, requests=50_000, seed=1, defaults=False)
    rec = ans.recommended
    assert rec.meets and len(rec.loads) == len(lams)
    for lam in (lams[0], lams[2], lams[-1]):
        r = simulate(p.replace(lam=lam), rec.rule, requests=300_000, seed=7)
        assert r.percentiles["p99_ms"] <= 15.0, lam
    # a pure table tuned at the top load breaks the SLO at the low end
    pure = solve(p.replace(w2=6.0))
    r = simulate(p.replace(lam=lams[0]), np.asarray(pure.policy)[: pure.s_max + 1], requests=200_000, seed=7)
    assert r.percentiles["p99_ms"] > 15.0


def test_several_slos_at_once_and_bad_slos():
    p = BatchingProblem.basic(rho=0.5)
    ans = optimise(p, {"p99": 20.0, "mean": 8.0}, requests=20_000, families=("table+timer",), defaults=False)
    w = ans.recommended.worst(ans.slo)
    assert w.metrics["mean"] + w.ci["mean"] <= 8.0 and w.metrics["p99"] + w.ci["p99"] <= 20.0
    with pytest.raises(InputError, match="unknown SLO metric"):
        SLO.of({"p98": 5})
    with pytest.raises(InputError, match="conflicting"):
        SLO.of([("p99", 5), ("p99", 6)])
    with pytest.raises(InputError, match="below the fastest possible"):
        optimise(p, {"p99": 1.0})
    for lo, hi, what in ((2.0, 1.0, "inverted"), (1.0, 1.0, "empty"), (1.0, 5.0, "ρ =")):
        with pytest.raises(InputError, match=what):
            load_grid(p, lo, hi)


def test_a_loose_second_bound_does_not_move_the_answer():
    """A mean bound of 10⁶ ms beside a p99 bound adds nothing, so the answer must be the p99-only one: the
    timer search starts from the tightest bound (it once started from the loosest and settled on timer 0,
    3.4× the power, at light load where only a timer can meet a p99 SLO)."""
    p = BatchingProblem.basic(rho=0.03)
    lams = [p.lam, 0.9 * p.lam]
    one = optimise(p, {"p99": 30.0}, lams, requests=5_000, families=("smdp",), defaults=False).best["smdp"]
    two = optimise(p, {"p99": 30.0, "mean": 1e6}, lams, requests=5_000, families=("smdp",), defaults=False).best["smdp"]
    assert one.meets and two.meets and one.knobs["tau_ms"] > 0
    assert two.spec == one.spec and two.power_w == pytest.approx(one.power_w, rel=1e-12)


# ------------------------------------------------------------------ one answer in every command
def test_compare_pareto_and_export_give_the_same_answer(tmp_path, capsys):
    scen = ["--rho", "0.5", "--slo-p99-ms", "20", "--requests", REQ, "--seed", "4"]
    rc, out, err = _run(["compare", *scen, "--json"], capsys)
    assert rc == 0, err
    cmp_ = json.loads(out)
    rc, out, err = _run(["pareto", *scen, "--no-baselines", "--no-timeouts", "--json"], capsys)
    assert rc == 0, err
    par = json.loads(out)["fronts"][0]["slo_answer"]
    assert par["recommended"] == cmp_["recommended"] and par["best"] == cmp_["best"]
    table = tmp_path / "t.h5"
    assert main(["solve", "--rho", "0.5", "-o", str(table)]) == 0
    capsys.readouterr()
    for target, family in (("triton", "triton-preferred"), ("ray", "ray"), ("tfserving", "tfserving")):
        rc, out, err = _run(["export", str(table), "--to", target, "--slo-p99-ms", "20", "--requests", REQ, "--seed", "4",
                             "--json"], capsys)
        assert rc == 0, err
        ex = json.loads(out)
        assert ex["rule"] == cmp_["best"][family]["setting"]
        assert ex["slo_search"]["best"][family] == cmp_["best"][family]


def test_export_with_an_slo_and_a_load_range_meets_it_at_every_load(tmp_path, capsys):
    table = tmp_path / "t.h5"
    assert main(["solve", "--rho", "0.6", "-o", str(table)]) == 0
    capsys.readouterr()
    p = BatchingProblem.basic(rho=0.6)
    top = p.lam * 1e3
    rng = f"{top / 3:.6g}:{top:.6g}"
    out_cfg = tmp_path / "config.pbtxt"
    rc, out, err = _run(["export", str(table), "--to", "triton", "--slo-p99-ms", "15", "--load-range", rng, "--requests",
                         "50000", "-o", str(out_cfg), "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert "preferred_batch_size" in out_cfg.read_text() and d["settings"]["preferred_batch_size"]
    rule = parse_rule(d["rule"], p)
    loads = [x["lam"] for x in d["slo_search"]["best"]["triton-preferred"]["loads"]]
    assert len(loads) >= 5
    for lam in (loads[0], loads[-1]):  # the off-peak end and the peak, fresh seed
        r = simulate(p.replace(lam=lam), rule, requests=300_000, seed=12)
        assert r.percentiles["p99_ms"] <= 15.0
    # the text prints every load and the worst one
    rc, out, err = _run(["export", str(table), "--to", "ray", "--slo-p99-ms", "15", "--load-range", rng, "--requests",
                         REQ], capsys)
    assert rc == 0, err
    assert out.count("  load ") >= 5 and "worst load" in out and "@serve.batch" in out


def test_export_without_an_slo_warns_when_the_tail_grows_off_peak(tmp_path, capsys):
    table = tmp_path / "t.h5"
    assert main(["solve", "--rho", "0.8", "--w2", "3", "-o", str(table)]) == 0
    capsys.readouterr()
    rc, out, err = _run(["export", str(table), "--to", "ray", "--requests", REQ, "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert [r["share"] for r in d["off_peak"]["loads"]] == [0.5, 0.1]
    grows = max(r["p99_ms"] for r in d["off_peak"]["loads"]) > 2 * d["off_peak"]["planned_p99_ms"]
    assert (d["off_peak"]["warning"] is not None) == grows
    if grows:
        assert "warning:" in err and "--load-range" in err


def test_export_refuses_an_slo_no_setting_meets(tmp_path, capsys):
    table = tmp_path / "t.h5"
    assert main(["solve", "--rho", "0.5", "-o", str(table)]) == 0
    capsys.readouterr()
    rc, out, err = _run(["export", str(table), "--to", "triton", "--slo-p99-ms", "1.5", "--requests", REQ], capsys)
    assert rc == 2 and err.count("\n") == 1 and "no triton setting meets p99 ≤ 1.5 ms" in err


@pytest.mark.parametrize("args, what", [
    (["compare", "--slo-p99-ms", "0.5"], "below the fastest possible"),
    (["compare", "--slo", "p98:20"], "unknown SLO metric"),
    (["compare", "--slo", "p99:20", "--slo-p99-ms", "25"], "conflicting SLOs"),
    (["compare", "--slo", "p99"], "METRIC:MS"),
    (["compare", "--slo-p99-ms", "20", "--load-range", "1500:500"], "inverted"),
    (["compare", "--slo-p99-ms", "20", "--load-range", "800:800"], "empty"),
    (["compare", "--slo-p99-ms", "20", "--load-range", "500:"], "--load-range"),
    (["compare", "--slo-p99-ms", "20", "--load-range", "500:5000"], "ρ = 1.69 ≥ 1"),
    (["compare", "--slo-p99-ms", "20", "--rho-range", "0.2:1.0"], "≥ 1"),
    (["compare", "--slo-p99-ms", "20", "--rho", "0.4", "--rho-range", "0.2:0.5"], "not both"),
    (["compare", "--slo-p99-ms", "20", "--load-range", "500:1000", "--rho-range", "0.2:0.5"], "not both"),
    (["compare"], "give an SLO"),
    (["pareto", "--slo-p99-ms", "20", "--load-range", "500:1000", "--rho-grid", "0.3,0.5"], "one scenario"),
])
def test_bad_slo_input_is_one_line_and_exit_2(args, what, capsys):
    rc, out, err = _run(args, capsys)
    assert rc == 2 and err.count("\n") == 1 and what in err, err


def test_compare_words_the_difference_never_a_signed_number(capsys):
    rc, out, err = _run(["compare", "--rho", "0.5", "--slo-p99-ms", "20", "--requests", REQ], capsys)
    assert rc == 0, err
    assert "+-" not in out and "vs best" in out and "vs default" in out
    assert "W (" in out and ("less than" in out or "more than" in out or "same power" in out)


def test_measured_profile_plans_with_its_spread(tmp_path, capsys):
    prof = tmp_path / "p.csv"
    rng = np.random.default_rng(0)
    rows = ["batch_size,latency_ms,energy_mj"]
    for b in (1, 2, 4, 8):
        for x in 1.0 + 0.1 * b + rng.normal(0, 0.2, 30).clip(-0.5, 0.5):
            rows.append(f"{b},{x:.5f},{40 * x:.5f}")
    prof.write_text("\n".join(rows) + "\n")
    base = ["evaluate", "--policy", "greedy", "--latency", f"csv:{prof}", "--energy", f"csv:{prof}",
            "--batch-sizes", "1,2,4,8", "--rho", "0.4", "--json"]
    rc, out, err = _run(base, capsys)
    assert rc == 0, err
    assert json.loads(out)["service"].startswith("gamma:") and "measured batch times" in err
    rc, out, err = _run(base + ["--service", "det"], capsys)
    assert rc == 0, err
    assert json.loads(out)["service"] == "det" and "warning:" in err and "CV" in err


# ------------------------------------------------------------------ the exact tail of a table
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_simulated_p99_agrees_with_the_exact_response_time_law(rho):
    """Transform inversion of the tagged request's law (no shared code with the simulator) against 4·10⁶
    simulated requests: p99 and p95 within 1 %, and the exact W̄ from the law's transform to 1e-8."""
    from smdp_batch.solvers.evaluation import evaluate_deployed

    p = BatchingProblem.basic(rho=rho)
    sol = solve(p)
    pol = np.asarray(sol.policy)[: sol.s_max + 1]
    law = sojourn_law(p, pol)
    assert law.mean() == pytest.approx(evaluate_deployed(p, pol).mean_latency_ms, rel=1e-8)
    sim = simulate(p, pol, requests=4_000_000, seed=21)
    for q, key in ((0.99, "p99_ms"), (0.95, "p95_ms")):
        assert sim.percentiles[key] == pytest.approx(law.quantile(q), rel=0.01)


@pytest.mark.slow
def test_simulated_p99_agrees_with_the_exact_law_under_exponential_service():
    """Batch sizes 1..16 (s_max 128): the same check as at Bmax 32, whose exponential-service table runs to
    s_max 1024 and whose exact law then takes ~45 s to invert (the simulator agreed there too, within 0.7 %)."""
    p = BatchingProblem.basic(rho=0.5, service="exp").replace(batch_sizes=tuple(range(1, 17)))
    sol = solve(p)
    pol = np.asarray(sol.policy)[: sol.s_max + 1]
    law = sojourn_law(p, pol)
    sim = simulate(p, pol, requests=4_000_000, seed=21)
    assert sim.percentiles["p99_ms"] == pytest.approx(law.quantile(0.99), rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["triton", "tfserving", "ray", "torchserve"])
def test_every_export_over_a_load_range_meets_its_slo_at_every_load_in_a_fresh_million_requests(target, tmp_path, capsys):
    """HI/LO = 3: the exported config of each server meets p99 ≤ 15 ms at each of the ≥ 5 loads checked, in a
    10⁶-request simulation of that server's rule with another seed (the off-peak end included)."""
    table = tmp_path / "t.h5"
    assert main(["solve", "--rho", "0.6", "-o", str(table)]) == 0
    capsys.readouterr()
    p = BatchingProblem.basic(rho=0.6)
    rng = f"{p.lam * 1e3 / 3:.6g}:{p.lam * 1e3:.6g}"
    rc, out, err = _run(["export", str(table), "--to", target, "--slo-p99-ms", "15", "--load-range", rng, "--json"],
                        capsys)
    assert rc == 0, err
    d = json.loads(out)
    rule = parse_rule(d["rule"], p)
    (setting,) = d["slo_search"]["best"].values()  # the target's own rule family, searched alone
    assert setting["setting"] == d["rule"] and setting["meets_slo"]
    loads = [x["lam"] for x in setting["loads"]]
    assert len(loads) >= 5 and loads[0] == pytest.approx(p.lam / 3, rel=1e-5)
    for lam in loads:
        r = simulate(p.replace(lam=lam), rule, requests=1_000_000, seed=2024)
        assert r.percentiles["p99_ms"] <= 15.0, (target, lam)


@pytest.mark.slow
def test_the_runtime_batcher_runs_a_table_plus_timer_as_the_simulator_does():
    """A real asyncio DynamicBatcher(table, max_wait_ms=τ) serving a stub that sleeps l(b) (time scale 20), on a
    replayed Poisson stream at a load where the timer fires: its batches follow the simulator's table + timer
    on the same arrival times (mean batch within 10 %, forced batches in both)."""
    import asyncio

    from smdp_batch.integrations.loadgen import replay
    from smdp_batch.runtime import DynamicBatcher, PolicyTable

    scale, tau = 20.0, 6.0
    p = BatchingProblem.basic(rho=0.2)
    sol = solve(BatchingProblem.basic(rho=0.6, w2=4.0))  # a table that waits long at this lighter load
    pol = np.asarray(sol.policy)[: sol.s_max + 1]
    arr = poisson_arrivals(p.lam, 300, np.random.default_rng(8))
    lat = dict(zip(p.batch_sizes, p.latency_ms()))
    sizes = []

    async def infer(items):
        sizes.append(len(items))
        await asyncio.sleep(lat[len(items)] * scale / 1000.0)
        return items

    async def main():
        bt = DynamicBatcher(infer, PolicyTable(pol, p.batch_sizes), max_wait_ms=tau * scale)
        out = await replay(bt.submit, arr, scale)
        await bt.close()
        return out, bt.metrics.forced_batches

    (sent, done, results, errors), forced = asyncio.run(main())
    assert errors == 0 and results == list(range(arr.size))
    sim = simulate(p, table_timer(pol, p.batch_sizes, tau), arrivals=arr + 1e-9, warmup=0.0, batches=2)
    assert forced > 0  # the timer fired in the real batcher
    assert np.mean(sizes) == pytest.approx(sim.mean_batch_size, rel=0.10)
    pure = simulate(p, pol, arrivals=arr + 1e-9, warmup=0.0, batches=2)
    assert sim.percentiles["p99_ms"] < pure.percentiles["p99_ms"]  # the timer is what bounds the tail here


def test_a_lambda_bank_of_slo_settings_one_per_band():
    """slo_bank: one table + timer per band, each meeting the SLO over its band; AdaptivePolicy switches between
    them and DynamicBatcher's automatic bound is the current band's timer."""
    from smdp_batch.analysis.bands import slo_bank
    from smdp_batch.runtime import AdaptivePolicy
    from smdp_batch.runtime.batcher import default_max_wait_ms

    p = BatchingProblem.basic(rho=0.6)
    bank, answers = slo_bank(p, {"p99": 15.0}, p.lam / 3, p.lam, bands=2, requests=20_000)
    assert len(bank.tables) == 2 and all(a.best["table+timer"].meets for a in answers)
    for t, a in zip(bank.tables, answers):
        lo, hi = t.meta["band_per_ms"]
        assert lo < t.lam < hi and [x.lam for x in a.best["table+timer"].loads][0] == pytest.approx(lo)
        tau = a.best["table+timer"].knobs["tau_ms"]
        assert default_max_wait_ms(t) == (tau if math.isfinite(tau) else default_max_wait_ms(_without_timer(t)))
    ad = AdaptivePolicy(bank, initial_lam=p.lam / 3)
    assert ad.table is bank.tables[0] and default_max_wait_ms(ad) == default_max_wait_ms(bank.tables[0])
    with pytest.raises(InputError, match="bands"):
        slo_bank(p, {"p99": 15.0}, p.lam / 3, p.lam, bands=0)


def _without_timer(t):
    """The same table without its timer (its bound is then the Erlang default)."""
    from smdp_batch.runtime import PolicyTable

    return PolicyTable(t.policy, t.batch_sizes, {"inputs": {"lam": t.lam}})


def test_an_smdp_setting_of_compare_runs_in_simulate(capsys):
    """compare names an SMDP answer smdp:w2=X+timer:MS; simulate --policy solves that table and runs it alike."""
    rc, out, err = _run(["compare", "--rho", "0.5", "--slo-p99-ms", "12.6", "--requests", REQ, "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)["best"]["smdp"]
    assert s["setting"].startswith("smdp:w2=")
    rc, out, err = _run(["simulate", "--policy", s["setting"], "--rho", "0.5", "--requests", REQ, "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["mean_power_w"] == pytest.approx(s["mean_power_w"], abs=2 * s["mean_power_ci_w"])
    for bad, what in (("smdp:w2=x", "w2 must be a number"), ("smdp:foo=1", "unknown setting"),
                      ("smdp:bmax=4", "needs w2"), ("smdp:w2=1+timer:-1", "timer")):
        rc, out, err = _run(["simulate", "--policy", bad, "--rho", "0.5", "--requests", "1000"], capsys)
        assert rc == 2 and what in err and err.count("\n") == 1, err
