"""Contention between instances on one device (specs/contention.py): the spec and its checks, the simulator's
batches that slow each other against the exact c-server evaluation, the table the solve gives, and the c-server
file that carries it.  The CTMC and LP checks of the solver with contention are in tests/test_instances_solver.py."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest

from smdp_batch.analysis.simulate import response_times, simulate
from smdp_batch.baselines.servers import parse_rule
from smdp_batch.cli import main
from smdp_batch.errors import InputError, PolicyFileError
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.specs.contention import Contention, parse_contention
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
    # Ray's replicas: fixed times, since the plain loop draws in replica order at each arrival and the contended
    # one in time order (each correct; a random draw would go to another batch)
    det, ray = plain.replace(service="det"), parse_rule("ray:max=8,timeout_s=0.002", plain)
    a, b = response_times(det, ray, arr, seed=2), response_times(det.replace(contention="2:1,3:1"), ray, arr, seed=2)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("c,spec", [(2, SPEC), (3, "2:1.3,3:1.8:1.2"), (2, "1=2:1.9:0.7/8=2:1.1:1.3"),
                                    (3, "1=2:1.6,3:2/8=2:1.2:0.8,3:1.5:1.4")])
def test_the_simulated_table_matches_its_exact_evaluation_under_contention(c, spec):
    p = _problem(c, spec)
    sol = solve_instances(p, idle_power_w=4.0)
    sim = simulate(p, np.asarray(sol.table), requests=250_000, seed=11, idle_power_w=4.0)
    ev = sol.table_eval
    assert abs(sim.mean_latency_ms - ev.mean_latency_ms) <= 3 * sim.mean_latency_ci
    assert abs(sim.mean_power_w - ev.mean_power_w) <= 3 * sim.mean_power_ci
    assert sim.mean_batch_size == pytest.approx(ev.mean_batch, rel=0.01)


@pytest.mark.parametrize("spec", ["triton:max=8,delay_us=2000", "ray:max=8,timeout_s=0.002"])
def test_contention_slows_a_server_rule_and_the_simulator_sees_it(spec):
    plain = BatchingProblem.from_rho(0.3, batch_sizes=tuple(range(1, 9)), instances=2, service="det")
    slow = plain.replace(contention="2:1.6:0.7")  # the same λ: ρ 0.48 with the contention
    rule = parse_rule(spec, plain)
    a, b = simulate(plain, rule, requests=100_000, seed=1), simulate(slow, rule, requests=100_000, seed=1)
    assert b.mean_latency_ms > a.mean_latency_ms + 3 * (a.mean_latency_ci + b.mean_latency_ci)
    assert b.throughput == pytest.approx(a.throughput, rel=0.02)  # the same load is served
    assert b.mean_power_w < a.mean_power_w  # 0.7 of the energy per batch run beside another


@pytest.mark.parametrize("spec", ["2:1.4:0.9,3:1.9:0.8", "1=2:1.2,3:1.5/2=2:1.4,3:1.9:0.8/3=2:1.6,3:2.2/4=2:1.8,3:2.4"])
def test_replicas_under_contention_match_an_independent_event_loop(spec):
    """Ray Serve's replicas on one device, checked against a plain-Python event loop written here: each arrival
    goes to the replica of fewer ongoing requests among its two picks; a batch closes at its timeout or when full
    and runs when its replica is free; while k replicas run, every batch progresses at 1/s_k."""

    from smdp_batch.analysis.simulate import _router_picks

    p = BatchingProblem.from_rho(0.7, batch_sizes=(1, 2, 3, 4), instances=3, service="exp", contention=spec)
    rule = parse_rule("ray:max=4,timeout_s=0.003", p)
    arr = np.cumsum(np.random.default_rng(4).exponential(1 / p.lam, 3000))
    got = response_times(p, rule, arr, seed=9)
    rng = np.random.default_rng(9)
    law_draws = p.service.sample(rng, 1.0, arr.size)  # the simulator's draws: one unit time per batch, in close order
    picks = _router_picks(rng, arr.size, 3)
    l = dict(zip(p.batch_sizes, p.latency_ms()))
    cont = p.contention
    by = {b: f for b, f, _ in cont.sizes}  # per size as given (every size listed), else one for all

    def s(k, b):
        return (by[b] if by else cont.latency)[k - 1]

    c, delay = 3, 3.0
    openb = [[] for _ in range(c)]
    opened = [0.0] * c
    queue = [[] for _ in range(c)]  # closed batches (members, work) not started
    running = [None] * c  # [members, remaining work]
    assigned, completed = [0] * c, [0] * c
    resp = np.full(arr.size, np.nan)
    clock, draws = 0.0, iter(law_draws)

    def close(r):
        queue[r].append((openb[r], l[len(openb[r])] * next(draws)))
        openb[r] = []
        if running[r] is None:
            m, w = queue[r].pop(0)
            running[r] = [m, w]

    for j in range(arr.size + 1):
        t = arr[j] if j < arr.size else math.inf
        while True:
            k = sum(x is not None for x in running)
            ends = [(clock + x[1] * s(k, len(x[0])), r) for r, x in enumerate(running) if x is not None]
            tc, rc = min(ends) if ends else (math.inf, -1)
            outs = [(opened[r] + delay, r) for r in range(c) if openb[r] and opened[r] + delay < t]
            td, rd = min(outs) if outs else (math.inf, -1)
            if rc >= 0 and tc <= t and tc <= td:
                now = tc
            elif rd >= 0:
                now = td
            else:
                now = t
            if k and math.isfinite(now):
                for x in running:
                    if x is not None:
                        x[1] -= (now - clock) / s(k, len(x[0]))
            clock = now if math.isfinite(now) else clock
            if rc >= 0 and tc <= t and tc <= td:
                for i in running[rc][0]:
                    resp[i] = tc - arr[i]
                completed[rc] += len(running[rc][0])
                running[rc] = None
                if queue[rc]:
                    m, w = queue[rc].pop(0)
                    running[rc] = [m, w]
            elif rd >= 0:
                close(rd)
            else:
                break
        if j == arr.size:
            break
        a, b = picks[j]
        r = b if assigned[b] - completed[b] < assigned[a] - completed[a] else a
        assigned[r] += 1
        if not openb[r]:
            opened[r] = t
        openb[r].append(j)
        if len(openb[r]) == 4:
            close(r)
    np.testing.assert_allclose(got, resp, rtol=1e-9, atol=1e-9)


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
    assert sol.busy_table is not None  # what the file's readers follow: its busy-aware rows
    assert d["avg_cost"] == pytest.approx(sol.busy_eval.avg_cost, rel=1e-9)
    assert d["table_eval"]["avg_cost"] == pytest.approx(sol.table_eval.avg_cost, rel=1e-9)
    assert main(["simulate", "--policy", path, "--requests", "50000", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    direct = simulate(_problem(), sol.busy_table, requests=50_000, seed=0)
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
            "--batch-sizes", "1,2,4", "--service", "exp", "--requests", "2000"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ray              ray:" in out  # Ray Serve's replicas are tuned under contention too
    from types import SimpleNamespace

    from smdp_batch.analysis.table_candidates import instances_tables
    from smdp_batch.cli.slo import _deploy

    p = _problem(2, SPEC, rho=0.5, sizes="1,2,4")
    tables, why = instances_tables(p, p.lam, False)
    assert tables and not why
    for cand in tables:  # each c-server table's run-it line solves it with the contention it was solved with
        line = " ".join(_deploy(SimpleNamespace(knobs={**cand.knobs, "tau_ms": 5.0}, spec=cand.name, policy=None), 2, p))
        assert f"--instances 2 --contention {SPEC}" in line and "instances=2" in line
        assert 'PolicyTable.load("table.h5", busy_aware=False)' in line  # the table simulated, not the file's rows


def test_auto_tries_the_counts_the_contention_covers(capsys):
    assert main(["solve", "--instances", "auto", "--lam", "1.5", "--contention", "2:1.3", "--batch-sizes", "1,2,4,8",
                 "--service", "exp", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["instances"] for r in d["auto"]] == [1, 2]  # not 1..8: the factors stop at 2 busy


def test_export_tunes_on_contending_instances(tmp_path, capsys):
    path = str(tmp_path / "one.h5")
    assert main(["solve", "--rho", "0.5", "--batch-sizes", "1,2,4,8,16,32", "-o", path]) == 0
    capsys.readouterr()
    assert main(["export", path, "--to", "triton", "--contention", "2:1.5", "--slo-p99-ms", "40"]) == 2
    assert "add --instances c > 1" in capsys.readouterr().err
    args = ["export", path, "--to", "triton", "--slo-p99-ms", "40", "--requests", "5000", "--contention", "2:1.5"]
    assert main([*args, "--instances", "2"]) == 0
    out = capsys.readouterr().out
    assert "contention 2 busy ×1.5" in out and "count: 2" in out
    assert main([*args, "--instances", "auto", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {r["instances"] for r in d["instances"]["counts"]} <= {1, 2}  # the factors stop at 2 busy


def test_the_spec_keeps_every_digit():
    c = parse_contention("2:1.23456789012,3:1.7777777777:0.987654321")
    assert parse_contention(c.spec()) == c


def test_factors_by_batch_size_read_back_and_interpolate_linearly_in_b():
    c = parse_contention("1=2:1.8,3:2.4/8=2:1.2:0.9,3:1.6:1.1/32=2:1.04,3:1.5")
    assert parse_contention(c.spec()) == c and c.levels == 3
    assert c.latency == (1.0, 1.04, 1.5) and c.energy == (1.0, 1.0, 1.0)  # the largest size's
    assert c.slow(2, [1, 4.5, 8, 20, 32, 64]).tolist() == pytest.approx([1.8, 1.5, 1.2, 1.12, 1.04, 1.04])
    assert c.energy_factor(3, [8, 20, 32]).tolist() == pytest.approx([1.1, 1.05, 1.0])
    assert c.slow([0, 1], 8).tolist() == [1.0, 1.0]  # no batch, or one alone: no slowdown
    assert "by batch size: b = 1: 2 busy ×1.8" in c.describe()
    p = BatchingProblem.from_rho(0.5, batch_sizes="1,2,4,8,16,32", instances=3, contention=c.spec())
    assert p.max_lam == pytest.approx(3 * 32 / (1.5 * float(p.latency_ms()[-1])), rel=1e-12)  # s_3 at Bmax


@pytest.mark.parametrize("spec,match", [
    ("1=2:0.5", "at batch size 1: contention latency factor at 2 busy instances must be a number from 1"),
    ("8=2:1.1/1=2:1.2", "once each, ascending; got 1 after 8"),
    ("1=2:1.1/8=2:1.1,3:1.5", "the same busy counts at every size, got 2 at b = 1, 3 at b = 8"),
    ("x=2:1.1", "B=K:S\\[:E\\],…/B=…"),
    ("1=2:1.1,3:2.5", "3 instances would serve less than 2"),
])
def test_bad_factors_by_size_are_one_line(spec, match):
    with pytest.raises(InputError, match=match):
        parse_contention(spec)


def test_a_file_solved_with_factors_by_size_carries_them(tmp_path, capsys):
    path = str(tmp_path / "s.h5")
    spec = "1=2:1.9:0.7/8=2:1.1:1.3"
    args = ["--instances", "2", "--contention", spec, "--rho", "0.6", "--batch-sizes", "1,2,4,8", "--service", "exp"]
    assert main(["solve", *args, "-o", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["problem"]["contention"] == spec
    assert read_policy(path).inputs["contention"] == spec
    assert main(["evaluate", "--policy", path, "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["avg_cost"] == pytest.approx((d["busy_table_eval"] or d["table_eval"])["avg_cost"], rel=1e-9)
    plain = solve_instances(_problem(2, "2:1.1:1.3", rho=0.6))  # the largest size's factors for every size
    assert d["optimal"]["avg_cost"] != pytest.approx(plain.optimal.avg_cost, rel=1e-6)
