"""The tail boundary (:mod:`smdp_batch.model.truncation`): exact excursion costs above s_max.

Checked against independent computations: the excursion moments against brute-force sums over a long
arrival table, the metrics of fixed policies against eq. 19's overflow truncation grown until S_o is
negligible (a different boundary, which must cover the queue tail), and the gain's convergence in s_max
against the overflow boundary's at the same s_max.
"""

import numpy as np
import pytest

from smdp_batch import BatchingProblem, InputError, solve
from smdp_batch.model.truncation import arrival_table, truncate
from smdp_batch.solvers.evaluation import evaluate_deployed, evaluate_policy, extend_policy
from smdp_batch.solvers.pi import policy_iteration

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def _p(rho, w2=1.0, **kw):
    kw.setdefault("batch_sizes", range(1, 33))
    return BatchingProblem.from_rho(rho, latency=kw.pop("latency", AFF), energy=LIN, w2=w2, **kw)


@pytest.mark.parametrize("service", ["det", "exp", "gamma:0.5", "lognormal:1"])
def test_excursion_moments_by_brute_force(service):
    """E (j − s)⁺ and E (j − s)⁺(j + s) from a table 16× longer by direct sums, against the model's
    reverse recursions on a short table (heavy tails: the moment restoration beyond kmax)."""
    p = _p(0.7, batch_sizes=range(1, 9), service=service)
    s_max, B = 40, 8
    short = truncate(p, s_max, 0.0, arrival_table(p, s_max), tail=B)
    long_ = arrival_table(p, 16 * 4096)
    lam, l, m2 = p.lam, p.latency_ms(), p.second_moments()
    iB = 7
    d = B - lam * l[iB]
    M2 = lam * l[iB] + lam ** 2 * m2[iB] - 2 * B * lam * l[iB] + B * B
    for i, a in enumerate(p.batch_sizes, start=1):
        pk = long_.pmf[i - 1]
        k = np.arange(pk.size)
        for s in (a, s_max // 2, s_max):
            j = s - a + k
            e = np.where(j > s_max, j - s_max, 0)
            e1, e2 = float(pk @ e), float(pk @ (e * (j + s_max)))
            want = [l[iB] * e1 / d, p.energy_mj()[iB] * e1 / d,
                    l[iB] * e2 / (2 * lam * d) + (0.5 * m2[iB] / d + l[iB] * M2 / (2 * lam * d * d)) * e1]
            got = short.extra[:, s, i]
            np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-12)


POLICIES = [  # (problem, policy rule on 0..s: a function of n), tail actions that are not Bmax included
    (_p(0.5), lambda n: 0 if n < 4 else min(n, 32)),
    (_p(0.9, service="gamma:0.5"), lambda n: 0 if n < 6 else min(n, 32)),
    (_p(0.7, service="hyperexp"), lambda n: 0 if n < 2 else min(n, 24)),
    (_p(0.7, service="erlang:4"), lambda n: min(n, 20) if n < 60 else 32),
    (_p(0.5, service="lognormal:1"), lambda n: 0 if n < 3 else min(n, 16)),
]


@pytest.mark.parametrize("k", range(len(POLICIES)))
def test_fixed_policies_match_the_overflow_truncation(k):
    problem, rule = POLICIES[k]
    policy = np.array([rule(n) for n in range(302)])  # s_max 300, then S_o
    tail = evaluate_deployed(problem, policy)
    over = evaluate_deployed(problem, policy, boundary="overflow")
    # eq. 19 stops when S_o's share is < 1e-10, but S_o charges the tail only c(s_max): with lognormal service
    # its ĝ is still 7e-9 low there and W̄ 4e-8 (see the next test), the tail boundary's is not
    rel = 1e-7 if problem.service.spec().startswith("lognormal") else 1e-9
    for key in ("avg_cost", "mean_latency_ms", "mean_power_w", "throughput", "mean_batch_size"):
        assert getattr(tail, key) == pytest.approx(getattr(over, key), rel=rel), key
    assert tail.throughput == pytest.approx(problem.lam, rel=1e-9)  # the excursions' batches counted
    assert tail.s_max < over.s_max or over.s_max <= 1024


