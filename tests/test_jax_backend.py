"""The JAX backend (issue #4): jit PI/RVI, vmap batches, warm starts — equal to the numba path."""

import json
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from smdp_batch import BatchingProblem, InputError, solve, solve_batch, truncate  # noqa: E402
from smdp_batch.cli import main  # noqa: E402
from smdp_batch.solvers import policy_iteration, relative_value_iteration  # noqa: E402
from smdp_batch.solvers.jax_backend import pi_batch, rvi_batch  # noqa: E402
from smdp_batch.solvers.pi import _initial_policy  # noqa: E402

SIZES = range(1, 17)
SMAX = 60


def _models(rhos=(0.3, 0.6, 0.9), w2s=(0.0, 1.0, 3.0), service="det"):
    return [truncate(BatchingProblem.basic(r, w, batch_sizes=SIZES, service=service), SMAX, 100.0) for r in rhos for w in w2s]


def _same(r_numba, r_jax):
    assert np.array_equal(r_numba.policy, r_jax.policy)
    assert r_jax.gain == pytest.approx(r_numba.gain, rel=1e-9)


@pytest.mark.parametrize("service", ["det", "erlang:2", "hyperexp:0.6667/0.5,0.3333/2"])
def test_vmap_batch_equals_individual_numba_solves(service):
    models = _models(service=service)
    out = pi_batch(models)
    assert len(out) == len(models)
    for m, r in zip(models, out):
        assert r.converged and r.backend == "jax"
        n = policy_iteration(m, policy0=m.actions[_initial_policy(m)])
        _same(n, r)
        assert r.iterations == n.iterations  # same path from the same greedy start
        _same(policy_iteration(m), r)  # numba's default start (best of greedy and a control limit)
        np.testing.assert_allclose(r.relative_values, n.relative_values, rtol=1e-9, atol=1e-9 * np.abs(n.relative_values).max())


def test_warm_start_from_the_optimum_stops_at_once():
    models = _models()
    first = pi_batch(models)
    again = pi_batch(models, policy0=np.stack([r.policy for r in first]))
    for a, b in zip(first, again):
        assert b.iterations == 1 and np.array_equal(a.policy, b.policy)


def test_rvi_batch_matches_numba_rvi():
    models = _models(rhos=(0.5, 0.9), w2s=(1.0,))
    for m, r in zip(models, rvi_batch(models, eps=0.01)):
        n = relative_value_iteration(m, eps=0.01)
        assert r.converged and np.array_equal(r.policy, n.policy)
        assert r.iterations == n.iterations
        assert r.gain_bracket[0] == pytest.approx(n.gain_bracket[0], rel=1e-9)
        assert r.gain_bracket[1] == pytest.approx(n.gain_bracket[1], rel=1e-9)


def test_solve_batch_grid_same_on_both_backends_including_singular_fallbacks():
    # w2 = 10 at s_max = 70 meets numerically multichain policies on the way (PI's fallback path)
    probs = [BatchingProblem.basic(r, w) for r in (0.3667, 0.42, 0.9) for w in (0.5, 7.0, 10.0)]
    a = solve_batch(probs, 70)
    b = solve_batch(probs, 70, backend="jax")
    for x, y in zip(a, b):
        assert np.array_equal(x.policy, y.policy)
        assert y.result.gain == pytest.approx(x.result.gain, rel=1e-9)
        assert y.result.converged


def test_solve_backend_jax_auto_smax_equals_numba():
    p = BatchingProblem.basic(0.9, 1.0)
    a, b = solve(p), solve(p, backend="jax")
    assert a.s_max == b.s_max and a.converged_upto == b.converged_upto == 32
    assert b.result.backend == "jax" and np.array_equal(a.policy, b.policy)
    assert b.result.gain == pytest.approx(a.result.gain, rel=1e-9)


def test_batch_needs_one_shape():
    m1 = truncate(BatchingProblem.basic(0.5, 1.0, batch_sizes=SIZES), SMAX)
    m2 = truncate(BatchingProblem.basic(0.5, 1.0, batch_sizes=SIZES), SMAX + 1)
    with pytest.raises(InputError, match="one s_max"):
        pi_batch([m1, m2])
    with pytest.raises(InputError, match="policy0 must have shape"):
        pi_batch([m1], policy0=np.zeros((2, SMAX + 2)))


def test_cli_backend_jax(capsys):
    rc = main(["solve", "--rho", "0.9", "--smax", "70", "--json"])
    d = json.loads(capsys.readouterr().out)
    rc2 = main(["solve", "--rho", "0.9", "--smax", "70", "--backend", "jax", "--json"])
    e = json.loads(capsys.readouterr().out)
    assert rc == rc2 == 0 and e["backend"] == "jax" and d["backend"] == "numba"
    assert e["policy"] == d["policy"] and e["avg_cost"] == pytest.approx(d["avg_cost"], rel=1e-9)


def test_results_are_float64():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = pi_batch(_models(rhos=(0.5,), w2s=(1.0,)))[0]
    assert r.relative_values.dtype == np.float64 and isinstance(r.gain, float)
