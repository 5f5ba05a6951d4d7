"""Contention between instances on one device (runtime/contention.py): the spec and its checks, the simulator's
batches that slow each other against the exact c-server evaluation, the table the solve gives, and the c-server
file that carries it.  The CTMC and LP checks of the solver with contention are in tests/test_instances_solver.py."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from smdp_batch.analysis.simulate import response_times, simulate
from smdp_batch.baselines.servers import parse_rule
from smdp_batch.cli import main
from smdp_batch.errors import InputError, PolicyFileError
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime.contention import Contention, parse_contention
from smdp_batch.runtime.schema import read_policy
from smdp_batch.solvers.multi_pi import evaluate_instances_table, solve_instances

SPEC = "2:1.5:0.8"


def _problem(c=2, spec=SPEC, rho=0.7, service="exp", sizes="1,2,4,8"):
    return BatchingProblem.from_rho(rho, service=service, batch_sizes=sizes, instances=c, contention=spec)


def test_the_spec_reads_back_and_counts_in_the_stable_rate():
    c = parse_contention("2:1.4,3:1.9:0.95")
    assert c.latency == (1.0, 1.4, 1.9) and c.energy == (1.0, 1.0, 0.95) and c.levels == 3
    assert parse_contention(c.spec()) == c and parse_contention("1:1,2:1.4,3:1.9:0.95") == c
    assert parse_contention("none") is None and parse_contention(None) is None
    p = _problem(3, "2:1.4,3:1.9:0.95", rho=0.5)
    assert p.max_lam == pytest.approx(3 * 8 / (1.9 * float(p.latency_ms()[-1])), rel=1e-12)
    assert p.rho == pytest.approx(0.5, rel=1e-12) and p.describe()["contention"] == "2:1.4,3:1.9:0.95"
    assert p.replace(instances=2).max_lam == pytest.approx(2 * 8 / (1.4 * float(p.latency_ms()[-1])), rel=1e-12)


@pytest.mark.parametrize("spec,match", [
    ("2:x", "not K:S or K:S:E"), ("3:1.5", "K = 2, 3, … in order"), ("2:0.9", "never runs faster"),
    ("2:2.5", "would serve less than 1"), ("2:1.5:0", r"energy factor at 2 busy instances must be a number in \(0"),
    ("2:inf", "finite"), ("2:1.5,3:1.4,4:3.0", "would serve less than 3"), ("2:1.5:1:1", "not K:S or K:S:E"),
])
def test_bad_specs_are_one_line(spec, match):
    with pytest.raises(InputError, match=match):
        parse_contention(spec)


def test_a_spec_must_cover_every_count():
    with pytest.raises(InputError, match="factors up to 2 busy instances, but 3 instances"):
        _problem(3, "2:1.5")
    with pytest.raises(InputError, match="at 1 busy instance must be 1"):
        Contention((1.2, 1.5), (1.0, 1.0))


@pytest.mark.parametrize("args,match", [
    (["solve", "--contention", "2:1.5"], "add --instances c > 1"),
    (["simulate", "--policy", "static:8", "--contention", "2:1.5"], "add --instances c > 1"),
    (["compare", "--slo-p99-ms", "20", "--contention", "2:1.5"], "add --instances c > 1"),
    (["solve", "--instances", "3", "--contention", "2:1.5"], "factors up to 2 busy instances"),
    (["solve", "--instances", "2", "--contention", "2:1.5,zz"], "not K:S or K:S:E"),
    (["solve", "--arrivals", "mmpp:1,2,0.1,0.1", "--contention", "2:1.5"], "cannot be combined with --contention"),
    (["simulate", "--policy", "ray:max=8,timeout_s=0.002", "--instances", "2", "--contention", "2:1.5",
      "--requests", "1000"], "replicas with contention is not simulated"),
])
def test_bad_command_lines_are_one_line_and_exit_2(capsys, args, match):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_contention_of_one_is_the_plain_simulation_to_the_request():
    plain = BatchingProblem.from_rho(0.8, batch_sizes=tuple(range(1, 9)), instances=3, service="gamma:2")
    flat = plain.replace(contention="2:1,3:1")
    arr = np.cumsum(np.random.default_rng(5).exponential(1 / plain.lam, 50_000))
    for rule in (np.array([0, 1, 2, 2, 4, 4, 4, 4, 8]), parse_rule("triton:max=8,delay_us=1000", plain)):
        a, b = response_times(plain, rule, arr, seed=2), response_times(flat, rule, arr, seed=2)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("c,spec", [(2, SPEC), (3, "2:1.3,3:1.8:1.2")])
def test_the_simulated_table_matches_its_exact_evaluation_under_contention(c, spec):
    p = _problem(c, spec)
    sol = solve_instances(p, idle_power_w=4.0)
    sim = simulate(p, np.asarray(sol.table), requests=400_000, seed=11, idle_power_w=4.0)
    ev = sol.table_eval
    assert abs(sim.mean_latency_ms - ev.mean_latency_ms) <= 3 * sim.mean_latency_ci
    assert abs(sim.mean_power_w - ev.mean_power_w) <= 3 * sim.mean_power_ci
    assert sim.mean_batch_size == pytest.approx(ev.mean_batch, rel=0.01)


def test_contention_slows_a_server_rule_and_the_simulator_sees_it():
    plain = BatchingProblem.from_rho(0.5, batch_sizes=tuple(range(1, 9)), instances=2, service="det")
    slow = plain.replace(contention="2:1.6")
    rule = parse_rule("triton:max=8,delay_us=2000", plain)
    a, b = simulate(plain, rule, requests=100_000, seed=1), simulate(slow, rule, requests=100_000, seed=1)
    assert b.mean_latency_ms > a.mean_latency_ms + 3 * (a.mean_latency_ci + b.mean_latency_ci)
    assert b.throughput == pytest.approx(a.throughput, rel=0.02)  # the same load is served


@pytest.mark.parametrize("c,spec", [(2, SPEC), (3, "2:1.3,3:1.8:1.2")])
def test_the_solved_table_beats_the_one_instance_table_shared(c, spec):
    """The optimal policy's projection alone lost here: ĝ 50.10 against 49.53 (c = 2), and 112.5 against 81.3
    (c = 3, where it waited at n = 9..107 because the optimum keeps the third instance idle beside two busy)."""
    p = _problem(c, spec)
    sol = solve_instances(p, idle_power_w=4.0)
    one = solve_instances(p.replace(instances=1, lam=p.lam / c))
    shared = evaluate_instances_table(p, one.table, n_max=sol.n_max, idle_power_w=4.0)
    assert sol.table_eval.avg_cost < shared.avg_cost
    assert sol.optimal.avg_cost <= sol.table_eval.avg_cost


def test_solve_prices_no_split_under_contention(capsys):
    assert main(["solve", "--instances", "2", "--contention", SPEC, "--rho", "0.7", "--batch-sizes", "1,2,4,8",
                 "--service", "exp"]) == 0
    out = capsys.readouterr().out
    assert "contention 2 busy ×1.5 time, ×0.8 energy" in out and "not priced  split over 2 queues" in out
    assert main(["solve", "--instances", "2", "--contention", SPEC, "--rho", "0.7", "--batch-sizes", "1,2,4,8",
                 "--service", "exp", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["split_evenly"] is None and d["problem"]["contention"] == SPEC


def test_a_file_carries_its_contention(tmp_path, capsys):
    path = str(tmp_path / "c.h5")
    args = ["--instances", "2", "--contention", SPEC, "--rho", "0.7", "--batch-sizes", "1,2,4,8", "--service", "exp"]
    assert main(["solve", *args, "-o", path]) == 0
    capsys.readouterr()
    pf = read_policy(path)
    assert pf.inputs["contention"] == SPEC
    sol = solve_instances(_problem())
    assert main(["evaluate", "--policy", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["avg_cost"] == pytest.approx(sol.table_eval.avg_cost, rel=1e-9)
    assert main(["simulate", "--policy", path, "--requests", "50000", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    direct = simulate(_problem(), np.asarray(sol.table), requests=50_000, seed=0)
    assert s["mean_latency_ms"] == pytest.approx(direct.mean_latency_ms, rel=1e-12)
    bad = tmp_path / "bad.h5"
    bad.write_bytes(open(path, "rb").read())
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["contention"] = "2:1.5:0.9"
    with pytest.raises(PolicyFileError, match="checksum"):
        read_policy(bad)
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["contention"] = "2:1.6"
    with pytest.raises(PolicyFileError, match="rho"):  # ρ counts s_c
        read_policy(bad)
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["contention"] = "2:9"
    with pytest.raises(PolicyFileError, match="contention"):
        read_policy(bad)


def test_compare_runs_contending_instances_and_names_the_contention_to_solve_with(capsys):
    args = ["compare", "--instances", "2", "--contention", SPEC, "--slo-p99-ms", "30", "--rho", "0.5",
            "--batch-sizes", "1,2,4", "--service", "exp", "--requests", "4000"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "not tried   ray: its replicas, each with its own queue, are not simulated with contention" in out
    assert "ray              no setting" not in out
    from types import SimpleNamespace

    from smdp_batch.analysis.table_candidates import instances_tables
    from smdp_batch.cli.slo import _deploy

    p = _problem(2, SPEC, rho=0.5, sizes="1,2,4")
    tables, why = instances_tables(p, p.lam, False)
    assert tables and not why
    for cand in tables:  # each c-server table's run-it line solves it with the contention it was solved with
        line = _deploy(SimpleNamespace(knobs={**cand.knobs, "tau_ms": 5.0}, spec=cand.name), 2)
        assert f"--instances 2 --contention {SPEC}" in line and "instances=2" in line
