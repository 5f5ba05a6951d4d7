"""The c-server batching SMDP (model/multi_server.py, solvers/multi_system.py and multi_pi.py) against
independent computations: a dense CTMC of a fixed table written here from the model's definition, the linear
program of the tiny truncated SMDP, today's one-server solve at c = 1, the simulator on c instances, and Erlang-k
converging; and the reused factorisations against fresh ones."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy.optimize import linprog

from smdp_batch.analysis.simulate import simulate
from smdp_batch.errors import InputError, NotConvergedWarning
from smdp_batch.model.multi_server import PHASES_LIMIT, phase_type
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers import solve
from smdp_batch.solvers.multi_pi import evaluate_instances_table, solve_instances


def _problem(c, rho=0.6, service="exp", sizes="1,2,3", **kw):
    return BatchingProblem.from_rho(rho, service=service, batch_sizes=sizes, instances=c, **kw)


def _factors(p: BatchingProblem):
    """The contention's s_k(b) and e_k(b) as functions of the busy count k and the batch size b (1 without
    contention), read from its factors as given: a spec by size must list every allowed size (no interpolation)."""
    c = p.contention
    if c is None:
        return (lambda k, b: 1.0), (lambda k, b: 1.0)
    if not c.sizes:
        return (lambda k, b: c.latency[max(k, 1) - 1]), (lambda k, b: c.energy[max(k, 1) - 1])
    table = {b: (s, e) for b, s, e in c.sizes}
    assert set(p.batch_sizes) <= set(table)
    return (lambda k, b: table[b][0][max(k, 1) - 1]), (lambda k, b: table[b][1][max(k, 1) - 1])


def _ctmc_metrics(p: BatchingProblem, table, N: int, idle_power_w: float = 0.0) -> dict:
    """Exact W̄, P̄ and mean batch of ``table`` on c instances with exponential batch times: a dense generator
    over (n, sorted sizes in service) after every start the table makes, written from the model's definition."""
    c, lam = p.instances, p.lam
    sizes = list(p.batch_sizes)
    l = dict(zip(sizes, p.latency_ms()))
    z = dict(zip(sizes, p.energy_mj()))
    cont = p.contention
    s_k, e_k = _factors(p)

    t = np.asarray(table)

    def settle(n, busy):  # start table[n] (busy-aware: table[k, n], k busy) while an instance is idle (at N: the largest)
        started = []
        while len(busy) < c and n > 0:
            row = t[len(busy)] if t.ndim == 2 else t
            b = int(row[min(n, row.size - 1)])
            if b == 0 and n == N:
                b = max(s for s in sizes if s <= n)
            if b == 0:
                break
            busy = tuple(sorted(busy + (b,)))
            n -= b
            started.append(b)
        return (n, busy), started

    states = [(n, busy) for n in range(N + 1) for k in range(c + 1)
              for busy in itertools.combinations_with_replacement(sizes, k)]
    stable = [s for s in states if settle(*s)[0] == s]
    idx = {s: i for i, s in enumerate(stable)}
    Q = np.zeros((len(stable), len(stable)))
    starts = np.zeros((len(stable), 3))  # rate-weighted: batches, requests, energy started per ms
    for (n, busy), i in idx.items():
        moves = []
        if n < N:
            moves.append((lam, n + 1, busy))
        for b in set(busy):
            rest = list(busy)
            rest.remove(b)
            moves.append((busy.count(b) / (l[b] * s_k(len(busy), b)), n, tuple(rest)))
        for r, n2, busy2 in moves:
            s2, started = settle(n2, busy2)
            Q[i, idx[s2]] += r
            Q[i, i] -= r
            starts[i] += r * np.array([len(started), sum(started), sum(z[b] for b in started)])
    A = np.vstack([Q.T, np.ones(len(stable))])
    rhs = np.zeros(len(stable) + 1)
    rhs[-1] = 1.0
    pi = np.linalg.lstsq(A, rhs, rcond=None)[0]
    at_n = np.array([s[0] for s in stable])
    in_sys = np.array([s[0] + sum(s[1]) for s in stable])
    idle = np.array([c - len(s[1]) for s in stable])
    lost = float(pi[at_n == N].sum())
    rates = pi @ starts
    # with contention, power as each running batch's draw e_k·ζ(b)/(s_k·l(b)), not as ζ(b) per start
    run_w = np.array([sum(e_k(len(s[1]), b) * z[b] / (s_k(len(s[1]), b) * l[b]) for b in s[1]) for s in stable])
    power = rates[2] if cont is None else float(pi @ run_w)
    return {"W": float(pi @ in_sys) / (lam * (1 - lost)), "P": power + idle_power_w * float(pi @ idle),
            "batch": rates[1] / rates[0], "lost": lost}


