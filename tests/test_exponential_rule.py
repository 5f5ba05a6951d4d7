"""Exponential batch times beyond the general search: the O(S) policy iteration and its converged rule.

Checked against independent computations: the general banded policy iteration and evaluation on the same
tail-boundary truncation (arrival tables from the law's transform, banded LU), numpy's polynomial roots for
the transient length, and the general converged rule where both reach.
"""

import math

import numpy as np
import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.errors import InputError
from smdp_batch.model.truncation import truncate
from smdp_batch.solvers.evaluation import evaluate_policy
from smdp_batch.solvers.exponential import solve_exponential, transient_length
from smdp_batch.solvers.geometric import geometric_model
from smdp_batch.solvers.geometric_system import evaluate, metrics
from smdp_batch.solvers.geometric_pi import policy_iteration
from smdp_batch.solvers.limit import limit_onset
from smdp_batch.solvers.pi import policy_iteration as general_pi
from smdp_batch.solvers.solution import exponential_route

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def _p(rho, B, **kw):
    return BatchingProblem.from_rho(rho, latency=AFF, energy=LIN, batch_sizes=range(1, B + 1), service="exp", **kw)


CASES = [(16, 0.9, 1.0, 200), (32, 0.5, 5.0, 400), (32, 0.3, 20.0, 300), (64, 0.7, 0.0, 600), (64, 0.9, 1.0, 1500)]


@pytest.mark.parametrize("B, rho, w2, S", CASES, ids=[f"B{c[0]}-rho{c[1]}-w2{c[2]}" for c in CASES])
def test_policy_iteration_and_metrics_equal_the_general_solver_on_the_same_truncation(B, rho, w2, S):
    p = _p(rho, B, w2=w2)
    m = geometric_model(p, S)
    r = policy_iteration(m)
    ref = general_pi(truncate(p, S, tail=B))
    assert np.array_equal(m.sizes[r.policy], ref.policy[:-1])
    assert abs(r.gain - ref.gain) <= 1e-10 * ref.gain
    ev = evaluate_policy(truncate(p, S, tail=B), ref.policy)
    mine = metrics(m, r.policy)
    for k in ("mean_latency_ms", "mean_power_w", "throughput", "mean_batch_size"):
        assert abs(mine[k] - getattr(ev, k)) <= 1e-9 * abs(getattr(ev, k)), k
    assert abs(mine["delta"] - ev.delta) <= 1e-9 * ev.avg_cost
    assert abs(mine["overflow_probability"] - ev.overflow_probability) <= 1e-9


def test_an_arbitrary_policy_evaluates_like_the_general_evaluation():
    """Not only optimal ones: a random non-monotone table with waits, every action change an 'end' row."""
    p = _p(0.8, 24, w2=2.0)
    S = 300
    m = geometric_model(p, S)
    rng = np.random.default_rng(3)
    pol = rng.integers(0, 25, size=S + 1)
    pol = np.minimum(pol, np.arange(S + 1))
    pol[:3] = 0
    pol[200:] = 24
    g, h = evaluate(m, pol)
    tm = truncate(p, S, tail=24)
    ev = evaluate_policy(tm, np.append(pol, 24))
    assert abs(g - ev.avg_cost) <= 1e-10 * ev.avg_cost


def test_the_transient_length_is_that_of_the_characteristic_roots():
    for B, rho in ((16, 0.9), (64, 0.9), (64, 0.5), (200, 0.95)):
        p = _p(rho, B)
        m = p.lam * float(p.latency(np.float64(B)))
        q = m / (1 + m)
        c = np.zeros(B + 2)
        c[0], c[1], c[-1] = q, -1.0, 1 - q
        r = np.abs(np.roots(c))
        r = r[r < 1 - 1e-9].max()
        assert transient_length(p, B) == pytest.approx(-1 / math.log(r), rel=1e-8)


def test_the_rule_reproduces_the_general_converged_table_where_both_reach():
    for rho, B in ((0.9, 64), (0.5, 32)):
        p = _p(rho, B)
        a = solve_exponential(p)
        s = solve(p)
        R = a.converged_upto
        assert R == s.converged_upto
        assert np.array_equal(a.table[: R + 1], s.policy[: R + 1])
        assert abs(a.result.gain - s.result.gain) <= 1e-9 * s.result.gain
        assert a.evaluation.mean_latency_ms == pytest.approx(s.deployed.mean_latency_ms, rel=1e-9)
        assert a.evaluation.mean_power_w == pytest.approx(s.deployed.mean_power_w, rel=1e-9)


