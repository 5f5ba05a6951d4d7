"""The fast SLO search: its shortcuts never change what it answers.

* the service draws kept for the next run on the same random numbers give the same runs to the bit;
* the screen (a candidate failed on the first 1/8 of each stream where it plainly misses there) gives the answer
  the whole streams give, setting for setting;
* an SLO out of reach is answered without a search, naming the least any setting reached; a search with the
  pre-check switched off finds nothing there either (the pre-check's margin is checked, not assumed);
* a p99 that batches of Bmax cannot meet is met with a smaller largest batch where one can.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from smdp_batch.analysis import sim_draws, slo
from smdp_batch.analysis.simulate import simulate
from smdp_batch.analysis.slo import optimise
from smdp_batch.baselines.servers import triton
from smdp_batch.cli import main
from smdp_batch.model.problem import BatchingProblem

PROFILE = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "data", "onnx_mlp_cpu.csv")


def _onnx(rho: float = 0.5) -> BatchingProblem:
    return BatchingProblem.from_rho(rho, batch_sizes=(1, 2, 4, 8, 16, 32), latency=f"csv:{PROFILE}",
                                    energy=f"csv:{PROFILE}", service=f"empirical:{PROFILE}")


def _figures(r) -> tuple:
    return (r.mean_latency_ms, r.mean_power_w, r.percentiles["p99_ms"], r.percentile_ci["p99_ms"],
            tuple(sorted(r.batch_size_counts.items())))


def test_kept_draws_give_the_same_run_to_the_bit(monkeypatch):
    """A run that finds its pools kept equals one that draws them, per-size law and shared law alike; a run that
    shifts the pools (a served-delay model's per-batch time) leaves the kept ones as they were."""
    from smdp_batch.model.served import ServedDelay

    for p in (_onnx(), BatchingProblem.basic(rho=0.5, service="gamma:0.5")):
        rule = triton(32, 2000.0, (), () if p.batch_sizes == tuple(range(1, 33)) else p.batch_sizes)
        sim_draws._CACHE.clear()
        fresh = _figures(simulate(p, rule, requests=30_000, seed=3))
        assert sim_draws._CACHE, "the pools were not kept"
        again = _figures(simulate(p, rule, requests=30_000, seed=3))
        assert again == fresh
        sd = ServedDelay(a_ms=0.4, c_ms=0.05, return_ms=0.0, loads_per_s=(p.lam * 1e3,),
                         outside_ms=(np.full(50, 0.1),), carried_per_s=1e9)
        shifted = simulate(p, rule, requests=30_000, seed=3, served=sd)
        assert shifted.mean_latency_ms > fresh[0]
        assert _figures(simulate(p, rule, requests=30_000, seed=3)) == fresh
        monkeypatch.setattr(sim_draws, "CACHE_BYTES", 0)  # nothing kept: drawn again, the same run
        sim_draws._CACHE.clear()
        assert _figures(simulate(p, rule, requests=30_000, seed=3)) == fresh
        monkeypatch.undo()


@pytest.mark.parametrize("problem, bound", [(_onnx(), 4.78), (BatchingProblem.preset("fig9-hyperexp", rho=0.5), 79.22)])
def test_the_screen_gives_the_answer_the_whole_streams_give(monkeypatch, problem, bound):
    """With 160 000 requests a load (a screen of 20 000), the search answers what it answers without the screen,
    setting for setting (hyperexponential times included, where a screen that also accepted settings picked a
    worse one), with fewer whole-stream simulations."""
    ran: list[int] = []
    real = slo._Checker._load

    def counted(self, i, rule, arrivals):
        ran.append(arrivals.size)
        return real(self, i, rule, arrivals)

    monkeypatch.setattr(slo._Checker, "_load", counted)
    with_screen = optimise(problem, {"p99": bound}, requests=160_000)
    whole_with = sum(n == 160_000 for n in ran)
    assert any(n == 20_000 for n in ran), "the screen did not run"
    ran.clear()
    monkeypatch.setattr(slo, "SCREEN_MIN", 10**9)
    without = optimise(problem, {"p99": bound}, requests=160_000)
    assert all(n in (160_000, 800_000) for n in ran)  # the whole streams, and the fresh check of the answer
    assert whole_with < sum(n == 160_000 for n in ran)
    for fam, s in with_screen.best.items():
        t = without.best[fam]
        assert (s is None) == (t is None), fam
        assert s is None or (s.spec == t.spec and s.loads == t.loads), fam  # the same setting, the same figures


def test_an_slo_out_of_reach_is_answered_without_a_search(capsys):
    """Heavy-tailed batch times, p99 ≤ 40 ms: even serving at once misses it, so the answer comes from a handful of
    simulations and names the least p99 reached, by what, and the bound that could be met."""
    p = BatchingProblem.basic(rho=0.5, service="lognormal:1")
    ans = optimise(p, {"p99": 40.0}, requests=100_000)
    assert ans.out_of_reach and ans.recommended is None
    assert ans.evaluations <= 12  # the settings that wait least and the 5 defaults, not a search
    r = ans.reach
    assert r["metric"] == "p99" and r["value_ms"] + r["ci_ms"] > 40.0 * (1 + slo.REACH_MARGIN)
    d = ans.as_dict()
    assert d["reach"]["setting"] == r["setting"] and d["out_of_reach"] is True
    rc = main(["compare", "--service", "lognormal:1", "--slo-p99-ms", "40", "--requests", "100000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "reach       at 1479.3 req/s the least p99 is" in out and "nothing else was searched" in out
    assert f"a bound of {r['value_ms'] + r['ci_ms']:.4g} ms or more can be met there" in out
    rc = main(["compare", "--service", "lognormal:1", "--slo-p99-ms", "40", "--requests", "100000", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["reach"]["metric"] == "p99" and doc["out_of_reach"] is True


@pytest.mark.slow
@pytest.mark.parametrize("service", ["gamma:0.5", "hyperexp:0.3/0.2,0.7/1.343"])
def test_nothing_the_search_finds_lies_below_the_pre_checks_reach(monkeypatch, service):
    """Just below where the pre-check calls an SLO out of reach, the whole search (pre-check off) finds nothing
    either: no setting beats the ones that wait least by the pre-check's margin."""
    p = BatchingProblem.basic(rho=0.5, service=service)
    probe = optimise(p, {"p99": 1e4}, requests=50_000, families=("triton",), defaults=False)
    reach = probe.reach["value_ms"] + probe.reach["ci_ms"]
    bound = 0.99 * reach / (1 + slo.REACH_MARGIN)
    monkeypatch.setattr(slo, "REACH_MARGIN", math.inf)
    ans = optimise(p, {"p99": bound}, requests=50_000)
    assert not ans.out_of_reach
    assert ans.recommended is None, (bound, ans.recommended and ans.recommended.spec)
    assert ans.reach["value_ms"] + ans.reach["ci_ms"] > bound


def test_a_p99_batches_of_bmax_cannot_meet_is_met_with_smaller_batches():
    """Lognormal batch times: a long batch of 32 after a backlog breaks p99 ≤ 60 ms under every timer, batches of
    at most 16 meet it; the search says so instead of "no setting meets"."""
    p = BatchingProblem.basic(rho=0.5, service="lognormal:1")
    ans = optimise(p, {"p99": 60.0}, requests=200_000, families=("smdp", "triton"), defaults=False)
    assert ans.best["triton"] is None  # max_batch_size 32, every delay
    s = ans.best["smdp"]
    assert s is not None and max(s.knobs["batch_sizes"]) < 32
    fresh = simulate(p, s.rule, requests=2_000_000, seed=99)  # heavy tails: 2·10⁵ requests do not pin a p99 down
    assert fresh.percentiles["p99_ms"] <= 60.0


def test_every_answer_is_checked_on_a_fresh_stream():
    """The recommendation runs again on the next seed, 5× as long: on the basic scenario it holds; with lognormal
    batch times and 5·10⁴ requests the interval it was chosen on is far too narrow, and the answer says so."""
    from smdp_batch.cli.slo import answer_lines

    ok = optimise(BatchingProblem.basic(rho=0.5), {"p99": 20.0}, requests=50_000)
    assert ok.fresh_holds is True and ok.fresh_requests == 250_000
    d = ok.as_dict()["fresh_check"]
    assert d["seed"] == 1 and d["holds"] is True and len(d["loads"]) == 1
    assert any(ln.startswith("  fresh seed  p99 ") and ln.endswith(": holds") for ln in answer_lines(ok))
    bad = optimise(BatchingProblem.basic(rho=0.5, service="lognormal:1"), {"p99": 103.4}, requests=50_000,
                   families=("smdp", "triton"), defaults=False)
    assert bad.recommended is not None and bad.fresh_holds is False
    assert bad.fresh.loads[0].metrics["p99"] > 103.4
    line = next(ln for ln in answer_lines(bad) if ln.startswith("  fresh seed"))
    assert "BREAKS p99 ≤ 103.4 ms" in line and "more --requests" in line


def _answer_figures(ans) -> tuple:
    fams = tuple((f, None if s is None else (s.spec, s.loads, s.meets)) for f, s in sorted(ans.best.items()))
    dflt = tuple((s.spec, s.loads) for s in ans.defaults)
    fresh = None if ans.fresh is None else (ans.fresh.spec, ans.fresh.loads)
    return fams, dflt, fresh, ans.evaluations, json.dumps(ans.reach, sort_keys=True)


@pytest.mark.parametrize("problem, bound", [(BatchingProblem.basic(rho=0.5), 15.0),
                                            (BatchingProblem.basic(rho=0.5, service="lognormal:1"), 60.0)])
def test_the_search_answers_the_same_on_one_thread_or_several(problem, bound):
    """The families' searches, the defaults' runs and the fresh check run on threads: every setting, figure,
    reach and count is the same with one thread as with three (a range of loads, 20 000 requests each)."""
    lams = [problem.lam * f for f in (0.6, 0.8, 1.0)]
    one = optimise(problem, {"p99": bound}, lams, requests=20_000, workers=1)
    three = optimise(problem, {"p99": bound}, lams, requests=20_000, workers=3)
    assert _answer_figures(one) == _answer_figures(three)
    assert one.recommended is not None


def _blas_counts() -> list[int]:
    from threadpoolctl import ThreadpoolController

    return [lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers]


def test_one_blas_thread_holds_until_the_last_of_overlapping_solves_leaves(monkeypatch):
    """The limit is process-wide and solves overlap on threads: one solve leaving must not give BLAS its
    threads back under another still running; the last to leave restores the counts."""
    from smdp_batch.solvers import threads

    class Lib:  # a BLAS library's controller, as threadpoolctl gives it
        def __init__(self, n: int) -> None:
            self.num_threads = n

        def set_num_threads(self, n: int) -> None:
            self.num_threads = n

    libs = [Lib(2), Lib(4), Lib(1)]
    monkeypatch.setattr(threads, "_libraries", libs)
    first, second = threads.single_blas(), threads.single_blas()
    first.__enter__()
    assert [lib.num_threads for lib in libs] == [1, 1, 1]
    libs[0].num_threads = 2  # as when the count set on another thread did not hold on this one
    second.__enter__()
    assert [lib.num_threads for lib in libs] == [1, 1, 1]  # set again
    first.__exit__(None, None, None)  # the first solve ends while the second runs
    assert [lib.num_threads for lib in libs] == [1, 1, 1]
    second.__exit__(None, None, None)
    assert [lib.num_threads for lib in libs] == [2, 4, 1]
    with threads.single_blas():  # and again, from the counts restored
        assert [lib.num_threads for lib in libs] == [1, 1, 1]
    assert [lib.num_threads for lib in libs] == [2, 4, 1]


def test_the_search_runs_with_one_blas_thread(monkeypatch):
    """OpenBLAS's threads, woken by small calls outside the solves, spin on the cores the search's own threads
    use: the whole search holds BLAS at one thread, and gives the counts back."""
    from threadpoolctl import threadpool_limits

    seen = []
    real = slo._Checker.run

    def spy(self, *args, **kwargs):
        seen.append(_blas_counts())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(slo._Checker, "run", spy)
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_counts()
        optimise(BatchingProblem.basic(rho=0.5), {"p99": 20.0}, requests=20_000, families=("triton",),
                 defaults=False)
        assert seen and all(c == [1] * len(before) for c in seen)
        assert _blas_counts() == before


def test_the_delay_search_stops_where_the_timer_closes_no_batch(monkeypatch):
    """A delay whose timer closed no batch of the stream serves it as any longer one does: the doubling stops
    there, with the answer (setting and figures) the doubling to the cap gives, in fewer runs."""
    import dataclasses

    p = BatchingProblem.basic(rho=0.5)
    families = ("triton", "tfserving", "ray", "torchserve", "smdp")
    fast = optimise(p, {"p99": 1000.0}, requests=20_000, families=families, defaults=False, workers=1)
    real = slo._Checker._load
    monkeypatch.setattr(slo._Checker, "_load", lambda self, *a: dataclasses.replace(real(self, *a), timer_batches=None))
    full = optimise(p, {"p99": 1000.0}, requests=20_000, families=families, defaults=False, workers=1)
    assert fast.evaluations < full.evaluations
    for f in families:
        x, y = fast.best[f], full.best[f]
        assert x is not None and y is not None and x.spec == y.spec
        assert [ld.metrics for ld in x.loads] == [ld.metrics for ld in y.loads]
        assert x.power_w == y.power_w
