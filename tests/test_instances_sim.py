"""The simulator with c model instances sharing one FIFO queue (``simulate(..., instances=c)``), against two
independent computations:

* M/M/c (every batch of 1, exponential service): the Erlang C mean response time, in closed form;
* a table rule with batching and exponential batch times: the continuous-time Markov chain of the queue
  length and the multiset of batch sizes in service, solved exactly (states after every dispatch the rule
  makes at an arrival or a completion), W̄ by Little's law and P̄ from the rate of batch completions.

The simulator is a different algorithm (an event loop over sampled times), so agreement to its 95 % interval
checks both the c-instance loop and the meaning given to "a rule on c instances".
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.linalg import spsolve

from smdp_batch import BatchingProblem
from smdp_batch.analysis.simulate import response_times, simulate
from smdp_batch.errors import InputError


def _erlang_c_mean_ms(lam: float, mean_ms: float, c: int) -> float:
    a = lam * mean_ms  # offered load (Erlangs)
    rho = a / c
    tail = a ** c / math.factorial(c) / (1.0 - rho)
    p_wait = tail / (sum(a ** k / math.factorial(k) for k in range(c)) + tail)
    return mean_ms + p_wait * mean_ms / (c - a)


def _ctmc(table: np.ndarray, lam: float, lat: dict, energy: dict, c: int, n_max: int) -> tuple[float, float]:
    """(W̄ ms, P̄ W) of ``table`` (n ↦ b, n beyond its end reads its last entry) on c instances, exponential
    batch times of mean lat[b]: the chain on (queue n ≤ n_max, sorted tuple of sizes in service)."""
    sizes = sorted(lat)

    def act(n: int) -> int:
        return int(table[min(n, table.size - 1)])

    def close(n: int, busy: tuple) -> tuple[int, tuple]:  # dispatch while an instance is free and the rule serves
        while len(busy) < c and act(n) > 0:
            b = act(n)
            n, busy = n - b, tuple(sorted(busy + (b,)))
        return n, busy

    configs = [()] + [tuple(sorted(x)) for k in range(1, c + 1) for x in itertools.combinations_with_replacement(sizes, k)]
    states = [(n, cfg) for n in range(n_max + 1) for cfg in configs if close(n, cfg) == (n, cfg)]
    index = {s: i for i, s in enumerate(states)}
    rows, cols, vals = [], [], []
    for (n, busy), i in index.items():
        moves = []
        if n < n_max:
            moves.append((lam, close(n + 1, busy)))
        for b in set(busy):
            rest = list(busy)
            rest.remove(b)
            moves.append((busy.count(b) / lat[b], close(n, tuple(rest))))
        for rate, target in moves:
            j = index[target]
            rows += [i, i]
            cols += [j, i]
            vals += [rate, -rate]
    Q = csr_matrix((vals, (rows, cols)), shape=(len(states), len(states)))
    A = Q.T.tolil()
    A[0, :] = 1.0  # one balance equation replaced by the normalisation
    rhs = np.zeros(len(states))
    rhs[0] = 1.0
    pi = spsolve(A.tocsr(), rhs)
    assert pi[[index[s] for s in states if s[0] == n_max]].sum() < 1e-12  # the truncation holds no mass
    in_system = sum(p * (n + sum(busy)) for p, (n, busy) in zip(pi, states))
    power = sum(p * sum(energy[b] / lat[b] for b in busy) for p, (n, busy) in zip(pi, states))
    return in_system / lam, power


@pytest.mark.parametrize("c, rho", [(2, 0.7), (4, 0.85)])
def test_one_request_per_batch_on_c_instances_is_erlang_c(c, rho):
    p = BatchingProblem.basic(rho=0.5, batch_sizes=(1,), service="exp")
    mean = float(p.latency_ms()[0])
    p = p.replace(lam=rho * c / mean, instances=c)
    assert p.rho == pytest.approx(rho)  # ρ per instance
    r = simulate(p, np.array([0, 1]), requests=2_000_000, seed=3)
    exact = _erlang_c_mean_ms(p.lam, mean, c)
    assert abs(r.mean_latency_ms - exact) <= 3 * r.mean_latency_ci + 1e-3 * exact, (r.mean_latency_ms, exact)
    assert r.mean_latency_ci < 0.02 * exact


@pytest.mark.parametrize("c, lam, table", [
    (2, 0.9, [0, 0, 2, 3, 4]),  # wait for two, then serve up to 4
    (3, 1.4, [0, 1, 2, 3, 4]),  # serve what waits, up to 4
    (2, 1.0, [0, 1, 1, 3, 4]),  # an irregular table
])
def test_a_batching_table_on_c_instances_matches_the_exact_markov_chain(c, lam, table):
    sizes = (1, 2, 3, 4)
    lat = {1: 1.5, 2: 1.8, 3: 2.2, 4: 2.5}  # ms, exponential batch times
    energy = {1: 3.0, 2: 4.0, 3: 4.6, 4: 5.0}  # mJ
    from smdp_batch.model.curves import Table

    p = BatchingProblem.basic(rho=0.5, batch_sizes=sizes, service="exp").replace(
        lam=lam, latency=Table(sizes, tuple(lat[b] for b in sizes)), energy=Table(sizes, tuple(energy[b] for b in sizes)),
        instances=c)
    t = np.array(table)
    w_exact, p_exact = _ctmc(t, lam, lat, energy, c, n_max=80)
    r = simulate(p, t, requests=1_000_000, seed=11)
    assert abs(r.mean_latency_ms - w_exact) <= 3 * r.mean_latency_ci + 1e-3 * w_exact, (r.mean_latency_ms, w_exact)
    assert abs(r.mean_power_w - p_exact) <= 3 * r.mean_power_ci + 1e-3 * p_exact, (r.mean_power_w, p_exact)


def test_one_instance_is_todays_single_server_and_more_instances_wait_less():
    p = BatchingProblem.basic(rho=0.8)
    arr = np.cumsum(np.random.default_rng(2).exponential(1.0 / p.lam, 20_000))
    t = np.minimum(np.arange(40), 32)
    one = response_times(p, t, arr, seed=1)
    assert np.array_equal(one, response_times(p.replace(instances=1), t, arr, seed=1))
    p2 = p.replace(instances=2)
    two = response_times(p2, t, arr, seed=1)
    assert np.all(np.isfinite(two)) and two.mean() < one.mean()
    assert p2.lam == p.lam and p2.rho == pytest.approx(p.rho / 2)


@pytest.mark.parametrize("bad", [0, -1, 65, 2.5, "2", True, None])
def test_bad_instance_counts_are_refused_with_the_valid_range(bad):
    with pytest.raises(InputError, match="instances must be an integer from 1 to 64"):
        BatchingProblem.basic(rho=0.5, instances=bad)


def test_the_solvers_and_exact_evaluation_refuse_several_instances_with_one_line():
    from smdp_batch import solve
    from smdp_batch.solvers.evaluation import evaluate_deployed

    p = BatchingProblem.basic(rho=0.5, instances=2)
    with pytest.raises(InputError, match="for one server; 2 instances"):
        solve(p)
    with pytest.raises(InputError, match="for one server; 2 instances"):
        evaluate_deployed(p, np.minimum(np.arange(40), 32))
    from smdp_batch.analysis.tail import sojourn_law

    with pytest.raises(InputError, match="for one server; 2 instances"):
        sojourn_law(p, np.minimum(np.arange(40), 32))


def test_rules_not_modelled_on_several_instances_are_refused():
    from smdp_batch.baselines.servers import torchserve

    p = BatchingProblem.basic(rho=0.5, instances=2)
    with pytest.raises(InputError, match="TorchServe's workers and phase or λ-bank tables are not modelled"):
        simulate(p, torchserve(32, 5.0), requests=1000)


def test_capacity_counts_every_instance():
    p = BatchingProblem.basic(rho=0.5, batch_sizes=(1,), service="exp")
    mean = float(p.latency_ms()[0])
    with pytest.raises(InputError, match=r"maximum stable λ is 2·Bmax/l\(Bmax\) on 2 instances"):
        p.replace(lam=2.5 / mean, instances=2)
    p = p.replace(lam=1.5 / mean, instances=2)  # 1.5× one instance's capacity
    assert p.rho == pytest.approx(0.75)
    r = simulate(p, np.array([0, 1]), requests=20_000)
    assert math.isfinite(r.mean_latency_ms)
    with pytest.raises(InputError, match="queue grows without bound"):  # a rule that can carry only part of it
        simulate(p.replace(lam=0.9 * 2 / mean), np.array([0, 1]), arrivals=np.arange(1, 5000) * mean / 2.5)


def _cli(args, capsys):
    from smdp_batch.cli import main

    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_simulate_instances_on_the_command_line(capsys):
    """``--instances 2 --rho 0.7``: ρ per instance (λ twice one instance's 0.7), Triton's rule on both."""
    import json

    rc, out, err = _cli(["simulate", "--instances", "2", "--rho", "0.7", "--policy", "triton:max=32,delay_us=2000",
                         "--requests", "100000", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    one = BatchingProblem.basic(rho=0.7)
    assert d["instances"] == 2 and d["lam"] == pytest.approx(2 * one.lam) and d["rho"] == pytest.approx(0.7)
    assert d["throughput"] == pytest.approx(2 * one.lam, rel=0.02)
    rc, out, err = _cli(["simulate", "--instances", "2", "--policy", "static:8", "--requests", "20000"], capsys)
    assert rc == 0 and "2 instances sharing the queue" in out, err


@pytest.mark.parametrize("bad", ["0", "-1", "65", "2.5", "two"])
def test_bad_instances_on_the_command_line_get_one_line_and_exit_2(bad, capsys):
    rc, out, err = _cli(["simulate", "--instances", bad, "--policy", "static:8", "--requests", "1000"], capsys)
    assert rc == 2 and "--instances" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_smdp_spec_with_several_instances_says_why_it_is_refused(capsys):
    rc, out, err = _cli(["simulate", "--instances", "2", "--policy", "smdp:w2=1", "--requests", "1000"], capsys)
    assert rc == 2 and "for one server; 2 instances" in err and "Traceback" not in err


@pytest.mark.parametrize("spec", ["triton:max=4,delay_us=500", "static:4", "greedy+timer:0.5"])
def test_on_c_instances_no_batch_starts_before_its_requests_or_before_the_batch_ahead(spec):
    """Bursts of 10 simultaneous requests every 5 ms on 3 instances (deterministic batch times): every response
    takes at least its batch time l(b) ≥ l(1), requests of one batch complete together, and the completions
    of batches, taken in queue order, start no earlier than the batch ahead started."""
    from smdp_batch.baselines.servers import parse_rule

    p = BatchingProblem.basic(rho=0.5, batch_sizes=(1, 2, 3, 4), instances=3)
    arr = np.repeat(np.arange(1, 201) * 5.0, 10)
    rule = parse_rule(spec, p)
    resp = response_times(p, rule, arr, seed=0)
    done = arr + resp
    lat = dict(zip(p.batch_sizes, p.latency_ms()))
    assert np.all(np.isfinite(resp)) and resp.min() >= lat[1] - 1e-9
    starts, j = [], 0
    while j < arr.size:  # FIFO: a batch is a run of requests completing at the same time
        k = j
        while k + 1 < arr.size and done[k + 1] == done[j]:
            k += 1
        b = min(k - j + 1, 4)
        starts.append(done[j] - lat[b])
        assert starts[-1] >= arr[k] - 1e-9  # its last request had arrived
        j = k + 1
    assert np.all(np.diff(starts) >= -1e-9)  # batches leave the queue in order


def _jsq_ctmc(lam: float, mu: float, c: int, n_max: int) -> float:
    """Mean response time (ms) of c FIFO M/M/1 replicas behind Ray's router: two distinct replicas drawn at
    random (ordered), the one with fewer requests takes the arrival, a tie goes to the first drawn; exact CTMC
    on the replicas' request counts, each truncated at n_max."""
    states = list(itertools.product(range(n_max + 1), repeat=c))
    index = {s: i for i, s in enumerate(states)}
    pairs = [(a, b) for a in range(c) for b in range(c) if a != b]
    rows, cols, vals = [], [], []
    for s, i in index.items():
        moves: dict[tuple, float] = {}
        for a, b in pairs:
            r = b if s[b] < s[a] else a
            if s[r] < n_max:
                t = list(s)
                t[r] += 1
                moves[tuple(t)] = moves.get(tuple(t), 0.0) + lam / len(pairs)
        for r in range(c):
            if s[r] > 0:
                t = list(s)
                t[r] -= 1
                moves[tuple(t)] = moves.get(tuple(t), 0.0) + mu
        for t, rate in moves.items():
            rows += [i, i]
            cols += [index[t], i]
            vals += [rate, -rate]
    A = csr_matrix((vals, (rows, cols)), shape=(len(states), len(states))).T.tolil()
    A[0, :] = 1.0
    rhs = np.zeros(len(states))
    rhs[0] = 1.0
    pi = spsolve(A.tocsr(), rhs)
    assert pi[[index[s] for s in states if max(s) == n_max]].sum() < 1e-6  # negligible beside the 0.1 % compared
    return float(sum(p * sum(s) for p, s in zip(pi, states))) / lam


@pytest.mark.parametrize("c, rho, n_max", [(2, 0.8, 60), (3, 0.75, 24)])
def test_ray_replicas_behind_the_router_match_the_exact_join_the_shorter_of_two_chain(c, rho, n_max):
    """``ray:max=1,timeout_s=0`` on c replicas with exponential service is c M/M/1 queues behind the
    power-of-two-choices router (for c = 2, join the shorter queue): the simulator against the exact chain."""
    from smdp_batch.baselines.servers import ray_serve

    p = BatchingProblem.basic(rho=0.5, batch_sizes=(1,), service="exp")
    mean = float(p.latency_ms()[0])
    p = p.replace(lam=rho * c / mean, instances=c)
    exact = _jsq_ctmc(p.lam, 1.0 / mean, c, n_max)
    r = simulate(p, ray_serve(1, 0.0), requests=2_000_000, seed=5)
    assert abs(r.mean_latency_ms - exact) <= 3 * r.mean_latency_ci + 1e-3 * exact, (r.mean_latency_ms, exact)
    random_split = mean / (1.0 - rho)  # each replica an M/M/1 at ρ: what the router improves on
    assert r.mean_latency_ms < 0.8 * random_split


@pytest.mark.parametrize("spec", ["ray:max=8,timeout_s=0.002", "ray:max=4,timeout_s=0.0005,pad=2/4"])
def test_one_replica_behind_the_router_is_the_single_server_ray_rule(spec):
    """The replicas loop with c = 1 (every request to replica 0) gives, request by request, what the
    single-server loop gives for the same rule: the two implement @serve.batch's batches the same way."""
    from smdp_batch.analysis import simulate as sim
    from smdp_batch.analysis.sim_replicas import _replicas_kernel
    from smdp_batch.baselines.servers import parse_rule

    p = BatchingProblem.basic(rho=0.6, service="exp")
    rule = parse_rule(spec, p)
    arr = np.cumsum(np.random.default_rng(4).exponential(1.0 / p.lam, 30_000))
    bounds = np.array([arr.size, arr.size])
    ref, _, ref_sizes, _, _ = sim._run(p, rule, arr, np.random.default_rng(9), bounds)
    captured = {}
    real = sim._replicas_kernel

    def spy(*args):
        captured["args"] = args
        return real(*args)

    sim._replicas_kernel = spy
    try:
        sim._run(p.replace(instances=2), rule, arr, np.random.default_rng(9), bounds)
    finally:
        sim._replicas_kernel = real
    a = list(captured["args"])
    resp = np.empty(arr.size)
    a[9] = np.zeros_like(a[9])  # the service-time pointers from the start
    a[10], a[13] = resp, np.zeros_like(a[13])
    a[15], a[16] = np.zeros((arr.size, 2), dtype=np.int64), 1  # one replica
    _replicas_kernel(*a)
    np.testing.assert_allclose(resp, ref, rtol=0, atol=1e-9)
    assert np.array_equal(a[13], ref_sizes)


def test_a_simulated_run_on_two_instances_counts_each_batch_once():
    """The server benchmarks' simulated run groups requests by their common end time; on two instances the next
    batch may end before the previous one, and must still count as its own batch."""
    from smdp_batch.analysis.simulate import poisson_arrivals
    from smdp_batch.baselines.servers import triton
    from smdp_batch.integrations.loadgen import simulated_run

    p = BatchingProblem.basic(rho=0.8, instances=2, service="exp")
    rule = triton(32, 0)
    arr = poisson_arrivals(p.lam, 20_000, np.random.default_rng(3))
    run = simulated_run(p, rule, arr)
    sizes = [b for b, _ in run.batches.values()]
    done = arr + response_times(p, rule, arr)
    assert np.any(np.diff(done) < -1e-6)  # batches did overtake each other
    # the simulator's own count of the batches it started (its kernel, not the end-time grouping)
    counts = simulate(p, rule, arrivals=arr, seed=0).batch_size_counts
    assert len(sizes) == sum(counts.values()) and sum(sizes) == arr.size and max(sizes) <= 32


def test_the_gap_an_instance_stays_unavailable_counts_only_batches_that_waited_for_it():
    """Two instances A and B, hand-made: A's second batch waited for A (its first request was sent 10 ms before A
    was free: gap 3 ms), A's third did not (sent after A was free: an idle wait, not a gap); B's pair waited
    (gap 5 ms).  The median of the gaps that count: 4 ms.  Without instances the batches form one sequence."""
    from smdp_batch.integrations.loadgen import Run, instance_gap

    times = {0: (0.0, 20.0), 1: (23.0, 40.0), 2: (60.0, 70.0), 3: (5.0, 30.0), 4: (35.0, 50.0)}
    first = {0: 0.0, 1: 10.0, 2: 55.0, 3: 4.0, 4: 12.0}
    arr = np.array([first[k] for k in range(5)])
    run = Run(arr, np.full(5, 1.0), np.arange(5), {k: (1, 1) for k in range(5)}, batch_times=times)
    run.notes["instance"] = {0: "A", 1: "A", 2: "A", 3: "B", 4: "B"}
    assert instance_gap(run, delay_ms=2.0) == {"gap_ms": 4.0, "pairs": 2}
    assert instance_gap(run, delay_ms=15.0) == {"gap_ms": 5.0, "pairs": 1}  # A's was within the delay + margin
    del run.notes["instance"]  # one sequence by start: 0, 3, 1, 4, 2
    assert instance_gap(run, delay_ms=2.0)["pairs"] == 3  # (0,3): 3 started before 0 ended: a negative gap
