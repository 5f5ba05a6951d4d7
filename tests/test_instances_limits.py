"""The c-server model's state limit, raised on purpose (``max_states``, ``solve --max-states``), and the LU column
ordering the solver picks by size: same answers, one-line refusals.  The limit is patched down to 2 000 states so
that a model of 3 612 states growing to 5 404 (2 instances, six sizes, exponential times, ρ 0.5) stands for one
past it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.multi_server import MULTI_STATE_MAX
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers import multi_system
from smdp_batch.solvers.multi_pi import evaluate_instances_table, solve_instances

SIX = dict(service="exp", batch_sizes="1,2,4,8,16,32", instances=2)


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr("smdp_batch.model.multi_server.MULTI_STATE_LIMIT", 2_000)


def test_a_model_past_the_limit_is_refused_and_solved_when_the_limit_is_raised(small_limit, monkeypatch):
    p = BatchingProblem.from_rho(0.5, **SIX)
    with pytest.raises(InputError, match=r"3612 states, over the limit 2000; .* or raise the limit \(--max-states S"):
        solve_instances(p)
    raised = solve_instances(p, max_states=20_000)
    ev = evaluate_instances_table(p, raised.table, n_max=raised.n_max, max_states=20_000)
    monkeypatch.setattr("smdp_batch.model.multi_server.MULTI_STATE_LIMIT", 60_000)
    plain = solve_instances(p)
    assert raised.converged and raised.states == plain.states
    assert raised.optimal.avg_cost == plain.optimal.avg_cost and np.array_equal(raised.table, plain.table)
    assert ev.avg_cost == pytest.approx(plain.table_eval.avg_cost, rel=1e-12)


def test_a_raised_limit_still_binds_and_is_checked(small_limit):
    p = BatchingProblem.from_rho(0.5, **SIX)
    with pytest.raises(InputError, match="3612 states, over the limit 3000; use fewer sizes"):
        solve_instances(p, max_states=3_000)
    for bad in (1_999, MULTI_STATE_MAX + 1, 2.5e4, True, "30000"):
        with pytest.raises(InputError, match="the most states must be an integer from 2000 to 10000000"):
            solve_instances(p, max_states=bad)


def test_both_column_orderings_give_the_same_answer(monkeypatch):
    """COLAMD from COLAMD_FROM states on, minimum degree below: only the time differs."""
    p = BatchingProblem.from_rho(0.7, **SIX)
    monkeypatch.setattr(multi_system, "COLAMD_FROM", 10**9)
    mmd = solve_instances(p)
    monkeypatch.setattr(multi_system, "COLAMD_FROM", 0)
    col = solve_instances(p)
    assert col.optimal.avg_cost == pytest.approx(mmd.optimal.avg_cost, rel=1e-11)
    assert np.array_equal(col.table, mmd.table) and col.iterations == mmd.iterations


def test_the_command_raises_the_limit_writes_the_table_and_evaluates_it(small_limit, tmp_path, capsys):
    out = str(tmp_path / "t.h5")
    args = ["solve", "--instances", "2", "--batch-sizes", "1,2,4,8,16,32", "--service", "exp", "--rho", "0.5"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over the limit 2000" in err[0] and "--max-states S" in err[0]
    assert main(args + ["--max-states", "60000", "-o", out, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["states"] == 5404 and d["converged"]
    assert main(["evaluate", "--policy", out, "--json"]) == 0  # priced on the file's own truncation
    e = json.loads(capsys.readouterr().out)
    assert e["objective"] == pytest.approx(d["table_eval"]["avg_cost"], rel=1e-9)


@pytest.mark.parametrize("args, why", [
    (["--max-states", "70000"], "got --max-states with one instance"),
    (["--instances", "2", "--max-states", "5"], "--max-states must be ≥ 60000"),
    (["--instances", "2", "--max-states", "1e9"], "--max-states must be"),
    (["--arrivals", "mmpp:1,2,0.1,0.1", "--max-states", "70000"], "cannot be combined with --max-states"),
])
def test_bad_max_states_on_the_command_line_is_one_line(args, why, capsys):
    assert main(["solve", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err
