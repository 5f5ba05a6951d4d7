"""Busy-aware tables (k, n) ↦ b for c instances: what the solve keeps, the simulator against the exact evaluation,
the file that carries the rows, and the command line.  The exact evaluation of such a table against an independent
CTMC is in tests/test_instances_solver.py, the runtime batcher that follows one in tests/test_batcher_instances.py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from smdp_batch.analysis.simulate import response_times, simulate
from smdp_batch.baselines.servers import busy_table_rule, parse_rule, table_timer
from smdp_batch.cli import main
from smdp_batch.errors import InputError, PolicyFileError
from smdp_batch.export.hdf5 import write_instances_policy
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime import PolicyTable
from smdp_batch.runtime.schema import read_policy
from smdp_batch.solvers.multi_pi import BUSY_GAIN, evaluate_instances_table, solve_instances

CASES = [(2, "2:1.5:0.8"), (3, "2:1.3,3:1.8:1.2")]


def _problem(c=2, spec="2:1.5:0.8", rho=0.5, sizes="1,2,4,8"):
    return BatchingProblem.from_rho(rho, service="exp", batch_sizes=sizes, instances=c, contention=spec)


@pytest.fixture(scope="module")
def solved():
    return {case: solve_instances(_problem(*case), idle_power_w=4.0) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_under_contention_the_solve_keeps_a_busy_aware_table_near_the_optimum(solved, case):
    sol = solved[case]
    o, t, b = sol.optimal.avg_cost, sol.table_eval.avg_cost, sol.busy_eval.avg_cost
    assert sol.busy_table.shape == (case[0], sol.n_max + 1)
    assert o <= b < t * (1 - BUSY_GAIN)  # 2–4 % below the table n ↦ b here, within 0.01 % of the optimum
    assert b / o - 1 < 1e-3
    again = evaluate_instances_table(sol.problem, sol.busy_table, idle_power_w=4.0, n_max=sol.n_max)
    assert again.avg_cost == pytest.approx(b, rel=1e-12)
    assert sol.decide(12, busy=0) == sol.busy_table[0, 12] and sol.decide(12) == sol.table[12]


def test_without_contention_a_table_of_n_alone_is_kept():
    sol = solve_instances(BatchingProblem.from_rho(0.7, service="exp", batch_sizes="1,2,4,8", instances=2))
    assert sol.busy_table is None and sol.busy_eval is None  # the table n ↦ b is within 10⁻⁴ of the optimum
    assert sol.to_dict()["busy_table"] is None


@pytest.mark.parametrize("case", CASES)
def test_the_simulated_busy_aware_table_matches_its_exact_evaluation(solved, case):
    sol = solved[case]
    sim = simulate(sol.problem, sol.busy_table, requests=250_000, seed=11, idle_power_w=4.0)
    ev = sol.busy_eval
    assert abs(sim.mean_latency_ms - ev.mean_latency_ms) <= 3 * sim.mean_latency_ci
    assert abs(sim.mean_power_w - ev.mean_power_w) <= 3 * sim.mean_power_ci
    assert sim.mean_batch_size == pytest.approx(ev.mean_batch, rel=0.01)


@pytest.mark.parametrize("spec", [None, "2:1.5:0.8"])
@pytest.mark.parametrize("alone_waits", [True, False])
def test_a_hand_written_busy_aware_table_simulates_to_its_exact_evaluation(spec, alone_waits):
    """Wait for 4 alone and serve at once beside a batch, or the other way round: then a batch's end, where the
    busy count falls while n stays, is the epoch that starts the waiting requests."""
    p = BatchingProblem.from_rho(0.6, service="exp", batch_sizes="1,2,4,8", instances=2, contention=spec)
    table = np.array([[0, 0, 0, 0, 4, 4, 4, 4, 8], [0, 1, 2, 2, 4, 4, 4, 4, 8]])
    table = table if alone_waits else table[::-1]
    ev = evaluate_instances_table(p, table)
    sim = simulate(p, table, requests=250_000, seed=3)
    assert abs(sim.mean_latency_ms - ev.mean_latency_ms) <= 3 * sim.mean_latency_ci
    assert abs(sim.mean_power_w - ev.mean_power_w) <= 3 * sim.mean_power_ci


@pytest.mark.parametrize("spec", [None, "2:1.5:0.8"])
def test_equal_rows_run_exactly_as_the_table_and_an_endless_timer_as_none(spec):
    """A busy-aware table whose rows are all one table decides as that table (batch ends change nothing), request
    by request; with a timer of ∞ it is the pure busy-aware table."""
    p = BatchingProblem.from_rho(0.7, service="exp", batch_sizes="1,2,4,8", instances=2, contention=spec)
    row = np.array([0, 0, 2, 2, 4, 4, 4, 4, 8])
    arr = np.cumsum(np.random.default_rng(2).exponential(1 / p.lam, 20_000))
    plain = response_times(p, row, arr, seed=5)
    assert np.array_equal(response_times(p, np.stack([row, row]), arr, seed=5), plain)
    aware = np.stack([np.array([0, 1, 1, 2, 4, 4, 4, 4, 8]), row])  # beside a batch it waits longer: ends matter
    a = response_times(p, aware, arr, seed=5)
    assert not np.array_equal(a, plain)
    for tau in (np.inf, 1e9):  # a timer that never fires: its loop (batch ends before the deadline) decides alike
        assert np.array_equal(response_times(p, table_timer(aware, p.batch_sizes, tau), arr, seed=5), a)
    for forced in ("largest", "pad"):  # equal rows with a timer that fires: as the table with that timer
        same = response_times(p, table_timer(np.stack([row, row]), p.batch_sizes, 0.5, forced=forced), arr, seed=5)
        assert np.array_equal(same, response_times(p, table_timer(row, p.batch_sizes, 0.5, forced=forced), arr, seed=5))


def test_the_file_carries_the_rows_and_the_readers_follow_them(solved, tmp_path):
    sol = solved[CASES[0]]
    path = tmp_path / "two.h5"
    write_instances_policy(sol, path, 4.0)
    pf = read_policy(path)
    assert pf.integrity == "fletcher32+sha256"
    assert np.array_equal(pf.policy_busy[:, :-1], sol.busy_table)
    assert pf.solution["busy_avg_cost"] == pytest.approx(sol.busy_eval.avg_cost, rel=1e-12)
    table = PolicyTable.load(path)
    assert np.array_equal(table.busy_table, sol.busy_table) and table.instances == 2
    assert [table.decide_busy(n, k) for k in (0, 1) for n in range(40)] == \
        [sol.decide(n, busy=k) for k in (0, 1) for n in range(40)]
    plain = PolicyTable.load(path, busy_aware=False)  # the table n ↦ b alone, as Triton follows it
    assert plain.busy_table is None and [plain.decide_busy(n, 1) for n in range(40)] == list(sol.table[:40])
    rule = parse_rule(str(path), sol.problem)
    assert rule.mode == "busy" and rule.table.size == 2 * (sol.n_max + 1)
    assert parse_rule(f"{path}+timer:5", sol.problem).mode == "timer"


def test_a_tampered_or_misshapen_busy_row_is_caught(solved, tmp_path):
    sol = solved[CASES[0]]
    path = tmp_path / "two.h5"
    write_instances_policy(sol, path, 4.0)
    with h5py.File(path, "r+") as f:  # a wait turned into a start: the digest catches it
        rows = f["policy_busy"][()]
        rows[0, 3] = 2
        del f["policy_busy"]
        f.create_dataset("policy_busy", data=rows, fletcher32=True)
    with pytest.raises(PolicyFileError, match="content checksum mismatch"):
        read_policy(path)
    with h5py.File(path, "r+") as f:
        del f["policy_busy"]
        f.create_dataset("policy_busy", data=rows[:1], fletcher32=True)
    with pytest.raises(PolicyFileError, match=r"policy_busy has shape \(1, \d+\); expected integers of shape \(2,"):
        read_policy(path)


@pytest.mark.parametrize("bad,match", [
    (np.array([[0, 1, 2], [0, 1, 2]]), "one row per busy count"),  # 3 columns where the table has 4 levels
    (np.array([[0, 1, 2, 3]]), "one row per busy count"),
    (np.array([[0, 1, 2, 3], [0, 1, 5, 3]]), "serve between 0 and n"),
])
def test_bad_busy_rows_are_one_line(bad, match):
    with pytest.raises(InputError, match=match):
        PolicyTable([0, 1, 2, 3], busy=bad)
    with pytest.raises(InputError):
        PolicyTable([0, 1, 2, 3], busy=[[0, 1, 2, 3]] * 3, meta={"inputs": {"instances": 2}})


def test_ragged_rows_are_one_line_everywhere():
    p = BatchingProblem.from_rho(0.5, service="exp", batch_sizes="1,2,4,8", instances=2)
    ragged = [[0, 1, 2, 2, 4], [0, 1]]
    for call in (lambda: PolicyTable([0, 1, 2, 2, 4], busy=ragged), lambda: simulate(p, ragged, requests=100),
                 lambda: evaluate_instances_table(p, ragged)):
        with pytest.raises(InputError, match="rows of different lengths"):
            call()


def test_a_busy_aware_table_runs_only_on_its_instance_count():
    from smdp_batch.runtime import DynamicBatcher

    table = PolicyTable([0, 1, 2, 2, 4], busy=[[0, 1, 2, 2, 4], [0, 0, 2, 2, 4]])
    with pytest.raises(ValueError, match="a row per busy count 0..1; pass instances=2 \\(got 3\\)"):
        DynamicBatcher(lambda xs: xs, table, None, instances=3)
    p = BatchingProblem.from_rho(0.5, service="exp", batch_sizes="1,2,4,8", instances=3)
    rule = busy_table_rule(np.array([[0, 1, 2, 2, 4], [0, 0, 2, 2, 4]]), p.batch_sizes)
    with pytest.raises(InputError, match="runs on 2 instances, not 3: simulate it with --instances 2"):
        simulate(p, rule, requests=1000)


def test_solve_prints_and_writes_the_busy_aware_table(capsys, tmp_path):
    out = tmp_path / "b.h5"
    args = ["--instances", "2", "--contention", "2:1.5:0.8", "--service", "exp", "--batch-sizes", "1,2,4,8",
            "--rho", "0.5"]
    assert main(["solve", *args, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "busy-aware table (k, n)" in text and "0 busy: " in text and "1 busy: " in text
    assert "its tables for 2 instances" in text
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "busy-aware  0 busy:" in shown and "what DynamicBatcher(…, instances=2) runs" in shown
    assert main(["simulate", "--policy", str(out), *args, "--requests", "20000", "--json"]) == 0
    capsys.readouterr()