@pytest.mark.parametrize("c,table,spec", [
    (2, [0, 0, 2, 3], None), (3, [0, 1, 0, 3, 3, 0, 3], None), (2, [0, 1, 2, 3], None),
    (2, [0, 0, 2, 3], "2:1.6:0.8"), (3, [0, 1, 0, 3, 3, 0, 3], "2:1.3,3:1.9:1.2"), (3, [0, 1, 2, 3], "2:2,3:2.5:0.5"),
    (2, [[0, 0, 2, 3], [0, 1, 0, 3]], None), (2, [[0, 1, 2, 3], [0, 0, 0, 3]], "2:1.6:0.8"),
    (3, [[0, 0, 2, 3], [0, 1, 1, 3], [0, 0, 0, 0, 0, 3]], "2:1.3,3:1.9:1.2"),
    (2, [0, 0, 2, 3], "1=2:1.9:0.7/2=2:1.4/3=2:1.1:1.3"), (3, [0, 1, 2, 3], "1=2:1.2,3:1.7/2=2:1.5,3:1.9:0.8/3=2:1.9,3:2.2"),
    (2, [[0, 1, 2, 3], [0, 0, 0, 3]], "1=2:1.9:0.7/2=2:1.4/3=2:1.1:1.3")])
def test_the_evaluation_of_a_table_equals_an_independent_ctmc_solve(c, table, spec):
    """With contention every running batch slows by s_k and draws e_k·ζ(b)/(s_k·l(b)) W, k busy: the dense CTMC
    prices power as that draw (the solver as ζ(b) per start plus the difference), so the check is independent.
    A 2-D table is busy-aware (row k with k instances busy; rows padded with their last entry)."""
    if isinstance(table[0], list):
        width = max(len(r) for r in table)
        table = [r + [r[-1]] * (width - len(r)) for r in table]
    p = _problem(c, rho=0.7, contention=spec)
    N = 14
    ev = evaluate_instances_table(p, table, n_max=N, idle_power_w=3.0, boundary="loss")
    ref = _ctmc_metrics(p, table, N, idle_power_w=3.0)
    assert ev.mean_latency_ms == pytest.approx(ref["W"], rel=1e-9)
    assert ev.mean_power_w == pytest.approx(ref["P"], rel=1e-9)
    assert ev.mean_batch == pytest.approx(ref["batch"], rel=1e-9)
    assert ev.boundary_mass == pytest.approx(ref["lost"], rel=1e-7, abs=1e-15)
    if spec is None:
        return
    plain = evaluate_instances_table(p.replace(contention=None), table, n_max=N, boundary="loss")
    assert ev.mean_latency_ms > plain.mean_latency_ms  # the same table on slower instances waits longer


def test_the_solved_table_evaluates_as_the_ctmc_says():
    p = _problem(2, rho=0.7)
    sol = solve_instances(p, n_max=20, boundary="loss")
    ref = _ctmc_metrics(p, sol.table, 20)
    assert sol.table_eval.mean_latency_ms == pytest.approx(ref["W"], rel=1e-9)
    assert sol.table_eval.mean_power_w == pytest.approx(ref["P"], rel=1e-9)


