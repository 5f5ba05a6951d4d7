"""The converged-table rule (``s_max="auto"``, :mod:`smdp_batch.solvers.search`) against longer truncations.

For every scenario the default table's decision at each queue length n < 4R (R = ``converged_upto``;
eq. 30 beyond the stored range) equals that of a solve on a truncation four times longer with the same
(tail) boundary, and that of the converged table on eq. 19's overflow boundary — an independent
truncation whose s_max must cover the queue tail — and the two boundaries' gains agree.
"""

import numpy as np
import pytest

from smdp_batch import BatchingProblem, InputError, solve
from smdp_batch.model.truncation import arrival_table, truncate
from smdp_batch.solvers.evaluation import resize_policy
from smdp_batch.solvers.pi import policy_iteration
from smdp_batch.solvers.search import limiting_actions, tail_rate

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def _p(rho, w2=1.0, **kw):
    kw.setdefault("batch_sizes", range(1, 33))
    return BatchingProblem.from_rho(rho, latency=kw.pop("latency", AFF), energy=LIN, w2=w2, **kw)


SCENARIOS = [(f"basic-rho{r}-w2{w}", _p(r, w)) for r in (0.1, 0.3, 0.5, 0.7, 0.9) for w in (0.0, 1.0, 5.0)]
for _r in (0.1, 0.5, 0.9):
    SCENARIOS += [
        (f"bmax8-rho{_r}", _p(_r, 0.5, batch_sizes=range(1, 9))),
        (f"pow2-rho{_r}", _p(_r, batch_sizes=[1, 2, 4, 8, 16, 32])),
        (f"exp-rho{_r}", _p(_r, service="exp")),
        (f"erlang4-rho{_r}", _p(_r, service="erlang:4")),
        (f"hyperexp-rho{_r}", _p(_r, service="hyperexp")),
        (f"bmin5-rho{_r}", _p(_r, batch_sizes=range(5, 9))),
    ]


@pytest.mark.parametrize("name, problem", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_default_table_equals_a_truncation_four_times_longer(name, problem):
    sol = solve(problem)
    R = sol.converged_upto
    assert R is not None and sol.rule == "auto" and sol.evaluation.delta < 1e-3 and sol.model.boundary == "tail"
    B = sol.model.tail_action
    model = truncate(problem, 4 * sol.s_max, 0.0, tail=B)
    ref = policy_iteration(model, policy0=resize_policy(sol.policy, model.s_max))
    table = [sol.decide(n) for n in range(4 * R)]
    assert table == ref.policy[: 4 * R].tolist()
    other = solve(problem, boundary="overflow")  # eq. 19, verified against its own doubled truncation
    assert other.model.boundary == "overflow" and other.converged_upto == R
    assert table == [other.decide(n) for n in range(4 * R)]
    assert sol.evaluation.avg_cost == pytest.approx(other.deployed.avg_cost, rel=1e-9)
    assert sol.decide(R) in limiting_actions(problem) and sol.decide(10**9) == sol.decide(R)
    assert np.all(sol.policy[R:] == sol.policy[R])  # stored: π(R) from R on, S_o included


def test_the_minimal_rule_keeps_the_truncation_artifact_the_issue_measured():
    p = _p(0.5)
    minimal, converged = solve(p, s_max="minimal"), solve(p)
    assert minimal.s_max == 32 and minimal.decide(40) == 23  # "serves 23 for every n ≥ 32"
    assert converged.converged_upto == 71 and converged.decide(47) == 26 and converged.decide(71) == 32
    p8 = _p(0.1, 0.0, batch_sizes=range(1, 9))
    assert solve(p8, s_max="minimal").decide(20) == 6 and solve(p8).decide(11) == 8


def test_large_w2_raises_the_overflow_cost_instead_of_the_truncation():
    p = _p(0.9, 100.0)
    sol = solve(p, boundary="overflow")
    assert sol.model.abstract_cost >= sol.evaluation.avg_cost > 100  # c_o ≥ ĝ (was 100 against ĝ ≈ 5 479)
    assert sol.s_max <= 256 and sol.converged_upto == 32 and sol.control_limit == 32
    assert sol.deployed.avg_cost == pytest.approx(5479.3298, rel=1e-6)
    tail = solve(p)  # the tail boundary has no overflow cost to degenerate
    assert tail.model.abstract_cost == 0 and tail.s_max <= 256 and tail.converged_upto == 32
    assert tail.evaluation.avg_cost == pytest.approx(5479.3298, rel=1e-6)


def test_tail_rate_is_the_bulk_service_root():
    """Deterministic service: z^b = exp(λl(z − 1)), the root beyond 1 in closed form by bisection here."""
    p = _p(0.9)
    b = 32
    m = p.lam * float(p.latency_ms()[-1])
    t = tail_rate(p, arrival_table(p, 4096), b)
    z = np.exp(t)
    assert b * np.log(z) == pytest.approx(m * (z - 1), rel=1e-9) and z > 1.1
    assert tail_rate(p, arrival_table(p, 4096), 1) == 0.0  # serving 1 cannot drain this load


def test_a_search_that_cannot_start_is_refused_before_any_work():
    """On eq. 19's boundary (the tail boundary's probable-range table: tests/test_probable_range.py)."""
    with pytest.raises(InputError, match="--s-max minimal"):
        solve(_p(0.9, batch_sizes=range(1, 4097)), boundary="overflow")
    with pytest.raises(InputError, match="probable range"):  # (exponential service there takes its own rule)
        solve(_p(0.9, batch_sizes=range(1, 1025), service="hyperexp"))


def test_fixed_and_minimal_tables_are_marked_unverified(tmp_path):
    from smdp_batch.export.hdf5 import write_policy
    from smdp_batch.runtime.schema import read_policy

    for s_max, rule in ((64, "fixed"), ("minimal", "minimal"), ("auto", "auto")):
        sol = solve(_p(0.5), s_max=s_max)
        path = tmp_path / f"{rule}.h5"
        write_policy(sol, path)
        pf = read_policy(path)
        assert pf.truncation["s_max_rule"] == rule == sol.to_dict()["s_max_rule"]
        assert pf.converged_upto == sol.converged_upto == (71 if rule == "auto" else None)


def test_converged_range_by_hand():
    """R = start of the big solution's last run of equal actions up to A (the end of agreement);
    accepted only for a greatest-throughput action with A ≥ 2R and A − R ≥ Bmax."""
    from smdp_batch.solvers.search import converged_range

    p = _p(0.5, batch_sizes=range(1, 5))  # Bmax 4, affine l: greatest throughput at b = 4
    big = np.array([0, 0, 2, 3, 4] + [4] * 20 + [3, 0])
    small = np.array([0, 0, 2, 3, 4] + [4] * 7 + [2, 0])  # agrees up to n = 11, then its boundary
    assert converged_range(small, big, 12, p) == (4, 11)  # run of 4 from n = 4 to A = 11: 11 ≥ 8, 7 ≥ 4
    short = np.array([0, 0, 2, 3, 4, 4, 4, 1, 0])
    assert converged_range(short, big, 7, p) == (None, 6)  # run 4..6: too short (A < 2R)
    three = big.copy()
    three[4:25] = 3  # a long run, but of an action that is not of greatest throughput
    assert converged_range(three[:14], three, 12, p)[0] is None
