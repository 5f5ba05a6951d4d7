"""The shipped tables in policies/: every file loads and equals a fresh solve of its scenario."""

import re
from pathlib import Path

import numpy as np
import pytest

from smdp_batch import BatchingProblem
from smdp_batch.runtime import read_policy
from smdp_batch.runtime import PolicyTable
from smdp_batch.solvers import solve

FOLDER = Path(__file__).resolve().parent.parent / "policies"
RHOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
W2S = [0, 0.5, 1, 1.6, 2.2, 5]
FILES = sorted(FOLDER.glob("*.h5"))


def test_the_grid_is_complete_and_indexed():
    expected = {f"basic_rho{r:.2f}_w2-{w:g}.h5" for r in RHOS for w in W2S}
    assert {p.name for p in FILES} == expected
    readme = (FOLDER / "README.md").read_text()
    assert set(re.findall(r"`(basic_rho[^`]+\.h5)`", readme)) == expected
    assert "smdp-batch tables --preset basic --rho-grid 0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9 --w2-grid 0,0.5,1,1.6,2.2,5 -o policies" in readme


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_shipped_table_equals_a_fresh_solve(path):
    pf = read_policy(path)
    rho, w2 = float(pf.inputs["rho"]), float(pf.inputs["w2"])
    assert f"basic_rho{rho:.2f}_w2-{w2:g}.h5" == path.name
    sol = solve(BatchingProblem.basic(rho=rho, w2=w2))
    assert np.array_equal(pf.policy, sol.policy)
    assert pf.converged_upto == sol.converged_upto is not None
    assert pf.solution["avg_cost"] == pytest.approx(sol.to_dict()["avg_cost"], rel=1e-9)
    table = PolicyTable.load(path)  # the runtime's loader accepts it
    assert [table.decide(n) for n in range(3 * sol.s_max)] == [pf.decide(n) for n in range(3 * sol.s_max)]
