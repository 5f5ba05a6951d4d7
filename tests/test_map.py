"""MAP arrivals inside the model (issue 20): the (queue length, phase) SMDP against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import expm
from scipy.stats import poisson

from smdp_batch.errors import InputError
from smdp_batch.model.arrivals import MAP, parse_arrivals
from smdp_batch.model.map_truncation import map_blocks, truncate_map
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.model.truncation import truncate
from smdp_batch.solvers.evaluation import evaluate_policy
from smdp_batch.solvers.map_pi import evaluate_map_policy, map_policy_iteration
from smdp_batch.solvers.map_solution import map_problem, solve_map
from smdp_batch.solvers.pi import policy_iteration
from smdp_batch.solvers.solution import solve

#: A general MAP (arrivals that change the phase, D1 not diagonal) and an MMPP.
GENERAL = MAP([[-3.0, 1.0, 0.5], [0.5, -2.0, 0.2], [0.1, 0.1, -1.0]], [[1.0, 0.0, 0.5], [0.5, 0.3, 0.5], [0.2, 0.3, 0.3]])
BURSTY = MAP.mmpp([0.6, 2.4], [0.02, 0.02])

PAPER = [(0.3, 0.0, "det"), (0.3, 5.0, "det"), (0.5, 1.0, "det"), (0.7, 1.0, "exp"), (0.9, 1.0, "det"),
         (0.5, 2.0, "erlang:4"), (0.7, 2.0, "gamma:0.5")]


# ----------------------------------------------------------------------------------------- the MAP
def test_map_validation_names_the_bad_value():
    with pytest.raises(InputError, match=r"D1\[0,1\]"):
        MAP([[-1.0, 1.0], [1.0, -1.0]], [[0.0, -0.5], [0.0, 0.0]])
    with pytest.raises(InputError, match="sum to 0"):
        MAP([[-2.0, 1.0], [1.0, -1.5]], [[0.5, 0.0], [0.0, 1.0]])
    with pytest.raises(InputError, match="irreducible"):
        MAP.mmpp([1.0, 2.0], [[0.0, 0.0], [1.0, -1.0]])
    with pytest.raises(InputError, match="mmpp needs"):
        parse_arrivals("mmpp:1,2,3")
    with pytest.raises(InputError, match="not valid"):
        parse_arrivals("bursty:1")


def test_map_moments_against_brute_force():
    a = BURSTY
    assert a.rate == pytest.approx(1.5, rel=1e-14)
    # IDC against a long simulated stream (windows of 200 ms)
    t, _, _ = a.sample(400_000, np.random.default_rng(3))
    counts = np.bincount((t // 200.0).astype(np.int64))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(a.idc(200.0), rel=0.1)
    assert MAP.poisson(2.0).idc(5.0) == pytest.approx(1.0, abs=1e-12)
    # a general MAP: empirical rate and the phase after arrivals
    t, sw_t, sw_p = GENERAL.sample(200_000, np.random.default_rng(4))
    assert t.size / t[-1] == pytest.approx(GENERAL.rate, rel=0.02)


# ----------------------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("arrivals", [BURSTY, GENERAL], ids=["mmpp", "general"])
@pytest.mark.parametrize("service", ["det", "exp"])
def test_blocks_match_monte_carlo(arrivals, service):
    """A_k(i, j) = P(k arrivals, end phase j | start phase i) against a simulation of the MAP during a batch."""
    p = map_problem(arrivals, batch_sizes=(4,), latency="const:2.5", service=service)
    blocks = map_blocks(p, arrivals, 40)
    A = blocks.pmf[0]
    assert np.allclose(A.sum(axis=0).sum(axis=1) + blocks.sf[0, -1].sum(axis=1), 1.0, atol=1e-12)  # row sums
    assert np.allclose(blocks.total[0].sum(axis=1), 1.0, atol=1e-12)
    rng = np.random.default_rng(7)
    m, N = arrivals.phases, 100_000
    out = -np.diag(arrivals.D0)
    events = np.concatenate([arrivals.D0 - np.diag(np.diag(arrivals.D0)), arrivals.D1], axis=1) / out[:, None]
    cum = np.cumsum(events, axis=1)
    for i in range(m):  # N trajectories of the MAP from phase i during a batch, event by event, in parallel
        x = np.full(N, 2.5) if service == "det" else rng.exponential(2.5, N)
        ph = np.full(N, i)
        t = np.zeros(N)
        k = np.zeros(N, dtype=np.int64)
        live = np.ones(N, dtype=bool)
        while live.any():
            idx = np.nonzero(live)[0]
            t[idx] += rng.exponential(1.0 / out[ph[idx]])
            done = t[idx] > x[idx]
            live[idx[done]] = False
            idx = idx[~done]
            e = (rng.random(idx.size)[:, None] > cum[ph[idx]]).sum(axis=1)
            k[idx] += e >= m
            ph[idx] = e % m
        freq = np.zeros((41, m))
        np.add.at(freq, (np.minimum(k, 40), ph), 1.0 / N)
        want = A[:, i, :].copy()
        want[40] += blocks.sf[0, 40, i]  # the last row of the histogram holds k ≥ 40
        sd = np.sqrt(want * (1 - want) / N)
        assert np.all(np.abs(freq - want) <= 5 * sd + 1e-4), (i, np.abs(freq - want).max())


def test_blocks_closed_forms():
    """m = 1: the Poisson pmf; det service: Σ_k A_k = e^{D·l}; the arrival area H against quadrature."""
    p = BatchingProblem(lam=1.3, batch_sizes=(1, 8), latency="affine:0.5,1")
    one = map_blocks(p, MAP.poisson(1.3), 60)
    for bi, l in enumerate(p.latency_ms()):
        assert np.allclose(one.pmf[bi, :, 0, 0], poisson.pmf(np.arange(61), 1.3 * l), atol=1e-15, rtol=1e-12)
    a = GENERAL
    q = map_problem(a, batch_sizes=(2, 6), latency="affine:0.5,1")
    blocks = map_blocks(q, a, 200)
    D = a.D0 + a.D1
    for bi, l in enumerate(q.latency_ms()):
        assert np.allclose(blocks.total[bi], expm(D * l), atol=1e-13)
    model = truncate_map(q, a, 20, 100.0, blocks)
    d = a.phase_rates
    for bi, l in enumerate(q.latency_ms()):  # H(i) = ∫₀^l E_i[N(t)] dt = ∫₀^l ∫₀^t e^{Du} d du dt
        u = np.linspace(0.0, l, 4001)
        EN = np.array([expm(D * x) @ d for x in u])  # d/dt E[N(t)]
        cum = np.concatenate([np.zeros((1, 3)), np.cumsum((EN[1:] + EN[:-1]) / 2 * np.diff(u)[:, None], axis=0)])
        area = np.sum((cum[1:] + cum[:-1]) / 2 * np.diff(u)[:, None], axis=0)
        assert np.allclose(model.hold_fixed[bi + 1], area, rtol=1e-6)


# ----------------------------------------------------------------------------------------- Poisson as m = 1
@pytest.mark.parametrize("rho,w2,service", PAPER)
def test_one_phase_reproduces_the_poisson_smdp(rho, w2, service):
    p = BatchingProblem.basic(rho=rho, w2=w2, service=service)
    scalar = policy_iteration(truncate(p, 160, 100.0))
    for a in (MAP.poisson(p.lam), MAP.mmpp([p.lam, p.lam], [0.05, 0.2])):
        res = map_policy_iteration(truncate_map(p, a, 160, 100.0))
        assert abs(res.gain - scalar.gain) <= 1e-12 * scalar.gain
        for i in range(a.phases):
            assert np.array_equal(res.policy[:, i], scalar.policy)


def test_one_phase_converged_tables_agree():
    for rho, w2 in ((0.3, 5.0), (0.5, 1.0), (0.9, 1.0)):
        p = BatchingProblem.basic(rho=rho, w2=w2)
        s, ms = solve(p), solve_map(p, MAP.poisson(p.lam))
        R = min(s.converged_upto, ms.converged_upto)
        assert np.array_equal(s.policy[: R + 1], ms.table[: R + 1, 0])
        assert ms.deployed.avg_cost == pytest.approx(s.deployed.avg_cost, rel=1e-9)


def test_one_phase_evaluation_equals_the_scalar_one():
    p = BatchingProblem.basic(rho=0.6, w2=1.0, service="exp")
    m1 = truncate(p, 200, 100.0)
    pol = policy_iteration(m1).policy
    e1 = evaluate_policy(m1, pol)
    e2 = evaluate_map_policy(truncate_map(p, MAP.poisson(p.lam), 200, 100.0), pol[:, None])
    for k in ("avg_cost", "mean_latency_ms", "mean_power_w", "throughput", "mean_batch_size"):
        assert getattr(e2, k) == pytest.approx(getattr(e1, k), rel=1e-11), k


# ----------------------------------------------------------------------------------------- bursty tables
def test_bursty_table_is_converged_and_phase_dependent():
    p = map_problem(BURSTY, w2=1.0)
    sol = solve_map(p, BURSTY)
    R = sol.converged_upto
    assert R is not None and sol.s_max >= 2 * R
    assert np.all(sol.table[R:] == 32)  # the limiting action in every phase
    assert not np.array_equal(sol.table[:, 0], sol.table[:, 1])
    assert sol.evaluation.delta < 1e-3
    # a larger truncation decides the same on 0..R
    big = solve_map(p, BURSTY, s_max=4 * sol.s_max, abstract_cost=sol.model.abstract_cost)
    assert np.array_equal(big.result.policy[: R + 1], sol.table[: R + 1])


def test_exact_evaluation_matches_the_simulator_with_the_true_phase():
    from smdp_batch.analysis.phased import solution_rule
    from smdp_batch.analysis.simulate import simulate

    p = map_problem(BURSTY, w2=1.0)
    sol = solve_map(p, BURSTY)
    t, sw_t, sw_p = BURSTY.sample(600_000, np.random.default_rng(11))
    res = simulate(p, solution_rule(sol, "true", (sw_t, sw_p)), arrivals=t, seed=2)
    dep = sol.deployed
    assert abs(res.mean_latency_ms - dep.mean_latency_ms) <= 1.5 * res.mean_latency_ci
    assert abs(res.mean_power_w - dep.mean_power_w) <= 1.5 * res.mean_power_ci
    assert res.mean_batch_size == pytest.approx(dep.mean_batch_size, rel=0.02)


def test_a_waiting_tail_is_refused():
    p = map_problem(BURSTY)
    with pytest.raises(InputError):
        from smdp_batch.solvers.map_solution import evaluate_map_deployed

        evaluate_map_deployed(p, BURSTY, np.zeros((40, 2), dtype=np.int64))
