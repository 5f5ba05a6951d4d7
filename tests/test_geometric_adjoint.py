"""The exponential rule's adjoint side and its coarse start, against the forward solves they replace.

* the transposed operator and preconditioner are transposes (⟨w, A·x⟩ = ⟨Aᵀw, x⟩ for random vectors), on random
  non-monotone policies with waits, where every action change is an "end" row;
* one adjoint solve gives the same gains as each cost's own certified forward solve, and the metrics equal the
  general banded evaluation on the same truncation;
* the coarse start (fewer batch sizes first) gives the same table as the quadratic start, and the switch to the
  limit action lands where eq. 20's quadratic bias puts it.
"""

import math

import numpy as np
import pytest

from smdp_batch import BatchingProblem
from smdp_batch.errors import InputError
from smdp_batch.model.truncation import truncate
from smdp_batch.solvers import exponential
from smdp_batch.solvers.evaluation import evaluate_policy
from smdp_batch.solvers.geometric import geometric_model
from smdp_batch.solvers.geometric_pi import policy_iteration
from smdp_batch.solvers.geometric_system import TIGHT, _System, metrics
from smdp_batch.solvers.limit import limit_onset

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def _p(rho, B, **kw):
    return BatchingProblem.from_rho(rho, latency=AFF, energy=LIN, batch_sizes=range(1, B + 1), service="exp", **kw)


def _random_policy(rng, S, B):
    pol = rng.integers(0, B + 1, size=S + 1)
    pol = np.minimum(pol, np.arange(S + 1))
    pol[: 3] = 0
    pol[int(0.7 * S):] = B
    return pol


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_transposed_operator_and_preconditioner_are_transposes(seed):
    rng = np.random.default_rng(seed)
    p = _p(0.8, 24, w2=2.0)
    m = geometric_model(p, 300)
    system = _System(m, _random_policy(rng, 300, 24))
    x, w = rng.standard_normal(301), rng.standard_normal(301)
    assert w @ system._a(x) == pytest.approx(x @ system._at(w), rel=1e-12)
    assert w @ system._precondition(x) == pytest.approx(x @ system._precondition_t(w), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_adjoint_solve_gives_each_cost_s_gain_as_its_own_forward_solve(seed):
    rng = np.random.default_rng(seed)
    p = _p(0.9, 32, w2=1.0)
    m = geometric_model(p, 400)
    for pol in (_random_policy(rng, 400, 32), policy_iteration(m).policy):
        system = _System(m, pol)
        z, res, _ = system.adjoint()
        assert res < 1e-10
        for name, cost in m.parts.items():
            forward = system.solve(cost, TIGHT, maxiter=480)[0]
            assert z @ system.rhs(cost) == pytest.approx(forward, rel=1e-9, abs=1e-12), name


def test_metrics_from_the_adjoint_equal_the_general_evaluation_when_w1_is_small():
    """w1 → small: W̄ is then not (ĝ − w2·P̄)/w1 (that would lose its digits) but its own solve."""
    p = _p(0.7, 32, w1=1e-4, w2=1.0)
    S = 400
    m = geometric_model(p, S)
    r = policy_iteration(m)
    ev = evaluate_policy(truncate(p, S, tail=32), np.append(m.sizes[r.policy], 32))
    mine = metrics(m, r.policy, r.gain)
    for k in ("mean_latency_ms", "mean_power_w", "mean_batch_size"):
        assert mine[k] == pytest.approx(getattr(ev, k), rel=1e-9), k


def test_a_wrong_gain_is_caught_by_the_adjoint_check():
    p = _p(0.8, 16)
    m = geometric_model(p, 200)
    r = policy_iteration(m)
    with pytest.raises(InputError, match="disagrees with its gain"):
        metrics(m, r.policy, r.gain * 1.01)


def test_the_coarse_start_gives_the_quadratic_start_s_table(monkeypatch):
    """256 sizes: the coarse start solves 184 of them first.  Both ways give one table, and its run of Bmax starts
    where eq. 20's quadratic bias, with the solved ĝ, puts it (to one state: an integer rounding)."""
    p = _p(0.9, 256)
    a = exponential.solve_exponential(p)
    monkeypatch.setattr(exponential, "coarse_start", lambda problem, model, keep, log=None:
                        (exponential.quadratic_start(problem, model), None))
    b = exponential.solve_exponential(p)
    assert a.converged_upto == b.converged_upto
    assert np.array_equal(a.table, b.table)
    assert a.result.gain == pytest.approx(b.result.gain, rel=1e-10)
    assert abs(a.converged_upto - (math.floor(limit_onset(p, 256, a.result.gain)) + 1)) <= 1


def test_the_coarse_start_keeps_the_tail_and_limiting_sizes_and_logs_its_steps():
    p = _p(0.9, 256)
    m = geometric_model(p, 30000)
    lines = []
    pol, guess = exponential.coarse_start(p, m, {256}, lines.append)
    assert guess is not None and pol.shape == (30001,) and pol[-1] == m.tail
    assert lines and all(line.startswith("coarse (") for line in lines)
    used = set(m.sizes[pol].tolist())
    assert 256 in used and all(b <= 64 or b % 2 == 1 or b == 256 for b in used)  # 1..64, every 2nd, the tail
    small = _p(0.9, 64)
    ms = geometric_model(small, 2000)
    pol, guess = exponential.coarse_start(small, ms, {64})
    assert guess is None and np.array_equal(pol, exponential.quadratic_start(small, ms))


def test_settle_stops_policy_iteration_after_its_loose_steps():
    p = _p(0.9, 64)
    m = geometric_model(p, 3000)
    r = policy_iteration(m, exponential.quadratic_start(p, m), near=False, settle=True)
    full = policy_iteration(m, exponential.quadratic_start(p, m), near=False)
    assert not r.converged and full.converged and r.iterations < full.iterations
    assert np.count_nonzero(r.policy != full.policy) <= max(16, 3001 // 1000) * 4
