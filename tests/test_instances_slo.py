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

    def spy(self, family, rule, knobs, full=False, policy=None):
        tried.append(rule.spec)
        return run(self, family, rule, knobs, full, policy)

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


@pytest.mark.parametrize("bad", ["0", "65", "2.5", "auto"])
def test_compare_refuses_a_bad_instance_count_in_one_line(capsys, bad):
    assert main(["compare", "--instances", bad, "--slo-p99-ms", "25"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--instances" in err
