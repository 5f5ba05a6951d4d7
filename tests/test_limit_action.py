"""The long-queue action of a converged table (:mod:`smdp_batch.solvers.limit`).

* Ties: with l(b) ∝ b every batch size has the same throughput and the table settles on one of them, not
  necessarily Bmax.  Checked against an independent dense policy iteration written here (numpy/scipy, eq. 11
  costs, eq. 9 sojourns, arrivals past a long truncation lumped into its last state).
* The onset of the limit action from the quadratic bias of eq. 20: R = ⌊n*(ĝ)⌋ + 1 (or Bmax) to within one
  state on converged tables, n*(0) ≤ R, and against the last change of action of a long independent truncation.
* Reach: exponential-type service with large Bmax (the limit action starts near n ≈ 1.5·10⁵ for Bmax 1 024 at
  ρ = 0.9) is refused before any truncation is solved, with the reason.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from smdp_batch import BatchingProblem, InputError, solve
from smdp_batch.errors import TableNotConvergedWarning
from smdp_batch.solvers.limit import check_reach, limit_onset, limiting_sizes, onset_terms, reach
from smdp_batch.solvers.search import SMAX_LIMIT

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def dense_pi(problem: BatchingProblem, service: str, N: int):
    """Average-cost policy iteration on states 0..N by dense linear algebra; a jump past N lands on N.

    Independent of the package's model and solvers: Poisson (det) or geometric (exp) arrival counts from
    scipy, costs c(n, 0) = w1·n/λ², c(n, b) = w2·ζ(b) + w1·(n·l(b)/λ + E G_b²/2) (eq. 11), sojourns 1/λ and l(b)
    (eq. 9).  Returns (policy of batch sizes on 0..N, g)."""
    lam, w1, w2 = problem.lam, problem.w1, problem.w2
    sizes = np.asarray(problem.batch_sizes)
    l, zeta = problem.latency_ms(), problem.energy_mj()
    k = np.arange(N + 1)
    if service == "det":
        P = [stats.poisson.pmf(k, lam * li) for li in l]
        m2 = l * l
    else:
        q = lam * l / (1 + lam * l)
        P = [(1 - qi) * qi ** k for qi in q]
        m2 = 2 * l * l
    n = np.arange(N + 1)
    C = np.full((N + 1, len(sizes) + 1), np.inf)
    Y = np.empty_like(C)
    C[:N, 0], Y[:, 0] = w1 * n[:N] / lam ** 2, 1 / lam  # no waiting at N
    for i, b in enumerate(sizes):
        C[b:, i + 1] = w2 * zeta[i] + w1 * (n[b:] * l[i] / lam + m2[i] / 2)
        Y[:, i + 1] = l[i]

    def matrix(pol):
        M = np.zeros((N + 1, N + 1))
        for s, a in enumerate(pol):
            if a == 0:
                M[s, s + 1] = 1.0
                continue
            p, base = P[a - 1], s - sizes[a - 1]
            M[s, base:N] = p[: N - base]
            M[s, N] += 1.0 - p[: N - base].sum()
        return M

    def expect(h, i):
        b, p = sizes[i], P[i]
        hext = np.concatenate([h, np.full(N + 1, h[N])])
        out = np.full(N + 1, np.inf)
        out[b:] = np.correlate(hext, p, mode="valid")[: N + 1 - b] + (1.0 - p.sum()) * h[N]
        return out

    pol = np.array([np.searchsorted(sizes, s, side="right") for s in n])  # greedy: largest size ≤ n
    for _ in range(100):
        A = np.eye(N + 1) - matrix(pol)
        A[:, 0] = Y[n, pol]
        x = np.linalg.solve(A, C[n, pol])
        g, h = x[0], np.concatenate([[0.0], x[1:]])
        Q = C - g * Y
        Q[:N, 0] += h[1:]
        for i in range(len(sizes)):
            Q[:, i + 1] += expect(h, i)
        best = Q.min(axis=1)
        keep = Q[n, pol] <= best + 1e-10 * np.maximum(1.0, np.abs(best))
        new = np.where(keep, pol, Q.argmin(axis=1))
        if np.array_equal(new, pol):
            return np.concatenate([[0], sizes])[pol], g
        pol = new
    raise AssertionError("dense PI did not settle")


def _tie(rho, service="det", **kw):
    kw.setdefault("energy", LIN)
    return BatchingProblem.from_rho(rho, latency=kw.pop("latency", "affine:0.25,0"), service=service, **kw)


TIES = [
    ("l=0.25b rho0.5 (settles on 18)", _tie(0.5), "det", 600),
    ("l=0.25b sizes 1,2,4..32", _tie(0.5, batch_sizes=[1, 2, 4, 8, 16, 32]), "det", 600),
    ("l=0.25b rho0.9", _tie(0.9), "det", 600),
    ("l=0.4b rho0.3 w2=5", _tie(0.3, latency="affine:0.4,0", w2=5.0), "det", 600),
    ("l=0.25b energy=20b", _tie(0.5, energy="affine:20,0"), "det", 400),
    ("l=0.25b exp", _tie(0.5, service="exp"), "exp", 1000),
]


@pytest.mark.parametrize("name, problem, service, N", TIES, ids=[t[0] for t in TIES])
def test_tied_sizes_settle_where_a_dense_solve_settles(name, problem, service, N, recwarn):
    sol = solve(problem)
    R, B = sol.converged_upto, problem.bmax
    assert not [w for w in recwarn if issubclass(w.category, TableNotConvergedWarning)]
    assert R is not None and R <= 4 * B and sol.converged_to_limit
    b = sol.decide(R)
    assert sol.model.tail_action == b and np.all(sol.policy[R:] == b)
    ref, g = dense_pi(problem, service, N)
    np.testing.assert_array_equal(sol.policy[: R + 1], ref[: R + 1])
    assert np.all(ref[R: N // 2] == b), "the dense solve settles on the same size over a long range"
    assert sol.deployed.avg_cost == pytest.approx(g, rel=1e-7)
    # the quadratic bias of eq. 20 agrees: no tied size beats b at long queues (C ≥ 0 against it)
    L, C = onset_terms(problem, b, sol.evaluation.avg_cost)
    tied = [list(problem.batch_sizes).index(t) for t in limiting_sizes(problem.batch_sizes, problem.latency_ms())]
    assert np.all(np.abs(L[tied]) < 1e-9 * np.abs(L).max(initial=1.0) + 1e-12) and C[tied].min() >= -1e-9 * abs(g)


def test_the_tie_case_from_the_cli_is_a_short_table():
    r = subprocess.run([sys.executable, "-m", "smdp_batch", "solve", "--latency", "affine:0.25,0", "--rho", "0.5",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "WARNING" not in r.stderr, r.stderr
    d = json.loads(r.stdout)
    assert d["converged_upto"] == 25 and d["converged_to_limit"] is True and d["boundary"] == "tail"
    assert len(d["policy"]) <= 4 * 32 + 2 and d["policy"][25] == 18 and set(d["policy"][25:]) == {18}


ONSET = [(svc, rho, B) for svc in ("det", "exp", "erlang:4", "hyperexp", "gamma:0.5") for rho in (0.5, 0.9)
         for B in (32, 64)]


@pytest.mark.parametrize("svc, rho, B", ONSET, ids=[f"{s}-rho{r}-B{b}" for s, r, b in ONSET])
def test_the_limit_run_starts_where_the_quadratic_bias_says(svc, rho, B):
    p = BatchingProblem.from_rho(rho, latency=AFF, energy=LIN, batch_sizes=range(1, B + 1), service=svc)
    sol = solve(p)
    R = sol.converged_upto
    assert R is not None and sol.decide(R) == B
    n_star = limit_onset(p, B, sol.evaluation.avg_cost)
    assert R - max(math.floor(n_star) + 1, B) in (0, 1)  # the geometric terms of the bias, at the crossing
    assert limit_onset(p, B, 0.0) <= R  # the bound check_reach uses before any solve


def test_a_bias_onset_matches_a_long_truncation_with_geometric_rows():
    """Exponential service, Bmax 32, ρ = 0.9: the dense solve on 1 500 states changes its action last at the
    converged table's R = ⌊n*⌋ + 1, with its own g."""
    p = BatchingProblem.from_rho(0.9, latency=AFF, energy=LIN, service="exp")
    ref, g = dense_pi(p, "exp", 1500)
    last = int(np.nonzero(ref[:750] != 32)[0].max()) + 1
    assert last == solve(p).converged_upto == 112
    assert last - (math.floor(limit_onset(p, 32, g)) + 1) in (0, 1)


