"""The rules people run today as points of the latency–power plane (paper 004 §VII-B, Figs. 5 and 6(a)).

* :func:`baseline_points` — greedy and static-b tables evaluated exactly (eq. 30 extension), and the
  timeout rules of Triton, TF-Serving, Ray Serve and TorchServe simulated over their delay knob (max
  batch Bmax; the same arrivals for every setting), each a :class:`BaselinePoint`;
* :func:`latency_cdfs` — the empirical response-time CDF of each of several rules on the same arrivals;
* ``_simulate_job`` — one rule simulated, reduced to what a mapper ships back; the SMDP front
  (:mod:`~smdp_batch.analysis.pareto`) simulates its own points with it too.

Whether a baseline is dominated by the SMDP front is the front's question
(:func:`~smdp_batch.analysis.pareto.dominated_by_front`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..model.problem import BatchingProblem
from .parallel import Mapper, local_map

__all__ = ["BaselinePoint", "baseline_points", "default_statics", "latency_cdfs"]


@dataclass
class BaselinePoint:
    """A baseline rule's (W̄, P̄): exact for tables (greedy, static b), simulated for timeout rules."""

    family: str  # greedy | static | triton | tfserving | ray | torchserve
    setting: str  # the rule's spec
    mean_latency_ms: float
    mean_power_w: float
    throughput: float
    exact: bool
    latency_ci: float = 0.0  # 95 % half-widths (0 when exact)
    power_ci: float = 0.0
    percentiles: dict = field(default_factory=dict)
    within: dict = field(default_factory=dict)

    @property
    def efficiency(self) -> float:
        """Requests per joule, as :attr:`~smdp_batch.analysis.pareto.FrontPoint.efficiency`."""
        return 1e3 * self.throughput / self.mean_power_w

    def as_dict(self) -> dict:
        return {"family": self.family, "setting": self.setting, "mean_latency_ms": self.mean_latency_ms,
                "mean_power_w": self.mean_power_w, "efficiency_req_per_j": self.efficiency, "exact": self.exact,
                "mean_latency_ci_ms": self.latency_ci, "mean_power_ci_w": self.power_ci, **self.percentiles,
                **{f"within_{b:g}ms": v for b, v in self.within.items()}}


def _simulate_job(problem: BatchingProblem, rule, requests: int, seed: int, within_ms: tuple) -> dict:
    from .simulate import simulate

    rule = np.asarray(rule, dtype=np.int64) if isinstance(rule, list) else rule
    try:
        res = simulate(problem, rule, requests=requests, seed=seed, within_ms=within_ms)
    except InputError as e:  # a timeout rule that cannot carry this load (Ray Serve with a short timeout)
        return {"error": str(e)}
    return {"mean_latency_ms": res.mean_latency_ms, "mean_latency_ci": res.mean_latency_ci,
            "mean_power_w": res.mean_power_w, "mean_power_ci": res.mean_power_ci, "throughput": res.throughput,
            "percentiles": {k: res.percentiles[k] for k in ("p50_ms", "p95_ms", "p99_ms")}, "within": res.within}


# -------------------------------------------------------------------------------------- baselines
def default_statics(batch_sizes) -> list[int]:
    """Static batch sizes shown by default: allowed powers of two from 2, and Bmax (maximum batching)."""
    sizes = list(batch_sizes)
    out = [b for b in sizes if b >= 2 and b & (b - 1) == 0]
    return sorted(set(out) | {sizes[-1]})


def baseline_points(problem: BatchingProblem, statics=None, timeouts: bool = True, requests: int = 200_000,
                    seed: int = 0, delays: int = 12, simulate_tables: bool = False, within_ms=(),
                    mapper: Mapper | None = None) -> tuple[list[BaselinePoint], list[tuple[str, str]]]:
    """Greedy, static b (exact) and timeout rules over their delay grid (simulated, same arrivals).

    Returns (points, skipped) where ``skipped`` lists (setting, reason) for rules that cannot serve
    this load (e.g. static b whose batch rate is below λ).  ``simulate_tables`` adds simulated
    percentiles to the exact points too (for percentile plots).
    """
    from ..baselines import parse_policy
    from .compare import MAKERS, timeout_delays
    from ..solvers.evaluation import evaluate_deployed

    mapper = mapper or local_map
    statics = default_statics(problem.batch_sizes) if statics is None else list(statics)
    points: list[BaselinePoint] = []
    skipped: list[tuple[str, str]] = []
    tables = []
    for spec in ["greedy"] + [f"static:{b}" for b in statics]:
        try:
            pol = parse_policy(spec, problem.batch_sizes, problem.bmax)
            ev = evaluate_deployed(problem, pol)
        except InputError as e:
            skipped.append((spec, str(e)))
            continue
        points.append(BaselinePoint(spec.split(":")[0], spec, ev.mean_latency_ms, ev.mean_power_w, ev.throughput, True))
        tables.append(pol)
    within = tuple(float(b) for b in within_ms)
    if simulate_tables and points:
        sims = mapper(_simulate_job, [problem] * len(tables), [t.tolist() for t in tables], [int(requests)] * len(tables),
                      [int(seed)] * len(tables), [within] * len(tables))
        kept = []
        for p, s in zip(points, sims):  # a table the short run cannot settle is skipped, like a timeout rule
            if "error" in s:
                skipped.append((p.setting, s["error"]))
                continue
            p.percentiles, p.within = s["percentiles"], s["within"]
            kept.append(p)
        points = kept
    if timeouts:
        rules = [make(problem.bmax, d) for make in MAKERS.values() for d in timeout_delays(problem, delays)]
        sims = mapper(_simulate_job, [problem] * len(rules), rules, [int(requests)] * len(rules),
                      [int(seed)] * len(rules), [within] * len(rules))
        for rule, s in zip(rules, sims):
            if "error" in s:
                skipped.append((rule.spec, s["error"]))
                continue
            points.append(BaselinePoint(rule.spec.split(":")[0], rule.spec, s["mean_latency_ms"], s["mean_power_w"],
                                        s["throughput"], False, s["mean_latency_ci"], s["mean_power_ci"],
                                        s["percentiles"], s["within"]))
    return points, skipped


def latency_cdfs(problem: BatchingProblem, rules: dict, requests: int = 200_000, seed: int = 0,
                 quantiles: int = 400) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Empirical CDFs of request latency (Fig. 6(a)): label → (latency ms, probability) at ``quantiles``
    levels, every rule on the same Poisson arrivals (the first 5 % left out as warm-up)."""
    from .simulate import poisson_arrivals, response_times

    arr = poisson_arrivals(problem.lam, int(requests), np.random.default_rng(seed))
    probs = np.linspace(0.0, 1.0, int(quantiles) + 1)[1:-1]
    out = {}
    for label, rule in rules.items():
        r = response_times(problem, rule, arr, seed=seed)[int(0.05 * arr.size):]
        r = r[np.isfinite(r)]
        out[label] = (np.quantile(r, probs), probs)
    return out
