"""Solvers against brute force, each other, and pymdptoolbox on identical arrays."""

import itertools
import warnings

import numpy as np
import pytest

from smdp_batch import BatchingProblem, InputError, evaluate_policy, solve, truncate
from smdp_batch.errors import NotConvergedWarning
from smdp_batch.solvers import policy_iteration, relative_value_iteration

TINY = [
    dict(rho=0.5, service="det", c_o=100.0, w2=1.0),
    dict(rho=0.8, service="exp", c_o=0.0, w2=0.5),
    dict(rho=0.3, service="erlang:2", c_o=10.0, w2=3.0),
    dict(rho=0.6, service="hyperexp", c_o=100.0, w2=0.0),
]


def _tiny(case, bmax=3, smax=5):
    p = BatchingProblem.from_rho(case["rho"], batch_sizes=range(1, bmax + 1), service=case["service"], w2=case["w2"])
    return truncate(p, smax, case["c_o"])


def _brute_force(model):
    feas = model.feasible()
    choices = [model.actions[feas[s]] for s in range(model.n_states)]
    best, best_pol = np.inf, None
    for pol in itertools.product(*choices):
        try:
            g = evaluate_policy(model, np.array(pol)).avg_cost
        except InputError:  # multichain (cannot happen in exact arithmetic, Lemma 2)
            continue
        if g < best - 1e-12:
            best, best_pol = g, np.array(pol)
    return best, best_pol


@pytest.mark.parametrize("case", TINY, ids=lambda c: f"{c['service']}-rho{c['rho']}-co{c['c_o']}")
@pytest.mark.parametrize("bmax, smax", [(2, 4), (3, 5)])
def test_pi_and_rvi_match_brute_force(case, bmax, smax):
    model = _tiny(case, bmax, smax)
    g_star, _ = _brute_force(model)
    pi = policy_iteration(model)
    assert pi.converged
    assert pi.gain == pytest.approx(g_star, rel=1e-10)
    assert evaluate_policy(model, pi.policy).avg_cost == pytest.approx(g_star, rel=1e-10)
    rvi = relative_value_iteration(model, eps=1e-10)
    assert rvi.converged
    assert rvi.gain_bracket[0] - 1e-9 <= g_star <= rvi.gain_bracket[1] + 1e-9
    assert evaluate_policy(model, rvi.policy).avg_cost == pytest.approx(g_star, rel=1e-9)
    np.testing.assert_array_equal(rvi.policy, pi.policy)


def test_pi_relative_values_satisfy_eq20():
    model = _tiny(TINY[0], 3, 8)
    res = policy_iteration(model)
    M = model.dense()
    c = model.costs()
    rhs = c - res.gain * model.y[None, :] + np.einsum("saj,j->sa", M, res.relative_values)
    np.testing.assert_allclose(rhs.min(axis=1), res.relative_values, atol=1e-8)
    assert res.relative_values[0] == 0.0


@pytest.mark.parametrize("rho, w2, service", [(0.3, 0.5, "det"), (0.7, 1.6, "det"), (0.9, 1.0, "det"), (0.5, 2.0, "erlang:2")])
def test_rvi_and_pi_same_policy_on_paper_scale(rho, w2, service):
    p = BatchingProblem.basic(rho=rho, w2=w2, service=service)
    sol = solve(p, boundary="overflow")  # RVI implements eq. 19's boundary
    rvi = relative_value_iteration(sol.model, eps=1e-7)
    np.testing.assert_array_equal(rvi.policy, sol.result.policy)  # PI's optimum of the same truncation
    lo, hi = rvi.gain_bracket
    assert lo - 1e-9 <= sol.result.gain <= hi + 1e-9 and hi - lo < 1e-7


def test_rvi_cap_warns_and_flags():
    model = truncate(BatchingProblem.basic(rho=0.9), 70, 100.0)
    with pytest.warns(NotConvergedWarning, match="NOT certified"):
        res = relative_value_iteration(model, eps=0.01, max_iter=50)
    assert not res.converged and res.iterations == 50


def test_dense_transitions_are_stochastic_and_match_eq18():
    model = _tiny(TINY[1], 3, 6)
    M = model.dense()
    feas = model.feasible()
    np.testing.assert_allclose(M.sum(axis=2)[feas], 1.0, atol=1e-14)
    # from s=4 with a=2: next 2+k for k ≤ 4, rest to S_o
    i = list(model.actions).index(2)
    np.testing.assert_allclose(M[4, i, 2:7], model.P[i, :5])
    assert M[4, i, 7] == pytest.approx(model.SF[i, 4])
    assert M[6, 0, 7] == 1.0 and M[7, 0, 7] == 1.0  # s_max and S_o wait → S_o


def _pymdptoolbox_arrays(model, eta):
    """Discretized MDP of eq. 23 as dense (A, S, S) transitions and rewards = −c̃ (infeasible: huge cost)."""
    M = model.dense()
    S, A = model.n_states, len(model.actions)
    feas = model.feasible()
    P = np.zeros((A, S, S))
    R = np.zeros((S, A))
    costs = model.costs()
    for i in range(A):
        for s in range(S):
            if feas[s, i]:
                w = eta / model.y[i]
                P[i, s] = w * M[s, i]
                P[i, s, s] += 1 - w
                R[s, i] = -costs[s, i] / model.y[i]
            else:
                P[i, s, s] = 1.0
                R[s, i] = -1e9
    return P, R


def test_matches_pymdptoolbox_rvi_on_identical_arrays():
    mdptoolbox = pytest.importorskip("mdptoolbox.mdp")
    model = truncate(BatchingProblem.basic(rho=0.5), 40, 100.0)
    eta = 0.99 * model.eta_bound()
    P, R = _pymdptoolbox_arrays(model, eta)
    peer = mdptoolbox.RelativeValueIteration(P, R, epsilon=1e-8, max_iter=200_000)
    peer.run()
    ours = relative_value_iteration(model, eps=1e-8)
    np.testing.assert_array_equal(model.actions[np.array(peer.policy)], ours.policy)
    assert -peer.average_reward == pytest.approx(policy_iteration(model).gain, rel=1e-6)


def test_fixed_smax_degenerate_warns():
    from smdp_batch.errors import DegenerateTruncationWarning

    p = BatchingProblem.from_rho(0.2, batch_sizes=range(1, 9), latency="const:2.4252", service="exp", w2=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateTruncationWarning)
        with pytest.raises(DegenerateTruncationWarning):
            solve(p, s_max=100)
