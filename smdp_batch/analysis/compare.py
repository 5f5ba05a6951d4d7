"""Best-tuned baselines at a latency SLO: each server rule's knob searched by simulation, beside the SMDP table.

The question a user asks before switching: "at my SLO, how much power does the best setting of my
server's batching rule draw, and how much does the optimal table draw?"  For each rule the timeout knob
is searched over a grid (0 and log-spaced multiples of l(Bmax), max batch = Bmax), then refined by
bisection between the largest grid delay that meets the SLO and the next one (more delay: larger
batches, less power, more latency); the SMDP side sweeps w2.  Every candidate is simulated with the same arrivals (same seed); a candidate meets the SLO when
its simulated metric (mean, p95 or p99 latency) is at most the bound.  The best is the one with the least
simulated power among those that meet it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..baselines.servers import ray_serve, tf_serving, torchserve, triton
from ..errors import InputError
from ..model.problem import BatchingProblem
from .simulate import simulate
from ..solvers import solve

__all__ = ["Candidate", "best_at_slo", "METRICS", "MAKERS", "timeout_delays"]

METRICS = {"mean": "mean_latency_ms", "p95": "p95_ms", "p99": "p99_ms", "p90": "p90_ms", "p50": "p50_ms"}


@dataclass(frozen=True)
class Candidate:
    """One simulated setting: the family, its settings, and its simulated metrics."""

    family: str
    setting: str
    latency_ms: float  # the SLO metric
    mean_latency_ms: float
    mean_power_w: float
    meets_slo: bool


#: family → (max batch, delay in ms) → ServerRule
MAKERS = {
    "triton": lambda b, d: triton(b, d * 1000.0),
    "tfserving": lambda b, d: tf_serving(b, d * 1000.0),
    "ray": lambda b, d: ray_serve(b, d / 1000.0),
    "torchserve": lambda b, d: torchserve(b, d),
}


def timeout_delays(problem: BatchingProblem, points: int = 12) -> list[float]:
    """The timeout knob's search grid (ms): 0 and ``points`` − 1 log-spaced multiples of l(Bmax) in [0.05, 4]."""
    lmax = float(problem.latency_ms()[-1])
    return [0.0] + [float(x) for x in np.geomspace(0.05, 4.0, int(points) - 1) * lmax]


def best_at_slo(
    problem: BatchingProblem,
    slo_ms: float,
    metric: str = "p95",
    requests: int = 200_000,
    seed: int = 0,
    points: int = 12,
    refine: int = 6,
    w2_grid=(0.0, 0.25, 0.5, 1.0, 1.3, 1.6, 2.0, 2.2, 3.0, 4.0, 6.0, 8.0),
) -> tuple[dict[str, Candidate | None], list[Candidate]]:
    """Per family (smdp, triton, tfserving, ray, torchserve) the least-power candidate meeting the SLO.

    Returns (best per family — None if no candidate meets the SLO —, every candidate simulated).
    """
    if metric not in METRICS:
        raise InputError(f"SLO metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if not (np.isfinite(slo_ms) and slo_ms > 0):
        raise InputError(f"the SLO bound must be a positive number of ms, got {slo_ms!r}")
    key = METRICS[metric]
    every: list[Candidate] = []

    def run(family: str, setting: str, rule) -> None:
        try:
            res = simulate(problem, rule, requests=requests, seed=seed)
        except InputError as e:  # cannot carry the load (e.g. Ray Serve with a short timeout): never meets the SLO
            if not str(e).startswith(("unstable", rule.spec)):
                raise
            every.append(Candidate(family, setting, float("inf"), float("inf"), float("inf"), False))
            return
        d = res.as_dict()
        every.append(Candidate(family, setting, float(d[key]), res.mean_latency_ms, res.mean_power_w, d[key] <= slo_ms))

    seen = set()
    for w2 in w2_grid:
        sol = solve(problem.replace(w2=float(w2)))
        sig = tuple(sol.policy[: sol.s_max + 1])
        if sig in seen:  # policies change in steps as w2 grows; simulate each policy once
            continue
        seen.add(sig)
        run("smdp", f"w2={w2:g}", sol)
    delays = timeout_delays(problem, points)
    for family, make in MAKERS.items():
        ok = []
        for d in delays:
            run(family, make(problem.bmax, d).spec, make(problem.bmax, d))
            ok.append(every[-1].meets_slo)
        good = [i for i, m in enumerate(ok) if m]
        if good and good[-1] + 1 < len(delays):  # bisect towards the SLO boundary
            lo, hi = delays[good[-1]], delays[good[-1] + 1]
            for _ in range(refine):
                mid = 0.5 * (lo + hi)
                run(family, make(problem.bmax, mid).spec, make(problem.bmax, mid))
                lo, hi = (mid, hi) if every[-1].meets_slo else (lo, mid)
    best: dict[str, Candidate | None] = {}
    for family in ("smdp", "triton", "tfserving", "ray", "torchserve"):
        ok = [c for c in every if c.family == family and c.meets_slo]
        best[family] = min(ok, key=lambda c: c.mean_power_w) if ok else None
    return best, every
