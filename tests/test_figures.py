"""Paper 004 Fig. 3 (Cases 1–3) and Fig. 11 (Cases 4–7) from converged tables (§VII-A, App. E).

Fig. 3: every policy is control-limit; in Cases 2–3 (exponential, size-independent times) Q equals
Proposition 4's closed form; Case 3's limits are ≥ Case 2's, and equal at w2 = 0 (Corollary 1).
Fig. 11: the departures the paper describes appear — Case 4 (B_min = 5): at ρ = 0.1 and w2 ∈ {0, 0.5, 1}
states above B_max serve less than B_max; Case 5 (nonlinear ζ): a policy with more than one
wait/serve threshold; Case 6 (size-dependent l): batches smaller than min(n, B_max); Case 7: more of
them.  The presets are those of :mod:`smdp_batch.model.presets` (``fig3-case*``, ``fig11-case*``).
"""

import numpy as np
import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.cli import main
from smdp_batch.model.truncation import truncate
from smdp_batch.solvers.evaluation import resize_policy
from smdp_batch.solvers.pi import policy_iteration

from test_paper import prop4_q

RHOS = (0.1, 0.3, 0.5, 0.7, 0.9)
W2S = (0.0, 0.5, 1.0, 100.0)
SIZES = {4: range(5, 9), 7: range(5, 9)}


def _solve(case: str, rho: float, w2: float):
    sizes = SIZES.get(int(case[-1]), range(1, 9))
    return solve(BatchingProblem.from_rho(rho, batch_sizes=sizes, w2=w2, **_fields(case)))


def _fields(case: str) -> dict:
    from smdp_batch.model.presets import preset

    return preset(case)


@pytest.fixture(scope="module")
def tables():
    cases = ["fig3-case1", "fig3-case2", "fig3-case3", "fig11-case4", "fig11-case5", "fig11-case6", "fig11-case7"]
    return {(c, rho, w2): _solve(c, rho, w2) for c in cases for rho in RHOS for w2 in W2S}


def _table(sol) -> np.ndarray:
    return sol.policy[: sol.converged_upto + 1]


def _small(pol: np.ndarray, bmax: int = 8) -> list[int]:
    """Queue lengths where the table serves a batch smaller than min(n, B_max)."""
    return [n for n in range(pol.size) if 0 < pol[n] < min(n, bmax)]


def _switches(pol: np.ndarray) -> int:
    return int(np.count_nonzero(np.diff((pol > 0).astype(int))))


def test_every_table_is_converged_and_matches_a_truncation_four_times_longer(tables):
    for (case, rho, w2), sol in tables.items():
        assert sol.converged_upto is not None, (case, rho, w2)
        if rho in (0.1, 0.9) and w2 in (0.0, 100.0):
            model = truncate(sol.problem, 4 * sol.s_max, 0.0, tail=sol.model.tail_action)
            ref = policy_iteration(model, policy0=resize_policy(sol.policy, model.s_max))
            R = sol.converged_upto
            table = [sol.decide(n) for n in range(4 * R)]
            assert table == ref.policy[: 4 * R].tolist(), (case, rho, w2)
            other = solve(sol.problem, boundary="overflow")  # eq. 19's boundary, independently converged
            assert table == [other.decide(n) for n in range(4 * R)], (case, rho, w2)


@pytest.mark.parametrize("case", ["fig3-case1", "fig3-case2", "fig3-case3"])
def test_fig3_every_policy_is_control_limit(tables, case):
    for rho in RHOS:
        for w2 in W2S:
            sol = tables[(case, rho, w2)]
            assert sol.control_limit is not None, (case, rho, w2, _table(sol))
            assert sol.decide(10 ** 6) == 8
        assert tables[(case, rho, 100.0)].control_limit == 8  # "all B_max" at w2 = 100


@pytest.mark.parametrize("case, l", [("fig3-case2", 2.4252), ("fig3-case3", 1.7465)])
def test_fig3_cases_2_3_limits_equal_proposition_4(tables, case, l):
    for rho in RHOS:
        for w2 in W2S:
            sol = tables[(case, rho, w2)]
            assert sol.control_limit == prop4_q(sol.problem.lam, l, 8, 1.0, w2, 19.603), (case, rho, w2)


def test_fig3_case3_limits_at_least_case2_and_equal_at_w2_0(tables):
    for rho in RHOS:
        assert tables[("fig3-case3", rho, 0.0)].control_limit == tables[("fig3-case2", rho, 0.0)].control_limit
        for w2 in W2S:
            assert tables[("fig3-case3", rho, w2)].control_limit >= tables[("fig3-case2", rho, w2)].control_limit


def test_fig11_case4_serves_less_than_bmax_above_bmax_at_light_load(tables):
    for w2 in (0.0, 0.5, 1.0):
        pol = _table(tables[("fig11-case4", 0.1, w2)])
        assert any(n > 8 and 0 < pol[n] < 8 for n in range(pol.size)), (w2, pol)
        assert tables[("fig11-case4", 0.1, w2)].control_limit is None
    # and not merely Case 1's Q raised to 5: at ρ = 0.1, w2 = 0 Case 1 serves from n = 1
    assert tables[("fig3-case1", 0.1, 0.0)].control_limit == 1


def test_fig11_case5_has_a_policy_with_more_than_one_threshold(tables):
    multi = [(rho, w2) for rho in RHOS for w2 in W2S if _switches(_table(tables[("fig11-case5", rho, w2)])) > 1]
    assert multi, "no Case 5 policy with more than one wait/serve threshold"
    assert all(_switches(_table(tables[("fig3-case1", rho, w2)])) == 1 for rho in RHOS for w2 in W2S)


def test_fig11_case6_serves_smaller_batches_than_available(tables):
    assert any(_small(_table(tables[("fig11-case6", rho, w2)])) for rho in RHOS for w2 in W2S)
    assert not any(_small(_table(tables[("fig3-case1", rho, w2)])) for rho in RHOS for w2 in W2S)


def test_fig11_case7_departs_more_often_than_cases_4_to_6_alone(tables):
    def departures(case):
        return sum(tables[(case, rho, w2)].control_limit is None for rho in RHOS for w2 in W2S)

    assert departures("fig11-case7") >= max(departures(c) for c in ("fig11-case4", "fig11-case5", "fig11-case6"))
    assert departures("fig11-case7") >= 4


def test_tables_draws_fig11_from_converged_tables(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    fig = tmp_path / "fig11_case4.png"
    args = ["tables", "--preset", "fig11-case4", "--bmin", "5", "--bmax", "8", "--rho-grid", "0.1,0.5",
            "--w2-grid", "0,100", "--plot", str(fig), "-o", str(tmp_path / "t")]
    assert main(args) == 0
    assert fig.stat().st_size > 10_000
    readme = (tmp_path / "t" / "README.md").read_text()
    assert "converged" in readme and "not verified" not in readme