@pytest.mark.slow
def test_bmax_128_at_rho_09_was_refused_and_now_solves_as_the_general_solver_decides_at_twice_the_length():
    """The general search refuses it (its converged pair needs 8 192 states × 2 466-wide rows); the rule solves it,
    and the general policy iteration on the tail-boundary truncation of 8 192 states — warm-started from the
    rule's table, so a single evaluation and improvement — takes every decision n ≤ R the same way."""
    p = _p(0.9, 128)
    assert exponential_route(p)
    sol = solve(p)
    R = sol.converged_upto
    assert R == 2017 and sol.verified_against is not None and sol.verified_against >= R
    assert sol.converged_to_limit is True and int(sol.policy[R]) == 128
    S = 8192
    start = np.append(np.append(sol.policy[: R + 1], np.full(S - R, 128)), 128)
    ref = general_pi(truncate(p, S, tail=128), policy0=start)
    assert np.array_equal(ref.policy[: R + 1], sol.policy[: R + 1])
    assert int(np.nonzero(ref.policy[:4096] != 128)[0].max()) + 1 == R
    assert R - (math.floor(limit_onset(p, 128, ref.gain)) + 1) in (0, 1)  # the onset of eq. 20's quadratic bias


def test_too_long_a_table_is_refused_before_any_work_in_one_line():
    p = _p(0.97, 2048)
    calls = []
    with pytest.raises(InputError, match=r"no verified table is within reach for Bmax = 2048.*limits 524288 states"):
        solve(p, progress=lambda *a: calls.append(a))
    assert calls == []  # no truncation was solved


def test_progress_is_reported_per_policy_iteration():
    calls = []
    solve(_p(0.9, 128), progress=lambda *a: calls.append(a))
    assert calls and all(stage == "exponential rule" for stage, _, _ in calls)
    assert [done for _, _, done in calls] == sorted(done for _, _, done in calls)


def test_other_laws_and_reachable_problems_keep_the_general_rule():
    assert not exponential_route(_p(0.5, 32))  # reachable: unchanged
    assert not exponential_route(BatchingProblem.from_rho(0.9, latency=AFF, energy=LIN, batch_sizes=range(1, 129),
                                                          service="hyperexp"))


@pytest.mark.slow
@pytest.mark.cpu_heavy
def test_bmax_1024_at_rho_09_solves_and_independent_computations_agree():
    """The case the general search refuses (its converged table would need ~6·10⁵ states × 1 024 sizes with
    38 000-state arrival rows).  Independent checks: the quadratic bias of eq. 20 with the solved ĝ puts the
    start of the Bmax run within one transient length of R (limit.py's formula, no solve), and the event
    simulator, running the table on 10⁷ Poisson requests with exponential batch times, finds W̄ and P̄
    within three batch-means half-widths of the exact figures (P̄'s is ~0.15 %; W̄'s ~20 %: batches of ~10³
    requests give the queue a long memory)."""
    from smdp_batch.analysis.simulate import simulate

    p = _p(0.9, 1024)
    sol = solve(p)
    R = sol.converged_upto
    assert sol.converged_to_limit is True and int(sol.policy[R]) == 1024 and int(sol.policy[R - 1]) < 1024
    assert sol.verified_against is not None and sol.verified_against - R >= 40 * transient_length(p, 1024)
    assert abs(R - (math.floor(limit_onset(p, 1024, sol.result.gain)) + 1)) <= transient_length(p, 1024)
    assert np.all(np.diff(sol.policy[: R + 1]) >= 0)  # monotone, as the optimal table of this model is
    sim = simulate(p, sol.policy[: R + 2], requests=10_000_000, seed=11)  # batches of ~10³: long memory
    ev = sol.deployed
    assert 0.0 <= ev.overflow_probability < 1e-20  # a probability (its round-off once came out −2.5e-32)
    assert abs(sim.mean_latency_ms - ev.mean_latency_ms) <= 3 * sim.mean_latency_ci
    assert abs(sim.mean_power_w - ev.mean_power_w) <= 3 * sim.mean_power_ci


def test_the_table_file_keeps_what_it_was_verified_against(tmp_path):
    """solve -o FILE, then show: the exponential rule's R was verified against a stated truncation, not 2R."""
    import json
    import subprocess
    import sys

    from smdp_batch.runtime.schema import read_policy

    path = tmp_path / "exp128.h5"
    run = [sys.executable, "-m", "smdp_batch", "solve", "--bmax", "128", "--rho", "0.9", "--service", "exp"]
    r = subprocess.run([*run, "-o", str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    R, against = d["converged_upto"], d["verified_against"]
    assert R == 2017 and R < against < d["s_max"] and d["converged_to_limit"] is True
    pf = read_policy(path)
    assert pf.converged_upto == R and pf.truncation["verified_against"] == against
    assert pf.truncation["delta"] < 1e-3
    show = subprocess.run([sys.executable, "-m", "smdp_batch", "show", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0 and f"verified against a truncation of {against} states" in show.stdout, show.stdout