def _lp_optimum(p: BatchingProblem, N: int, ph) -> float:
    """The least average cost of the truncated c-server SMDP by its linear program over state-action
    frequencies (Σ τ·x = 1), built here from the model's definition with dense matrices.  With contention,
    power is each running batch's draw e_k·ζ(b)/(s_k·l(b)) while k are busy, not ζ(b) per start."""
    c, lam, m = p.instances, p.lam, ph.phases
    sizes = list(p.batch_sizes)
    z = p.energy_mj()
    l = p.latency_ms()
    bmax = sizes[-1]
    cont = p.contention
    s_k, e_k = _factors(p)
    loss_ms = 2.0 * (N + c * bmax) * float(p.latency(np.float64(bmax))) * s_k(c, bmax) / (c * bmax)
    syms = [(i, j) for i in range(len(sizes)) for j in range(m)]
    confs = [cf for k in range(c + 1) for cf in itertools.combinations_with_replacement(syms, k)]
    states = [(n, cf) for n in range(N + 1) for cf in confs]
    idx = {s: i for i, s in enumerate(states)}
    cols, costs, taus = [], [], []
    for (n, cf), i in idx.items():
        busy = sum(sizes[a] for a, _ in cf)
        if not (n == N and len(cf) < c):  # wait (at N an idle instance must serve)
            moves = []
            if n < N:
                moves.append((lam, (n + 1, cf)))
            for sym in set(cf):
                a, j = sym
                rest = list(cf)
                rest.remove(sym)
                cnt = cf.count(sym) / s_k(len(cf), sizes[a])
                for j2 in range(m):
                    if ph.moves[a, j, j2] > 0:
                        moves.append((cnt * ph.moves[a, j, j2], (n, tuple(sorted(rest + [(a, j2)])))))
                if ph.exits[a, j] > 0:
                    moves.append((cnt * ph.exits[a, j], (n, tuple(sorted(rest)))))
            q = sum(r for r, _ in moves)
            if q > 0:
                rate = p.w1 * (n + busy) / lam + (p.w1 * loss_ms if n == N else 0.0)
                if cont is not None:
                    rate += p.w2 * sum(e_k(len(cf), sizes[a]) * z[a] / (s_k(len(cf), sizes[a]) * l[a]) for a, _ in cf)
                col = np.zeros(len(states))
                col[i] += 1.0
                for r, s2 in moves:
                    col[idx[s2]] -= r / q
                cols.append(col), costs.append(rate / q), taus.append(1.0 / q)
        if len(cf) < c:
            for a, b in enumerate(sizes):
                if b <= n:
                    col = np.zeros(len(states))
                    col[i] += 1.0
                    for j in range(m):
                        if ph.alpha[a, j] > 0:
                            col[idx[(n - b, tuple(sorted(cf + ((a, j),))))]] -= ph.alpha[a, j]
                    cols.append(col), costs.append(p.w2 * z[a] if cont is None else 0.0), taus.append(0.0)
    A_eq = np.vstack([np.array(cols).T, np.array(taus)[None, :]])
    b_eq = np.zeros(len(states) + 1)
    b_eq[-1] = 1.0
    res = linprog(np.array(costs), A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    assert res.status == 0, res.message
    return float(res.fun)


@pytest.mark.parametrize("service,c", [("exp", 2), ("hyperexp", 2), ("erlang:2", 2), ("exp", 3)])
def test_policy_iteration_equals_the_linear_program_on_a_tiny_truncation(service, c):
    p = _problem(c, rho=0.65, service=service, sizes="1,2")
    N = 9
    sol = solve_instances(p, n_max=N, boundary="loss")
    assert sol.optimal.model_cost == pytest.approx(_lp_optimum(p, N, phase_type(p)), rel=1e-9)


@pytest.mark.parametrize("service,c,spec", [("exp", 2, "2:1.7:0.7"), ("erlang:2", 2, "2:1.2:1.5"),
                                            ("hyperexp", 3, "2:1.3,3:1.8:0.9"), ("exp", 2, "1=2:1.9:0.6/2=2:1.2:1.4"),
                                            ("erlang:2", 3, "1=2:1.1,3:1.6/2=2:1.8:0.9,3:2.1:1.2")])
def test_policy_iteration_with_contention_equals_the_linear_program(service, c, spec):
    p = _problem(c, rho=0.65, service=service, sizes="1,2", contention=spec, w2=3.0)
    N = 9
    sol = solve_instances(p, n_max=N, boundary="loss")
    assert sol.optimal.model_cost == pytest.approx(_lp_optimum(p, N, phase_type(p)), rel=1e-9)


@pytest.mark.parametrize("c,rho,service,sizes,longer,spec", [
    (2, 0.9, "exp", "1,2,4", 8, None), (3, 0.7, "exp", "1,2", 6, None), (2, 0.8, "erlang:2", "1,2", 3, None),
    (3, 0.7, "exp", "1,2", 6, "2:1.5:0.8,3:2"), (2, 0.8, "erlang:2", "1,2", 3, "2:1.3"),
    (2, 0.8, "exp", "1,2", 6, "1=2:1.8:0.7/2=2:1.2:1.3"), (2, 0.8, "hyperexp:0.6667/0.5,0.3333/2", "1,2", 10, None)])
def test_the_tail_boundary_equals_a_long_plain_truncation(c, rho, service, sizes, longer, spec):
    p = _problem(c, rho=rho, service=service, sizes=sizes, contention=spec)
    tail = solve_instances(p, tol=1e-10)
    long = solve_instances(p, n_max=longer * tail.n_max, boundary="loss")
    assert long.optimal.boundary_mass < 1e-11
    assert tail.optimal.avg_cost == pytest.approx(long.optimal.avg_cost, rel=1e-9)
    assert tail.optimal.mean_latency_ms == pytest.approx(long.optimal.mean_latency_ms, rel=1e-8)
    assert tail.optimal.mean_power_w == pytest.approx(long.optimal.mean_power_w, rel=1e-9)
    assert tail.optimal.throughput == pytest.approx(p.lam, rel=1e-12)  # the tail serves every arrival
    assert tail.optimal.model_cost == pytest.approx(tail.optimal.avg_cost, rel=1e-12)


def test_one_instance_equals_todays_single_server_solve():
    p = BatchingProblem.from_rho(0.6, service="exp", batch_sizes="1,2,4,8")
    ours = solve_instances(p, tol=1e-12)
    theirs = solve(p).deployed
    assert ours.optimal.avg_cost == pytest.approx(theirs.avg_cost, rel=1e-9)
    assert ours.optimal.mean_latency_ms == pytest.approx(theirs.mean_latency_ms, rel=1e-8)
    assert ours.optimal.mean_power_w == pytest.approx(theirs.mean_power_w, rel=1e-9)
    ref = solve(p).policy
    k = min(ref.size, 60)
    assert list(ours.table[:k]) == list(ref[:k])


def test_the_table_on_c_instances_simulates_to_its_exact_evaluation():
    p = _problem(2, rho=0.7, sizes="1,2,4,8")
    sol = solve_instances(p)
    sim = simulate(p, np.asarray(sol.table), requests=400_000, seed=3)
    half = sim.mean_latency_ci  # the 95 % half-width
    assert abs(sim.mean_latency_ms - sol.table_eval.mean_latency_ms) <= 3 * half + 1e-3 * sim.mean_latency_ms
    assert sim.mean_power_w == pytest.approx(sol.table_eval.mean_power_w, rel=0.01)
    assert sim.mean_batch_size == pytest.approx(sol.table_eval.mean_batch, rel=0.01)


def test_erlang_k_converges_as_k_grows_toward_the_fixed_batch_time():
    p = _problem(2, rho=0.6, service="det", sizes="1,2")
    g = [solve_instances(p, phases=k).optimal.avg_cost for k in (1, 2, 4, 8)]
    d = np.abs(np.diff(g))
    assert d[1] < 0.7 * d[0] and d[2] < 0.7 * d[1], g
    sol = solve_instances(p, phases=8)
    sim = simulate(p, np.asarray(sol.table), requests=200_000, seed=1)  # the fixed batch times themselves
    assert abs(sim.mean_latency_ms - sol.table_eval.mean_latency_ms) < abs(sim.mean_latency_ms - solve_instances(
        p, phases=1).table_eval.mean_latency_ms)


def test_idle_power_is_charged_per_idle_instance():
    p = _problem(3, rho=0.5)
    a = evaluate_instances_table(p, [0, 1, 2, 3], n_max=30)
    b = evaluate_instances_table(p, [0, 1, 2, 3], n_max=30, idle_power_w=7.5)
    assert b.mean_power_w - a.mean_power_w == pytest.approx(7.5 * (3 - a.busy_instances), rel=1e-10)
    assert b.idle_power_w == pytest.approx(7.5 * (3 - a.busy_instances), rel=1e-10)
    assert b.mean_latency_ms == pytest.approx(a.mean_latency_ms, rel=1e-12)


def test_the_phase_type_laws_keep_the_mean():
    for svc in ("exp", "erlang:3", "gamma:2", "hyperexp", "det", "gamma:0.5", "gamma:2.5", "lognormal:0.5"):
        p = _problem(2, service=svc)
        ph = phase_type(p, 4)
        assert np.allclose(ph.means(), p.latency_ms(), rtol=1e-12), svc
    assert phase_type(_problem(2, service="det"), 5).phases == 5


@pytest.mark.parametrize("bad", [0, -1, PHASES_LIMIT + 1, 2.5, True, "3"])
def test_bad_phase_counts_are_one_line(bad):
    with pytest.raises(InputError, match="phases must be an integer from 1 to"):
        solve_instances(_problem(2, service="det"), phases=bad)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_idle_power_is_one_line(bad):
    with pytest.raises(InputError, match="idle power per instance"):
        solve_instances(_problem(2), idle_power_w=bad)


def test_a_model_past_the_state_limit_is_refused_before_work():
    p = BatchingProblem.from_rho(0.5, service="det", instances=8)
    with pytest.raises(InputError, match=r"configurations × .* states, over the limit .*--batch-sizes 1,2,4,8,16,32"):
        solve_instances(p)


def test_a_truncation_that_cannot_grow_enough_is_never_returned_silently(monkeypatch):
    # 600 states: the average cost still moves by ~4e-10 at the longest truncation allowed (N = 48), far from round-off;
    # at 2 000 (N = 162) the two truncations' costs agreed to the last bit on one host, which a tolerance cannot refuse
    monkeypatch.setattr("smdp_batch.model.multi_server.MULTI_STATE_LIMIT", 600)
    p = BatchingProblem.from_rho(0.9, service="exp", batch_sizes="1,2,4", instances=2)
    with pytest.raises(NotConvergedWarning, match="did not converge: the average cost still moves"):
        solve_instances(p, tol=1e-17)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sol = solve_instances(p, tol=1e-17, throw=False)
    assert not sol.converged and any(issubclass(x.category, NotConvergedWarning) for x in w)


def test_solve_instances_on_the_command_line(capsys):
    from smdp_batch.cli import main

    args = ["solve", "--instances", "2", "--batch-sizes", "1,2,4,8", "--service", "exp", "--rho", "0.6"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 instances sharing one queue" in out and "its table n ↦ b" in out and "split over 2 queues" in out
    assert main(args + ["--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["instances"] == 2 and d["converged"] and d["optimal"]["avg_cost"] <= d["split_evenly"]["avg_cost"]
    assert d["optimal"]["avg_cost"] <= d["table_eval"]["avg_cost"] + 1e-9
    assert d["optimal"]["avg_cost"] <= d["one_instance_table_shared"]["avg_cost"] + 1e-9


@pytest.mark.parametrize("args,match", [
    (["--instances", "0"], "--instances must be auto or an integer in 1..64"),
    (["--instances", "-1"], "--instances must be auto or an integer in 1..64"),
    (["--instances", "65"], "--instances must be auto or an integer in 1..64"),
    (["--instances", "2.5"], "--instances must be auto or an integer in 1..64"),
    (["--phases", "4"], "add --instances c > 1"),
    (["--idle-power", "5"], "add --instances c > 1"),
    (["--instances", "2", "--idle-power", "-1"], "--idle-power must be ≥ 0"),
    (["--instances", "2", "--phases", "0"], "--phases must be ≥ 1"),
    (["--instances", "2", "-o", "x.txt"], "-o"),
    (["--instances", "2", "--rho-grid", "0.3,0.5"], "cannot be combined with --rho-grid"),
    (["--instances", "8"], "over the limit"),
    (["--instances", "2", "--arrivals", "mmpp:1,2,0.1,0.1"], "cannot be combined with --instances 2"),
    (["--phases", "3", "--arrivals", "mmpp:1,2,0.1,0.1"], "cannot be combined with --phases"),
    (["--instances", "auto"], "give it as --lam"),
    (["--instances", "auto", "--rho", "0.5"], "give it as --lam"),
    (["--instances", "Auto2"], "--instances must be auto or an integer in 1..64"),
    (["--phases", "2", "-o", "x.h5"], "add --instances c > 1"),
])
def test_bad_instance_options_are_one_line_and_exit_2(capsys, tmp_path, monkeypatch, args, match):
    from smdp_batch.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["solve", *args]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_solve_instances_auto_picks_the_count_of_least_objective_at_the_total_load(capsys):
    from smdp_batch.cli import main
    import json

    args = ["solve", "--instances", "auto", "--lam", "5", "--batch-sizes", "8,16,32", "--service", "exp",
            "--idle-power", "10", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    rows = d["auto"]
    assert "unstable" in rows[0]["why"]  # one instance cannot carry 5 /ms
    solved = [r for r in rows if "optimal" in r]
    best = min(solved, key=lambda r: r["optimal"]["avg_cost"])
    assert d["instances"] == best["instances"] == 2
    assert len(solved) >= 3  # it went two counts past the best
    # idle power: each extra instance mostly adds its idle draw
    p = [r["optimal"]["mean_power_w"] for r in solved]
    assert all(b > a for a, b in zip(p, p[1:]))
    ref = solve_instances(BatchingProblem(lam=5.0, batch_sizes="8,16,32", service="exp", instances=2), idle_power_w=10.0)
    assert d["optimal"]["avg_cost"] == pytest.approx(ref.optimal.avg_cost, rel=1e-12)


def test_the_tail_boundary_refuses_a_table_that_does_not_end_in_bmax():
    p = _problem(2, rho=0.5)
    with pytest.raises(InputError, match="ends in 2: evaluate it with boundary='loss'"):
        evaluate_instances_table(p, [0, 1, 2])
    assert evaluate_instances_table(p, [0, 1, 2], boundary="loss", n_max=60).throughput > 0


def _splu_calls(monkeypatch) -> list[int]:
    """Count the sparse LU factorisations policy iteration makes."""
    from smdp_batch.solvers import multi_system

    calls: list[int] = []
    real = multi_system.splu

    def counted(M, **kw):
        calls.append(M.shape[0])
        return real(M, **kw)

    monkeypatch.setattr(multi_system, "splu", counted)
    return calls


def _assert_same_answer(got, fresh) -> None:
    """The same policy, table, truncation and iterations, and every metric of the optimum and its table to 1e-11."""
    assert np.array_equal(got.policy, fresh.policy) and np.array_equal(got.table, fresh.table)
    assert got.n_max == fresh.n_max and got.iterations == fresh.iterations
    for ours, theirs in ((got.optimal, fresh.optimal), (got.table_eval, fresh.table_eval)):
        for k, v in theirs.to_dict().items():
            assert getattr(ours, k) == pytest.approx(v, rel=1e-11, abs=1e-13), k


def test_reusing_an_earlier_factorisation_gives_the_fresh_factorisations_answer(monkeypatch):
    """A policy close to the one last factorised is solved by GMRES preconditioned with its LU factors: the same
    policy, table and metrics as factorising every policy afresh (to 1e-11), with fewer factorisations."""
    from smdp_batch.solvers import multi_system

    p = _problem(2, rho=0.8, sizes="1,2,4,8,16")
    monkeypatch.setattr(multi_system, "REUSE_MIN_NNZ", 0)  # a small model, whose factors are reused all the same
    calls = _splu_calls(monkeypatch)
    reused = solve_instances(p)
    n_reused = len(calls)
    monkeypatch.setattr(multi_system, "REUSE_SHARE", -1.0)  # every policy factorised
    calls.clear()
    fresh = solve_instances(p)
    assert n_reused < len(calls)
    _assert_same_answer(reused, fresh)


def test_a_reuse_that_does_not_settle_is_factorised_afresh(monkeypatch):
    """GMRES held to one iteration cannot reach the residual bound on a changed policy: the policy is factorised
    and the answer is the fresh factorisation's."""
    from smdp_batch.solvers import multi_system

    p = _problem(2, rho=0.8, sizes="1,2,4,8,16")
    monkeypatch.setattr(multi_system, "REUSE_SHARE", -1.0)
    fresh = solve_instances(p)
    monkeypatch.setattr(multi_system, "REUSE_SHARE", 1.0)
    monkeypatch.setattr(multi_system, "REUSE_MIN_NNZ", 0)
    monkeypatch.setattr(multi_system, "REUSE_ITERATIONS", 1)
    calls = _splu_calls(monkeypatch)
    tried: list[bool] = []
    real = multi_system._preconditioned
    monkeypatch.setattr(multi_system, "_preconditioned", lambda *a: tried.append(True) or real(*a))
    got = solve_instances(p)
    assert tried and len(calls) >= fresh.iterations  # every changed policy fell back to its own factorisation
    assert np.array_equal(got.policy, fresh.policy)
    assert got.optimal.avg_cost == pytest.approx(fresh.optimal.avg_cost, rel=1e-12)


def test_incomplete_factors_give_the_complete_factorisations_answer(monkeypatch):
    """From ILU_FROM states a policy is solved by GMRES on incomplete LU factors (its own; from ILU_REUSE_FROM first
    the last policy's when close): the same policy, table and metrics as complete factorisations (to 1e-11)."""
    from smdp_batch.solvers import multi_system

    p = _problem(2, rho=0.8, sizes="1,2,4,8,16")
    fresh = solve_instances(p)
    monkeypatch.setattr(multi_system, "ILU_FROM", 0)
    calls = _splu_calls(monkeypatch)
    built: list[int] = []
    real = multi_system.spilu
    monkeypatch.setattr(multi_system, "spilu", lambda M, **kw: built.append(M.shape[0]) or real(M, **kw))
    for reuse_from in (10**9, 0):  # each policy its own incomplete factors; then close ones try the last ones
        monkeypatch.setattr(multi_system, "ILU_REUSE_FROM", reuse_from)
        built.clear()
        got = solve_instances(p)
        assert built and not calls
        assert (len(built) < got.iterations) == (reuse_from == 0)
        _assert_same_answer(got, fresh)


def test_incomplete_factors_that_fail_fall_back_to_complete_ones(monkeypatch):
    """A zero pivot in the incomplete factors, or GMRES that does not settle on them: the complete factors."""
    from smdp_batch.solvers import multi_system

    p = _problem(2, rho=0.8, sizes="1,2,4,8,16")
    fresh = solve_instances(p)
    monkeypatch.setattr(multi_system, "ILU_FROM", 0)

    def singular(M, **kw):
        raise RuntimeError("Factor is exactly singular")

    monkeypatch.setattr(multi_system, "spilu", singular)
    calls = _splu_calls(monkeypatch)
    got = solve_instances(p)
    assert calls and got.optimal.avg_cost == pytest.approx(fresh.optimal.avg_cost, rel=1e-12)
    monkeypatch.undo()
    monkeypatch.setattr(multi_system, "ILU_FROM", 0)
    monkeypatch.setattr(multi_system, "ILU_REUSE_FROM", 0)
    monkeypatch.setattr(multi_system, "ILU_DROP", 0.5)  # factors too rough for GMRES's 1 iteration below
    monkeypatch.setattr(multi_system, "ILU_ITERATIONS", 1)
    calls = _splu_calls(monkeypatch)
    got = solve_instances(p)
    assert calls and np.array_equal(got.policy, fresh.policy)
    assert got.optimal.avg_cost == pytest.approx(fresh.optimal.avg_cost, rel=1e-12)


def test_starting_from_the_one_instance_table_reaches_the_same_optimum(monkeypatch):
    """Large models start policy iteration from the one-instance table at the load's c-th share (TABLE_START_FROM);
    forced on a small one it reaches greedy's optimum; a one-instance problem that cannot be solved falls back."""
    from smdp_batch.solvers import multi_pi

    p = _problem(2, rho=0.8, sizes="1,2,4,8,16")
    greedy = solve_instances(p)
    monkeypatch.setattr(multi_pi, "TABLE_START_FROM", 0)
    starts: list[bool] = []  # per call: whether the start differs from greedy's
    real = multi_pi.first_policy
    monkeypatch.setattr(multi_pi, "first_policy", lambda sysm, *a: (lambda act: starts.append(
        not np.array_equal(act, multi_pi.greedy_policy(sysm))) or act)(real(sysm, *a)))
    got = solve_instances(p)
    assert starts == [False, True]  # the one-instance solve's greedy start, then the two-instance model's, once
    assert np.array_equal(got.policy, greedy.policy) and np.array_equal(got.table, greedy.table)
    assert got.optimal.avg_cost == pytest.approx(greedy.optimal.avg_cost, rel=1e-11)

    whole = multi_pi.solve_instances

    def one_refused(problem, **kw):
        if problem.instances == 1:
            raise InputError("no")
        return whole(problem, **kw)

    monkeypatch.setattr(multi_pi, "solve_instances", one_refused)  # what first_policy calls
    starts.clear()
    assert whole(p).optimal.avg_cost == pytest.approx(greedy.optimal.avg_cost, rel=1e-11)
    assert starts == [False]


def test_the_preconditioned_solve_keeps_only_answers_below_its_residual_bound():
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    from smdp_batch.solvers.multi_system import REUSE_RESIDUAL, _preconditioned

    rng = np.random.default_rng(0)
    A = sp.random(300, 300, density=0.02, random_state=1, format="csc") + sp.identity(300, format="csc") * 4.0
    b = rng.normal(size=300)
    lu = splu(A.tocsc())
    x = _preconditioned(A.tocsr(), b, lu.solve, 60)  # the exact factors: settles at once
    assert x is not None and np.max(np.abs(A @ x - b)) <= REUSE_RESIDUAL * np.max(np.abs(b))
    far = sp.diags(np.linspace(1.0, 1e8, 300)).tocsr()  # identity "preconditioner", condition 1e8: no settling
    assert _preconditioned(far, b, lambda v: v, 60) is None


def test_a_solution_prices_a_table_as_a_fresh_evaluation_does(monkeypatch):
    """MultiSolution.price reuses the solve's factorisation: the same metrics as evaluate_instances_table on the
    same truncation, for the one-instance table and a busy-aware one; a table not ending in Bmax is one line."""
    from smdp_batch.solvers import multi_system

    monkeypatch.setattr(multi_system, "REUSE_MIN_NNZ", 0)
    monkeypatch.setattr(multi_system, "REUSE_SHARE", 0.2)
    p = _problem(2, rho=0.7, sizes="1,2,4,8,16")
    sol = solve_instances(p)
    one = solve(p.replace(instances=1, lam=p.lam / 2)).table
    busy = np.vstack([sol.table, np.where(sol.table >= 2, sol.table, 0)])
    busy[:, -1] = p.bmax
    calls = _splu_calls(monkeypatch)
    for table in (one, busy):
        got = sol.price(table)
        assert not calls  # priced on the solve's factors
        want = evaluate_instances_table(p, table, n_max=sol.n_max)
        calls.clear()
        for k, v in want.to_dict().items():
            assert getattr(got, k) == pytest.approx(v, rel=1e-11, abs=1e-13), k
    with pytest.raises(InputError, match="ends in 8"):
        sol.price(np.minimum(sol.table, 8))
    import pickle

    copy = pickle.loads(pickle.dumps(sol))  # without its LU factors, which do not pickle
    assert copy.system is None and np.array_equal(copy.table, sol.table) and copy.optimal == sol.optimal
    with pytest.raises(InputError, match="keeps no tail-boundary system"):
        copy.price(sol.table)
