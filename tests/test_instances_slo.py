"""The SLO optimiser on c instances sharing one queue: the c-server SMDP's tables are tried beside the one-instance
tables at λ/c and the servers' rules, all simulated on the c instances; compare --instances prints how to run
the answer on them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smdp_batch.analysis import slo as slo_mod
from smdp_batch.analysis.slo import optimise
from smdp_batch.analysis.table_candidates import instances_model, instances_tables
from smdp_batch.cli import main
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers.multi_pi import solve_instances


def _problem(**kw):
    return BatchingProblem.from_rho(kw.pop("rho", 0.7), instances=kw.pop("c", 2), service=kw.pop("service", "exp"),
                                    batch_sizes=kw.pop("sizes", "1,2,4,8"), **kw)


def test_the_c_server_front_holds_each_distinct_optimal_table_once():
    p = _problem()
    cands, why = instances_tables(p, p.lam, False)
    assert why == "" and len(cands) >= 3
    assert len({tuple(c.policy) for c in cands}) == len(cands)
    for c in cands:
        assert c.name.startswith("smdp-c2:w2=") and c.knobs["instances"] == 2 and c.knobs["solve_lam"] == p.lam
        again = solve_instances(p.replace(w2=c.knobs["w2"]))  # an exact model (exp): the problem's own sizes
        np.testing.assert_array_equal(again.table, c.policy)
    # smaller w2 serves sooner: the first table starts a batch at a queue length where the last one still waits
    first, last = cands[0].policy, cands[-1].policy
    assert any(a > 0 and b == 0 for a, b in zip(first, last))


def test_a_model_past_the_limits_is_coarsened_until_it_solves_and_says_so():
    q = _problem(rho=0.5, service="det", sizes=",".join(map(str, range(1, 17))))
    sizes, phases, why = instances_model(q)
    assert why == "" and sizes == (1, 2, 4, 8, 16) and phases is not None and phases < 8
    solve_instances(q.replace(batch_sizes=sizes), phases=phases)  # it converges (throw=True)
    assert instances_model(_problem()) == ((1, 2, 4, 8), None, "")  # exact law, every size: nothing to coarsen


def test_the_optimiser_on_c_instances_tries_the_c_server_tables_and_never_loses_to_triton(monkeypatch):
    tried: list[str] = []
    run = slo_mod._Checker.run

    def spy(self, family, rule, knobs, full=False, policy=None, workers=1):
        tried.append(rule.spec)  # (list.append is atomic: the families run on threads)
        return run(self, family, rule, knobs, full, policy, workers)

    monkeypatch.setattr(slo_mod._Checker, "run", spy)
    p = _problem()
    a = optimise(p, {"p99": 25.0}, requests=20_000, seed=0)
    assert any(s.startswith("smdp-c2:") for s in tried)  # the c-server front
    assert any(",lam=" in s and s.startswith("smdp:") for s in tried)  # the one-instance tables at λ/c
    assert "torchserve" not in a.best and not any(d.spec.startswith("torchserve") for d in a.defaults)
    tt, tri = a.best["table+timer"], a.best["triton"]
    assert tt is not None and tri is not None and tt.power_w <= tri.power_w
    assert all(x.power_w < np.inf for x in tt.loads)


def test_compare_with_instances_says_how_to_run_the_answer_on_them(capsys):
    args = ["compare", "--instances", "2", "--rho", "0.7", "--service", "exp", "--batch-sizes", "1,2,4,8",
            "--slo-p99-ms", "25", "--requests", "20000"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 instances sharing the queue" in out and "instances=2" in out
    assert "not tried   torchserve" in out and "inf W" not in out and "nan %" not in out
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["instances"] == 2 and "torchserve" not in d["best"]


@pytest.mark.parametrize("bad", ["0", "65", "2.5", "Auto2"])
def test_compare_refuses_a_bad_instance_count_in_one_line(capsys, bad):
    assert main(["compare", "--instances", bad, "--slo-p99-ms", "25"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--instances" in err


def test_the_simulators_idle_power_equals_the_exact_c_server_evaluation():
    from smdp_batch.analysis.simulate import simulate
    from smdp_batch.solvers.multi_pi import evaluate_instances_table

    p = _problem(rho=0.5)
    table = np.array([0, 0, 0, 0, 4, 4, 4, 4, 8])
    bare = simulate(p, table, requests=400_000, seed=0)
    idle = simulate(p, table, requests=400_000, seed=0, idle_power_w=10.0)
    exact = evaluate_instances_table(p, table, idle_power_w=10.0)
    assert idle.mean_latency_ms == bare.mean_latency_ms  # the same run, only P̄ gains the idle draw
    assert idle.mean_power_w - bare.mean_power_w == pytest.approx(exact.idle_power_w, rel=0.01)
    assert abs(idle.mean_power_w - exact.mean_power_w) <= 3 * idle.mean_power_ci
    with pytest.raises(Exception, match="idle power must be a number of W ≥ 0"):
        simulate(p, table, requests=1000, idle_power_w=-1.0)


def test_compare_auto_picks_the_count_of_least_power_with_idle_power(capsys):
    args = ["compare", "--instances", "auto", "--lam", "2.5", "--service", "exp", "--batch-sizes", "4,8",
            "--slo-p99-ms", "40", "--idle-power", "20", "--requests", "20000", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    rows = {r["instances"]: r for r in d["auto"]}
    assert "unstable" in rows[1]["why"]  # λ = 3/ms is past one instance
    tried = [r for r in d["auto"] if "mean_power_w" in r]
    best = min(tried, key=lambda r: r["mean_power_w"])
    assert d["instances"] == best["instances"] == 2 and best["chosen"]
    assert d["idle_power_w"] == 20.0
    # idle instances cost power: each count past the best draws more
    assert all(r["mean_power_w"] > best["mean_power_w"] for r in tried if r["instances"] > 2)


@pytest.mark.parametrize("args,match", [
    (["--instances", "auto", "--rho", "0.5"], "not --rho or --rho-range"),
    (["--instances", "auto"], "give it as --lam"),
    (["--instances", "2", "--idle-power", "-3"], "--idle-power"),
])
def test_compare_auto_refuses_a_per_instance_load_in_one_line(capsys, args, match):
    assert main(["compare", *args, "--slo-p99-ms", "30"]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
