"""Exponential service against an independent policy iteration built on the geometric arrival count.

Under exponential service of mean l(b), the number K_b of Poisson(λ) arrivals during a batch is geometric:
P(K_b = k) = p·qᵏ with p = 1/(1 + λl(b)), q = 1 − p.  The oracle below uses only that closed form:

* E h(min(n − b + K, S)) is the backward recursion T(m) = p·h(m) + q·T(m + 1), T(S) = h(S);
* the tail boundary's excursion above S after serving b from n (m = n − b) has
  E e⁺ = q^{S−m+1}/(1 − q) and E (e⁺)² = q^{S−m+1}(1 + q)/(1 − q)², so its time, energy and holding
  (paper 004 eq. 20's quadratic bias, as the module docstring of ``smdp_batch.model.truncation`` writes
  them) are closed forms too;
* evaluation is a dense solve of eq. 20 with h(0) = 0; improvement keeps the current action unless
  another is better.

The shipped solver builds its arrival tables from the law's transform, sums them with the excursion
recursions, and evaluates by banded LU; none of that is used here.  The two agree on the gain to 1e-10 and on
every decision.
"""

import numpy as np
import pytest
from scipy.signal import lfilter

from smdp_batch import BatchingProblem, solve


def _model(p: BatchingProblem, S: int) -> dict:
    lam, w1, w2 = p.lam, p.w1, p.w2
    sizes = np.asarray(p.batch_sizes, dtype=np.int64)
    l, z = p.latency_ms(), p.energy_mj()
    eg2 = 2.0 * l * l  # E G² of an exponential time
    y = np.concatenate([[1.0 / lam], l])  # action 0 waits one mean gap
    fixed = np.concatenate([[0.0], w2 * z + w1 * eg2 / 2.0])
    slope = np.concatenate([[w1 / lam ** 2], w1 * l / lam])
    q = np.concatenate([[0.0], lam * l / (1.0 + lam * l)])
    B, lB = int(sizes[-1]), l[-1]
    d = B - lam * lB
    M2 = lam * lB + lam ** 2 * (eg2[-1] - lB ** 2) + d * d  # E (K_B − B)² = Var K_B + d²
    tail = (lB / d, w2 * z[-1] / d + w1 * (0.5 * eg2[-1] / d + lB * M2 / (2.0 * lam * d * d)), w1 * lB / (2.0 * lam * d))
    return dict(S=S, sizes=sizes, y=y, fixed=fixed, slope=slope, q=q, tail=tail)


def _excursion(M: dict, a: int) -> tuple[np.ndarray, np.ndarray]:
    """For serving action a from each state n = b..S: the excursion's expected time and cost above S."""
    S, b, q = M["S"], int(M["sizes"][a - 1]), M["q"][a]
    m = np.arange(b, S + 1) - b
    r = q ** (S - m + 1)
    e1 = r / (1.0 - q)
    e2 = r * (1.0 + q) / (1.0 - q) ** 2 + 2.0 * S * e1
    t_time, t_lin, t_sq = M["tail"]
    return t_time * e1, t_lin * e1 + t_sq * e2


def _weights(M: dict, a: int, rows: np.ndarray) -> np.ndarray:
    """The geometric law of the next state (0..S) after serving action a from each state in ``rows``."""
    S, b, q = M["S"], int(M["sizes"][a - 1]), M["q"][a]
    m = rows - b
    k = np.arange(S + 1)[None, :] - m[:, None]
    W = np.where(k >= 0, (1.0 - q) * q ** np.maximum(k, 0), 0.0)
    W[:, S] = q ** (S - m)  # every count that reaches S or beyond lands on S (the tail boundary)
    return W


def _feasible(M: dict) -> np.ndarray:
    """(S+1, A): waiting, or a size b ≤ n; at the top only B (the tail boundary)."""
    S, sizes = M["S"], M["sizes"]
    ok = np.concatenate([np.ones((S + 1, 1), bool), sizes[None, :] <= np.arange(S + 1)[:, None]], axis=1)
    ok[S] = False
    ok[S, -1] = True
    return ok


def _evaluate(M: dict, pol: np.ndarray) -> tuple[float, np.ndarray]:
    """(g, h) of eq. 20 with h(0) = 0: one dense solve, the column of h(0) given to g."""
    S = M["S"]
    A = np.eye(S + 1)
    c = M["fixed"][pol] + M["slope"][pol] * np.arange(S + 1)
    ysoj = M["y"][pol].astype(float)
    for a in np.unique(pol):
        rows = np.nonzero(pol == a)[0]
        if a == 0:
            A[rows, rows + 1] -= 1.0
            continue
        b = int(M["sizes"][a - 1])
        te, ce = _excursion(M, a)
        A[rows] -= _weights(M, a, rows)
        ysoj[rows] += te[rows - b]
        c[rows] += ce[rows - b]
    A[:, 0] = ysoj  # h(0) = 0: its column carries g
    x = np.linalg.solve(A, c)
    h = x.copy()
    h[0] = 0.0
    return float(x[0]), h


def _improve(M: dict, pol: np.ndarray, g: float, h: np.ndarray) -> np.ndarray:
    S = M["S"]
    n = np.arange(S + 1)
    Q = np.full((S + 1, len(M["sizes"]) + 1), np.inf)
    Q[:S, 0] = M["fixed"][0] + M["slope"][0] * n[:S] - g * M["y"][0] + h[1:]
    for a in range(1, len(M["sizes"]) + 1):
        b = int(M["sizes"][a - 1])
        if b > S:
            break
        q = M["q"][a]
        # T(m) = p·h(m) + q·T(m+1), T(S) = h(S): a first-order filter run from the top down
        T = lfilter([1.0 - q], [1.0, -q], h[::-1][1:], zi=[q * h[S]])[0][::-1]
        T = np.append(T, h[S])
        te, ce = _excursion(M, a)
        states = n[b:]
        Q[b:, a] = M["fixed"][a] + M["slope"][a] * states + ce - g * (M["y"][a] + te) + T[states - b]
    Q[~_feasible(M)] = np.inf
    best = Q.argmin(axis=1)
    cur = Q[n, pol]
    keep = cur <= Q[n, best] + 1e-9 * np.maximum(1.0, np.abs(Q[n, best]))
    return np.where(keep, pol, best)


def _oracle(p: BatchingProblem, S: int) -> tuple[float, np.ndarray]:
    M = _model(p, S)
    sizes = M["sizes"]
    pol = np.array([np.searchsorted(sizes, s, side="right") for s in range(S + 1)])  # greedy
    pol[S] = len(sizes)
    for _ in range(100):
        g, h = _evaluate(M, pol)
        new = _improve(M, pol, g, h)
        if np.array_equal(new, pol):
            return g, pol
        pol = new
    raise AssertionError("the oracle's policy iteration did not settle in 100 iterations")


@pytest.mark.parametrize("rho, bmax", [(0.9, 32), (0.5, 32), (0.9, 16), (0.8, 48)])
def test_exponential_service_tables_match_a_geometric_policy_iteration(rho, bmax):
    p = BatchingProblem.basic(rho=rho, batch_sizes=tuple(range(1, bmax + 1)), service="exp")
    sol = solve(p)
    assert sol.model.tail_action == bmax  # the tail boundary serves Bmax above s_max (checked, not assumed)
    S = sol.s_max
    g, pol = _oracle(p, S)
    assert g == pytest.approx(sol.result.gain, rel=1e-10)
    shipped = np.asarray(sol.result.policy)[: S + 1]
    assert np.array_equal(pol, shipped), np.nonzero(pol != shipped)[0][:10]