def test_a_heavy_tail_the_overflow_boundary_approaches_slowly():
    """lognormal:1 at ρ = 0.5, a fixed policy: the tail boundary's ĝ is the same at every s_max and arrival
    table length (to 1e-12), eq. 19's (c_o = 0) approaches it from below as s_max doubles."""
    p, rule = POLICIES[4]
    policy = np.array([rule(n) for n in range(302)])
    tails, gaps = [], []
    for s in (300, 600, 1200, 2400):
        for kmax in (s, 4 * s):
            arr = arrival_table(p, kmax)
            tails.append(evaluate_policy(truncate(p, s, 0.0, arr, tail=16), extend_policy(policy, s)).avg_cost)
        over = evaluate_policy(truncate(p, s, 0.0, arr), extend_policy(policy, s)).avg_cost
        gaps.append(tails[-1] - over)
    assert max(tails) - min(tails) < 1e-12 * tails[0]
    assert all(g > 0 for g in gaps) and all(b < a / 5 for a, b in zip(gaps, gaps[1:])) and gaps[-1] < 1e-6 * tails[0]


def test_the_gain_converges_with_the_bias_not_with_the_queue_tail():
    """hyperexp at ρ = 0.9: at s_max = 512 the tail boundary's optimal gain is within 1e-9 of the infinite
    queue's, eq. 19's (c_o = 1.5·ĝ) is still off by > 1e-3 — its S_o is visited with probability ~1e-2."""
    p = _p(0.9, 2.0, service="hyperexp")
    exact = solve(p).deployed.avg_cost
    arr = arrival_table(p, 4096)
    tail = policy_iteration(truncate(p, 512, 0.0, arr, tail=32))
    over = policy_iteration(truncate(p, 512, 1.5 * exact, arr))
    assert tail.gain == pytest.approx(exact, rel=1e-9)
    assert abs(over.gain / exact - 1) > 1e-3
    assert policy_iteration(truncate(p, 128, 0.0, arr, tail=32)).gain != pytest.approx(exact, rel=1e-6)  # it does converge


def test_the_tail_boundary_serves_B_at_the_top_and_checks_B():
    p = _p(0.5)
    m = truncate(p, 64, tail=32)
    assert m.boundary == "tail" and m.abstract_cost == 0.0
    feas = m.feasible()
    assert feas[-2:].sum(axis=1).tolist() == [1, 1] and m.actions[feas[-1]].tolist() == [32]
    pol = np.minimum(np.arange(66), 32)
    evaluate_policy(m, pol)
    pol[64] = 31
    with pytest.raises(InputError, match="must serve B = 32"):
        evaluate_policy(m, pol)
    with pytest.raises(InputError, match="does not drain"):
        truncate(_p(0.9), 64, tail=1)
    with pytest.raises(InputError, match="allowed batch sizes"):
        truncate(p, 64, tail=33)


def test_rvi_and_jax_refuse_the_tail_boundary_and_solve_checks_it():
    from smdp_batch.solvers.rvi import relative_value_iteration

    p = _p(0.5)
    with pytest.raises(InputError, match="tail boundary"):
        relative_value_iteration(truncate(p, 64, tail=32))
    with pytest.raises(InputError, match="policy iteration on numba only"):
        solve(p, solver="rvi", boundary="tail")
    with pytest.raises(InputError, match="unknown boundary"):
        solve(p, boundary="reflecting")
    with pytest.raises(InputError, match="unknown boundary"):
        evaluate_deployed(p, np.minimum(np.arange(66), 32), boundary="x")
    assert solve(p, solver="rvi", eps=1e-6).model.boundary == "overflow"


