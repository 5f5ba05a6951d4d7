"""Exact stationary evaluation of any stationary policy of the truncated SMDP (paper 004 eqs. 21–22).

With μ the stationary law of the embedded chain m̂(·|s, π(s)) (eq. 18):

* ĝ = Σ μ_s ĉ(s, π(s)) / Σ μ_s y(s, π(s))                      (eq. 21, includes c_o on S_o)
* Δ = μ_{S_o} ĉ(S_o, π(S_o)) / Σ μ_s y(s, π(s))                 (eq. 22)
* W̄ (ms): the holding part of ĉ with w1 = 1, w2 = 0 (eq. 11 via Little's law, S_o counted as
  s_max), P̄ (W = mJ/ms) = Σ μ ζ(π) / Σ μ y, throughput (requests/ms) = Σ μ π / Σ μ y,
  mean batch size = Σ μ π / Σ_{π>0} μ.

These are semi-Markov ratio formulas (renewal-reward), exact for the truncated model; as s_max
grows with Δ → 0 they converge to the infinite model's values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import InputError
from .banded import stationary
from ..model.problem import BatchingProblem
from ..runtime.table import control_limit
from ..model.truncation import TruncatedSMDP, arrival_table, truncate

__all__ = [
    "Evaluation", "control_limit_of", "evaluate_deployed", "evaluate_policy", "extend_policy",
    "evaluate_indices", "resize_policy", "stationary_distribution", "tail_stable",
]


@dataclass(frozen=True)
class Evaluation:
    """Exact long-run metrics of one stationary policy on a truncated model."""

    avg_cost: float  # ĝ, cost per ms (eq. 21)
    delta: float  # Δ, cost per ms contributed by S_o (eq. 22)
    mean_latency_ms: float  # W̄
    mean_power_w: float  # P̄
    throughput: float  # requests per ms
    mean_batch_size: float
    overflow_probability: float  # μ(S_o) at decision epochs
    stationary: np.ndarray  # μ over decision epochs, length s_max+2
    s_max: int  # truncation the metrics were computed on

    def as_dict(self) -> dict:
        return {
            "avg_cost": self.avg_cost,
            "delta": self.delta,
            "mean_latency_ms": self.mean_latency_ms,
            "mean_power_w": self.mean_power_w,
            "throughput": self.throughput,
            "throughput_per_s": self.throughput * 1e3,
            "mean_batch_size": self.mean_batch_size,
            "overflow_probability": self.overflow_probability,
        }


def stationary_distribution(model: TruncatedSMDP, pol_idx: np.ndarray) -> np.ndarray:
    """Stationary law of the embedded chain under a policy (action indices); unichain required."""
    return stationary(model, pol_idx)


def evaluate_policy(model: TruncatedSMDP, policy: np.ndarray) -> Evaluation:
    """Exact metrics (eqs. 21–22) of ``policy`` (batch size per state, length s_max+2).

    With the tail boundary (:mod:`~smdp_batch.model.truncation`) the excursions above s_max enter through
    their expected time, energy, holding and batches; Δ is then the cost per ms those excursions carry (what
    eq. 22 measures for S_o) and ``overflow_probability`` the chance that an epoch leaves the truncation."""
    return evaluate_indices(model, model.action_index(policy))


def evaluate_indices(model: TruncatedSMDP, idx: np.ndarray, factors: tuple | None = None) -> Evaluation:
    """:func:`evaluate_policy` of a policy given as feasible action indices (:meth:`~.TruncatedSMDP.action_index`),
    as a solver returns it; ``factors``: its band factors from the solver (:func:`.banded.stationary`)."""
    mu = stationary(model, idx, factors)
    S = model.n_states
    rows = np.arange(S)
    y = model.sojourn_of(idx)
    a = model.actions[idx].astype(np.float64)
    c = model.costs_of(idx)
    time_per_epoch = float(mu @ y)
    serving = float(mu[a > 0].sum())
    served = float(mu @ a)
    if model.extra is None:
        delta = float(mu[-1] * c[-1]) / time_per_epoch
    else:  # the excursions' batches: their time over l(B); each serves B
        delta = float(mu @ model.excursion_costs()[rows, idx]) / time_per_epoch
        l_B = float(model.y[int(np.nonzero(model.actions == model.tail_action)[0][0])])
        batches = float(mu @ model.extra[0][rows, idx]) / l_B
        serving += batches
        served += batches * model.tail_action
    return Evaluation(
        avg_cost=float(mu @ c) / time_per_epoch,
        delta=delta,
        mean_latency_ms=float(mu @ model.hold_of(idx)) / time_per_epoch,
        mean_power_w=float(mu @ model.energies_of(idx)) / time_per_epoch,
        throughput=served / time_per_epoch,
        mean_batch_size=served / serving if serving > 0 else 0.0,
        overflow_probability=float(mu[-1]),
        stationary=mu,
        s_max=model.s_max,
    )


def control_limit_of(policy: np.ndarray, batch_sizes) -> int | None:
    """Q if ``policy`` (states 0..s_max, then S_o) is a control-limit policy (paper 004 Def. 3), else None.

    The S_o entry only reflects the abstract cost and is not part of the deployed rule (eq. 30).
    """
    return control_limit(np.asarray(policy)[:-1], batch_sizes)


def resize_policy(policy: np.ndarray, s_max: int) -> np.ndarray:
    """Carry a policy to another s_max (a warm start): grow by eq. 30, or cut with S_o ← π(s_max).

    ``policy`` is indexed by queue length on its first axis: a table (s_max+2,) or a phase table (s_max+2, m)."""
    policy = np.asarray(policy, dtype=np.int64)
    if s_max >= policy.shape[0] - 2:
        return extend_policy(policy, s_max)
    return np.concatenate([policy[: s_max + 1], policy[s_max : s_max + 1]])


def extend_policy(policy: np.ndarray, s_max: int) -> np.ndarray:
    """The policy of eq. 30 on a truncation with a larger (or equal) s_max.

    States beyond the original s_max — and the new overflow state — take the action of the
    original s_max (never the original S_o action, which reflects the abstract cost c_o only).
    A phase table (s_max+2, m) is extended the same way, phase by phase.
    """
    policy = np.asarray(policy, dtype=np.int64)
    old = policy.shape[0] - 2
    if s_max < old:
        raise InputError(f"cannot shrink a policy from s_max={old} to {s_max}")
    out = np.empty((s_max + 2,) + policy.shape[1:], dtype=np.int64)
    out[: old + 1] = policy[: old + 1]
    out[old + 1 :] = policy[old]
    return out


def tail_stable(problem: BatchingProblem, policy: np.ndarray) -> bool:
    """Whether eq. 30's tail action a = π(s_max) drains long queues: a > 0 and λ·l(a) < a (for a phase
    table, in every phase; λ is then the MAP's mean rate)."""
    tail = np.atleast_1d(np.asarray(policy)[len(policy) - 2])
    return all(int(a) > 0 and problem.lam * float(problem.latency(np.float64(a))) < int(a) for a in tail)