@pytest.mark.slow
def test_the_onset_grows_like_the_square_of_bmax_exponential_service():
    """Bmax 128 (ρ = 0.9, exponential): a tail-boundary truncation of 8 192 states (4× the onset) serves 128
    from n = 2 017 on, the onset of its ĝ (checked with the general policy iteration in
    tests/test_exponential_rule.py); Bmax 1 024 has n*(0) ≈ 1.5·10⁵."""
    big = BatchingProblem.from_rho(0.9, latency=AFF, energy=LIN, batch_sizes=range(1, 1025), service="exp")
    assert 1.4e5 < limit_onset(big, 1024, 0.0) < 1.6e5


# exponential batch times go to the exponential rule instead (tests/test_exponential_rule.py)
NEIGHBOURS = [(svc, B, rho) for svc in ("hyperexp", "gamma:0.5") for B in (512, 1024, 2048)
              for rho in (0.5, 0.7, 0.9, 0.95)]


@pytest.mark.parametrize("svc, B, rho", NEIGHBOURS, ids=[f"{s}-B{b}-rho{r}" for s, b, r in NEIGHBOURS])
def test_large_bmax_with_exponential_tails_is_refused_before_any_work(svc, B, rho):
    p = BatchingProblem.from_rho(rho, latency=AFF, energy=LIN, batch_sizes=range(1, B + 1), service=svc)
    calls = []
    with pytest.raises(InputError, match="no verified table is within reach.*quadratic bias of eq. 20.*probable range"):
        solve(p, progress=lambda *a: calls.append(a))
    assert calls == []  # no truncation was solved


def test_the_refusal_names_the_onset_and_a_size_that_solves():
    p = BatchingProblem.from_rho(0.9, latency=AFF, energy=LIN, batch_sizes=range(1, 1025), service="exp")
    with pytest.raises(InputError) as e:
        check_reach(p, SMAX_LIMIT)
    msg = str(e.value)
    assert "Bmax = 1024" in msg and "ρ = 0.9" in msg and "n ≈ 146648" in msg, msg
    b = int(msg.split("e.g. Bmax = ")[1].split()[0])
    sol = solve(p.replace(batch_sizes=range(1, b + 1)))  # the suggestion, at the same λ, converges
    assert sol.converged_to_limit is True


def test_deterministic_large_bmax_keeps_its_probable_range_table():
    for B, rho in ((1024, 0.9), (4096, 0.9), (2048, 0.95)):
        p = BatchingProblem.from_rho(rho, latency=AFF, energy=LIN, batch_sizes=range(1, B + 1))
        r = reach(p, SMAX_LIMIT)
        assert not r.converged_ok and r.probable_ok and r.floor < r.fit / 2
