"""Large Bmax: the probable-range table (:func:`smdp_batch.solvers.search._search_probable`).

With thousands of batch sizes the converged rule's first truncation (4·Bmax states) is beyond the work
limit, and the optimal batch keeps growing with the queue far beyond any queue that occurs.  The table
is then verified on the queue lengths that carry probability, on tail-boundary truncations shorter than
Bmax.  Checked against independent computations: a full-action solve on a truncation ≥ 4R with the
infinite queue's own tail action (B = Bmax), the deployed evaluation (eq. 30) of the stored table, and
the sliding-window expectations for the improvement product that skips the infeasible batch sizes.
"""

import numpy as np
import pytest
import subprocess
import sys

from smdp_batch import BatchingProblem, solve
from smdp_batch.errors import TableNotConvergedWarning
from smdp_batch.model.truncation import truncate
from smdp_batch.solvers.evaluation import evaluate_deployed
from smdp_batch.solvers.kernels import expected_next_table, improve, window_filters
from smdp_batch.solvers.pi import _initial_policy, policy_iteration
from smdp_batch.solvers.search import PROBABLE_MASS, tail_action_at

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "smdp_batch", *args], capture_output=True, text=True, timeout=300)


def _p(rho, w2=1.0, **kw):
    return BatchingProblem.from_rho(rho, latency=kw.pop("latency", AFF), energy=LIN, w2=w2, **kw)


@pytest.fixture(scope="module")
def big():
    p = _p(0.9, batch_sizes=range(1, 1025))
    with pytest.warns(TableNotConvergedWarning, match="verified for queue lengths n ≤ .* not to the infinite queue's limit"):
        s = solve(p)
    return p, s


def test_the_table_is_verified_on_the_probable_range(big):
    p, s = big
    R = s.converged_upto
    assert R is not None and R >= 100 and s.s_max < p.bmax and s.s_max >= 2 * R
    assert s.converged_to_limit is False and s.to_dict()["converged_to_limit"] is False
    assert s.model.boundary == "tail" and s.model.tail_action == tail_action_at(p, s.s_max)
    assert np.all(s.policy[R + 1:] == s.policy[R])
    # an independent solve: every batch size, the infinite queue's tail action Bmax, 4R ≤ 2 048 states
    m = truncate(p, 2048, tail=p.bmax)
    r = policy_iteration(m)
    assert r.converged
    np.testing.assert_array_equal(s.policy[: R + 1], r.policy[: R + 1])
    # the stored table as deployed (eq. 30: π(R) beyond R): optimal ĝ, and the queue rarely passes R
    dep = evaluate_deployed(p, s.policy)
    assert dep.avg_cost == pytest.approx(r.gain, rel=1e-9)
    assert float(dep.stationary[R + 1:].sum()) < PROBABLE_MASS
    assert s.evaluation.delta < 1e-3


def test_a_basic_table_converges_to_the_limit():
    assert solve(_p(0.5, batch_sizes=range(1, 33))).converged_to_limit is True


def test_the_probable_range_table_is_written_read_and_shown(big, tmp_path):
    from smdp_batch.export.hdf5 import write_policy
    from smdp_batch.runtime.schema import read_policy

    p, s = big
    path = tmp_path / "big.h5"
    write_policy(s, path)
    pf = read_policy(path)  # s_max < Bmax is allowed for a tail-boundary table
    assert pf.converged_upto == s.converged_upto and pf.truncation["s_max"] == s.s_max < p.bmax
    np.testing.assert_array_equal(pf.policy, s.policy)
    out = _cli("show", str(path))
    assert out.returncode == 0, out.stderr
    assert f"verified up to n = {s.converged_upto}" in out.stdout and "NOT converged to the limit" in out.stdout


def test_an_overflow_table_shorter_than_bmax_is_still_refused(tmp_path):
    import h5py

    from smdp_batch.errors import InputError
    from smdp_batch.export.hdf5 import write_policy
    from smdp_batch.runtime.schema import read_policy

    path = tmp_path / "t.h5"
    write_policy(solve(_p(0.5, batch_sizes=range(1, 33)), s_max=40), path)  # eq. 19's S_o (fixed s_max)
    with h5py.File(path, "r+") as f:
        f["truncation"].attrs["s_max"] = 20
    with pytest.raises(InputError, match="expected ≥ Bmax = 32"):
        read_policy(path)


def test_a_probable_range_too_long_for_the_work_limit_is_refused_in_one_line():
    r = _cli("solve", "--bmax", "1024", "--rho", "0.9", "--service", "hyperexp")
    assert r.returncode == 2 and r.stdout == ""
    lines = [x for x in r.stderr.strip().splitlines() if x]
    assert len(lines) == 1 and "probable range" in lines[0], r.stderr


def test_the_improvement_product_skips_batch_sizes_above_s_max():
    """A tail-boundary truncation shorter than Bmax: the BLAS product over the usable batch sizes picks the
    argmin of the sliding expectations (every action, infeasible ones +inf)."""
    rng = np.random.default_rng(5)
    for service in ("det", "exp", "gamma:0.5"):
        p = _p(0.6, batch_sizes=range(1, 129), service=service)
        for s_max in (40, 64, 100):
            m = truncate(p, s_max, tail=tail_action_at(p, s_max))
            assert m.s_max < p.bmax
            h = rng.normal(size=m.n_states).cumsum()
            F, tail, jmin = window_filters(m.P, m.SF, m.klo, m.khi, m.actions, m.s_max)
            u = (m.actions > 0) & (m.actions <= s_max)  # the window spans the usable batch sizes only
            lo, hi = min(1, int((m.klo - m.actions)[u].min())), max(1, int((m.khi - m.actions)[u].max()))
            assert jmin == lo and F.shape == (hi - lo + 1, int(u.sum()) + 1) and not tail[m.actions > s_max].any()
            EH = expected_next_table(h, m.P, m.SF, m.klo, m.khi, m.actions, m.s_max)
            costs = np.where(m.feasible(), 0.0, np.inf)
            new = improve(_initial_policy(m), 0.0, h, costs, F, tail, jmin, m.sojourn(), m.s_max)
            rows = np.arange(m.n_states)
            best = np.where(m.feasible(), EH, np.inf).min(axis=1)  # only B at s_max and S_o
            np.testing.assert_allclose(EH[rows, new], best, rtol=1e-12, atol=1e-12 * np.abs(h).max())


def test_a_tail_search_that_cannot_double_keeps_its_probable_range():
    """The converged rule's last pair, when the state limit stops the doubling before the limit action is
    reached, is accepted on its probable range; with room to double, the same problem converges to the
    limit, and both tables agree on the probable range."""
    from smdp_batch.solvers.search import Candidates, limiting_actions, search_converged

    p = _p(0.9, batch_sizes=[2 ** i for i in range(9)])  # Bmax 256
    B = max(limiting_actions(p))
    short = search_converged(Candidates(p, 1e-3, tail=B), 0.0, max_smax=1024)
    full = search_converged(Candidates(p, 1e-3, tail=B), 0.0, max_smax=4096)
    assert short.probable and short.mass < PROBABLE_MASS and short.converged_upto is not None
    assert not full.probable and int(full.policy[full.converged_upto]) == B
    R = short.converged_upto
    assert full.candidate.model.s_max >= 2 * R
    np.testing.assert_array_equal(short.policy[: R + 1], full.candidate.res.policy[: R + 1])
