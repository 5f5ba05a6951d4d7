"""Exact evaluation (eqs. 21–22) against closed forms."""

import numpy as np
import pytest

from smdp_batch import BatchingProblem, InputError, evaluate_policy, solve, truncate
from smdp_batch.baselines import control_limit_policy, greedy_policy, parse_policy, static_policy
from smdp_batch.solvers.evaluation import control_limit_of, evaluate_deployed


@pytest.mark.parametrize("service, m2", [("det", 1.0), ("exp", 2.0), ("erlang:4", 1.25)])
def test_single_server_is_mg1_pollaczek_khinchine(service, m2):
    """Batch size 1 only + greedy = M/G/1: W = l + λE[G²]/(2(1−λl))."""
    l, lam = 2.0, 0.35
    p = BatchingProblem(lam=lam, batch_sizes=[1], latency=f"const:{l}", energy="const:5", service=service)
    ev = evaluate_deployed(p, greedy_policy(p.batch_sizes, 1))
    rho = lam * l
    assert ev.mean_latency_ms == pytest.approx(l + lam * m2 * l * l / (2 * (1 - rho)), rel=1e-9)
    assert ev.mean_power_w == pytest.approx(lam * 5.0, rel=1e-9)
    assert ev.throughput == pytest.approx(lam, rel=1e-9)
    assert ev.mean_batch_size == pytest.approx(1.0)


def test_static_power_closed_form_and_table1_static8():
    """Static b: every request shares ζ(b)/b, so P̄ = λζ(b)/b; Table I static b=8 at ρ=0.7."""
    p = BatchingProblem.basic(rho=0.7)
    ev = evaluate_deployed(p, static_policy(p.batch_sizes, 32, 8))
    assert ev.mean_power_w == pytest.approx(p.lam * (19.899 * 8 + 19.603) / 8, rel=1e-9)
    assert ev.mean_batch_size == pytest.approx(8.0)
    assert ev.mean_latency_ms == pytest.approx(6.85, rel=5e-3)  # paper: 6.85 ms (simulated)
    assert ev.mean_power_w == pytest.approx(46.27, rel=5e-3)  # paper: 46.27 W


def test_unstable_policies_are_rejected():
    p = BatchingProblem.basic(rho=0.9)
    with pytest.raises(InputError, match="does not stabilise"):
        evaluate_deployed(p, static_policy(p.batch_sizes, 32, 8))  # paper: b=8 fails for ρ ≥ 0.8
    with pytest.raises(InputError, match="never serves"):
        evaluate_deployed(p, np.zeros(34, dtype=int))


def test_truncated_metrics_consistency():
    p = BatchingProblem.basic(rho=0.5, w2=1.0)
    m = truncate(p, 80, 100.0)
    ev = evaluate_policy(m, greedy_policy(p.batch_sizes, 80))
    assert ev.stationary.sum() == pytest.approx(1.0)
    # ĝ = w1 W̄ + w2 P̄ + (abstract-cost share), and the objective pieces add up exactly
    assert ev.avg_cost == pytest.approx(ev.mean_latency_ms + ev.mean_power_w, abs=1e-9 + ev.delta)
    assert ev.throughput == pytest.approx(p.lam, rel=1e-9)


def test_baseline_specs_and_control_limit_detection():
    sizes = tuple(range(1, 9))
    assert parse_policy("greedy", sizes, 10).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    assert parse_policy("static:4", sizes, 10).tolist() == [0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4]
    pol = parse_policy("control:3", sizes, 10)
    assert pol.tolist() == [0, 0, 0, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    assert control_limit_of(pol, sizes) == 3
    assert control_limit_of(parse_policy("static:4", sizes, 10), sizes) is None
    assert control_limit_policy(sizes, 10, 1).tolist() == greedy_policy(sizes, 10).tolist()
    with pytest.raises(InputError):
        parse_policy("static:9", sizes, 10)
    with pytest.raises(InputError):
        parse_policy("lifo", sizes, 10)


@pytest.mark.parametrize("service, rho, w2, s_max", [("det", 0.5, 1.0, 200), ("hyperexp", 0.9, 2.0, 1500),
                                                     ("exp", 0.3, 0.0, 300), ("gamma:0.5", 0.9, 1.0, 1200)])
def test_banded_stationary_law_equals_the_pivoting_lapack_solve(service, rho, w2, s_max):
    """μ by the no-pivot LU of the band (Bᵀ solved on B's factors) against LAPACK's pivoted transposed band."""
    from smdp_batch.solvers.banded import bordered_solve, reference_states, stationary_banded

    p = BatchingProblem.from_rho(rho, batch_sizes=range(1, 33), service=service, w2=w2)
    s = solve(p, s_max=s_max, abstract_cost=300.0)
    m = s.model
    idx = m.action_index(s.policy)
    ok, mu = stationary_banded(idx, m.P, m.SF, m.klo, m.khi, m.actions, m.s_max, np.empty((0, 0)),
                               np.empty(0, dtype=np.int64))
    ref_state = reference_states(m, idx)[0]
    rhs = np.zeros(m.n_states)
    rhs[ref_state] = 1.0
    lap = np.clip(bordered_solve(m, idx, np.ones(m.n_states), rhs, ref_state, transpose=True), 0.0, None)
    lap /= lap.sum()
    assert ok and np.abs(mu - lap).max() < 1e-14 and mu.sum() == pytest.approx(1.0, abs=1e-14)
    assert np.allclose(mu @ m.dense()[np.arange(m.n_states), idx], mu, atol=1e-15) if s_max <= 300 else True