#: Largest truncation :func:`evaluate_deployed` will build.
DEPLOYED_SMAX_LIMIT = 1 << 14


def evaluate_deployed(problem: BatchingProblem, policy: np.ndarray, tol: float = 1e-10,
                      boundary: str = "tail", max_smax: int = DEPLOYED_SMAX_LIMIT) -> Evaluation:
    """Metrics of ``policy`` as deployed on the infinite queue (eq. 30), to truncation error < tol.

    The policy (length s_max+2) is extended by eq. 30 (its tail action a = π(s_max) beyond) and evaluated
    on truncations of doubling size:

    * ``boundary="tail"`` (default): the tail boundary with B = a (:mod:`~smdp_batch.model.truncation`),
      whose metrics are the infinite queue's up to terms that die out geometrically past the policy's
      last change; accepted when ĝ, W̄ and P̄ of s and 2s agree to ``tol`` (relative, floor 1);
      Δ is then |ĝ(2s) − ĝ(s)|.
    * ``boundary="overflow"``: eq. 19 with c_o = 0, until S_o's share of the cost (Δ, eq. 22) and its
      probability both fall below ``tol`` (relative to the average cost) — an independent check, but the
      truncation must cover the queue tail (s_max up to 16 384).

    ``max_smax``: the largest truncation to build (≤ 16 384); beyond it the evaluation is refused.

    A policy whose tail action cannot keep up with λ (λ·l(a) ≥ a, or a = 0) does not stabilise the
    queue and is rejected.
    """
    if boundary not in ("tail", "overflow"):
        raise InputError(f"unknown boundary {boundary!r}; valid: tail, overflow")
    problem.single()
    policy = np.asarray(policy, dtype=np.int64)
    base = policy.size - 2
    if not tail_stable(problem, policy):
        a_tail = int(policy[base])
        if a_tail == 0:
            raise InputError(f"the policy waits at its last state s_max={base}: it never serves long queues (unstable)")
        l_tail = float(problem.latency(np.float64(a_tail)))
        raise InputError(
            f"the policy serves batches of {a_tail} on long queues, at most {a_tail / l_tail:.6g} requests/ms, "
            f"but λ = {problem.lam:.6g} /ms: it does not stabilise the queue"
        )
    tail = int(policy[base]) if boundary == "tail" else None
    if tail is not None:  # eq. 30 lets the table stop where its last run of equal actions starts
        change = np.nonzero(policy[1 : base + 1] != policy[:base])[0]
        base = int(change[-1]) + 1 if change.size else 0
        policy = np.append(policy[: base + 1], tail)
    s = max(base, problem.bmax if tail is None else tail, 64)  # the tail boundary needs only s ≥ B
    arrivals = arrival_table(problem, 2 * s)
    prev = None
    while True:
        if arrivals.kmax < s:
            arrivals = arrival_table(problem, 2 * s)
        model = truncate(problem, s, 0.0, arrivals, tail=tail)
        ev = evaluate_policy(model, extend_policy(policy, s))
        if tail is None:
            if ev.delta < tol * max(1.0, ev.avg_cost) and ev.overflow_probability < tol:
                return ev
        elif prev is not None and all(abs(getattr(ev, k) - getattr(prev, k)) <= tol * max(1.0, abs(getattr(ev, k)))
                                      for k in ("avg_cost", "mean_latency_ms", "mean_power_w")):
            return replace(ev, delta=abs(ev.avg_cost - prev.avg_cost))
        if 2 * s > min(max_smax, DEPLOYED_SMAX_LIMIT) and (tail is None or prev is not None):  # the tail check needs one doubling
            # prev is set whenever tail is given (the condition above)
            what = f"Δ = {ev.delta:.3g}" if tail is None else f"ĝ moved {abs(ev.avg_cost - prev.avg_cost):.3g} at the last doubling"  # type: ignore[union-attr]
            raise InputError(
                f"the policy's queue-length tail is too heavy to evaluate with s_max ≤ {min(max_smax, DEPLOYED_SMAX_LIMIT)} "
                f"({what}); is ρ = {problem.rho:.6g} too close to 1?"
            )
        prev = ev
        s *= 2