def test_the_boundary_is_written_and_read(tmp_path):
    import h5py

    from smdp_batch.export.hdf5 import write_policy
    from smdp_batch.runtime.schema import read_policy

    sol = solve(_p(0.5))
    path = tmp_path / "t.h5"
    write_policy(sol, path)
    assert read_policy(path).truncation["boundary"] == "tail" == sol.to_dict()["boundary"]
    with h5py.File(path, "r+") as f:
        f["truncation"].attrs["boundary"] = "mirror"
    with pytest.raises(InputError, match="boundary"):
        read_policy(path)


def test_a_long_table_is_evaluated_from_its_last_change():
    """eq. 30: a table constant from n = 32 on, stored to s_max = 10 000 (beyond the doubling's limit), has the
    metrics of the same table stored to 40."""
    p = _p(0.5)
    long_, short = np.minimum(np.arange(10002), 32), np.minimum(np.arange(42), 32)
    a, b = evaluate_deployed(p, long_), evaluate_deployed(p, short)
    assert a.avg_cost == b.avg_cost and a.mean_latency_ms == b.mean_latency_ms and a.s_max < 1000


def _random_problems(count: int, seed: int):
    rng = np.random.default_rng(seed)
    lats = ["affine:0.3051,1.0524", "const:2.5", "affine:0.05,3", "affine:0.5,0.2"]
    laws = ["det", "exp", "erlang:3", "hyperexp", "gamma:0.7", "uniform:1,20", "lognormal:0.7"]
    out = []
    for _ in range(count):
        bmax = int(rng.choice([4, 8, 16, 32]))
        sizes = (range(1, bmax + 1) if rng.random() < 0.6
                 else sorted({int(x) for x in rng.integers(1, bmax + 1, size=4)} | {bmax}))
        out.append(BatchingProblem.from_rho(
            float(rng.choice([0.1, 0.4, 0.7, 0.85, 0.95])), latency=str(rng.choice(lats)), energy=LIN,
            w2=float(rng.choice([0, 0.3, 1, 5, 50])), batch_sizes=sizes, service=str(rng.choice(laws))))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("k, problem", list(enumerate(_random_problems(16, 11))))
def test_random_problems_both_boundaries_give_the_same_converged_table(k, problem):
    """Random laws, latency curves, batch-size sets, loads and weights (seeded): the tail boundary's converged
    table equals eq. 19's (an independent truncation, converged by its own rule) on n < 4R + 5, with the same R,
    and the deployed costs agree."""
    tail, over = solve(problem), solve(problem, boundary="overflow")
    R = tail.converged_upto
    assert R is not None and over.converged_upto == R
    assert [tail.decide(n) for n in range(4 * R + 5)] == [over.decide(n) for n in range(4 * R + 5)]
    assert tail.deployed.avg_cost == pytest.approx(over.deployed.avg_cost, rel=1e-8)
    assert tail.evaluation.avg_cost == pytest.approx(over.deployed.avg_cost, abs=tail.evaluation.delta + 1e-9 * tail.evaluation.avg_cost)


@pytest.mark.parametrize("tail", [None, 8])
def test_a_policys_costs_holding_and_energy_per_state_are_the_full_arrays_entries(tail):
    """costs_of / hold_of / energies_of (what evaluate_policy reads, without the S × A arrays) pick exactly the
    entries of costs() / hold() / energies(), on eq. 19's boundary (c_o on S_o) and on the tail boundary."""
    p = _p(0.7, w2=2.0, batch_sizes=range(1, 9))
    m = truncate(p, 40, 100.0, tail=tail)
    rng = np.random.default_rng(0)
    feas = m.feasible()
    idx = np.array([rng.choice(np.flatnonzero(f)) for f in feas])
    rows = np.arange(m.n_states)
    assert np.array_equal(m.costs_of(idx), m.costs()[rows, idx])
    assert np.array_equal(m.hold_of(idx), m.hold()[rows, idx])
    assert np.array_equal(m.energies_of(idx), m.energies()[rows, idx])
