"""Latency–power trade-off curves, baselines on them, and SLO-driven choice of w2 (paper 004 §VII-B, Figs. 4–6).

Sweeping w2 (w1 = 1) traces the SMDP front of (W̄, P̄) pairs.  Policies change in steps as w2 grows:
many weights give the same deployed policy.  Two weights give *the same policy in service* when the
exact W̄ and P̄ of their tables (eq. 30 extension) agree to 1e-6 relative.  Their tables may still
differ at queue lengths so rare (probability ~1e-10) that no metric can tell them apart.

**Sweep.** A log grid of w2 (plus w2 = 0), then rounds of geometric bisection of every interval whose
two ends give different policies, until the ends are within ``rtol`` of each other; so each policy's
range of w2 is known to that relative precision.  Each round's solves are independent and go to a
*mapper* (:mod:`smdp_batch.parallel`: this process or Dask); the rounds do not depend on the mapper, so
neither does the result.  Several scenarios and loads share the rounds.

**SLO choice** (§VII-B1 and B3): among the swept policies that meet the SLO — mean latency (exact), a
simulated p95/p99, or a simulated satisfaction share P(W ≤ bound) ≥ target (Fig. 6(c)) — the one with
the least power; its whole w2 range is reported.

**Baselines** (Fig. 5): greedy and static-b tables evaluated exactly (eq. 30 extension), and the timeout
rules of Triton, TF-Serving, Ray Serve and TorchServe simulated over their delay knob (max batch
Bmax; the same arrivals for every setting).

**Dominance test.** The front's power at latency W is F(W): linear interpolation between consecutive
SMDP points by latency (time-sharing between two policies achieves it), F(W) = P̄ of the slowest swept
point for W beyond it (that point is faster and uses no more power), and F(W) = +∞ left of the w2 = 0
point (the least mean latency of any policy).  A baseline point (W_b ± h_W, P_b ± h_P; h = 95 %
half-widths, 0 for exact points) is *dominated* when F(W_b + h_W) ≤ P_b + h_P: no baseline may be
better than the front by more than its own statistical uncertainty.  ``margin_w`` = P_b − F(W_b) is
reported as well (positive: the front uses less power at the baseline's latency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..model.problem import BatchingProblem
from .parallel import Mapper, local_map
from ..solvers import solve

__all__ = ["FrontPoint", "Front", "BaselinePoint", "sweep_w2", "sweep_fronts", "baseline_points",
           "dominated_by_front", "latency_cdfs"]


@dataclass
class FrontPoint:
    """One distinct deployed policy of the sweep, with the range of w2 that gives it."""

    w2_lo: float
    w2_hi: float
    mean_latency_ms: float
    mean_power_w: float
    throughput: float  # requests/ms
    policy: list[int]  # actions for queue lengths 0..s_max (eq. 30 beyond)
    control_limit: int | None
    signature: tuple = field(repr=False, default=())
    percentiles: dict = field(default_factory=dict)  # simulated "p95_ms", "p99_ms", when asked
    within: dict = field(default_factory=dict)  # simulated bound (ms) → share P(W ≤ bound)

    @property
    def efficiency(self) -> float:
        """Requests per joule: λ / P̄ (paper 004 Fig. 5(c); λ in 1/ms, P̄ in W = mJ/ms, hence × 1000)."""
        return 1e3 * self.throughput / self.mean_power_w

    def as_dict(self) -> dict:
        return {"w2_lo": self.w2_lo, "w2_hi": self.w2_hi, "mean_latency_ms": self.mean_latency_ms,
                "mean_power_w": self.mean_power_w, "efficiency_req_per_j": self.efficiency,
                "control_limit": self.control_limit, "policy": self.policy, **self.percentiles,
                **{f"within_{b:g}ms": v for b, v in self.within.items()}}


@dataclass
class Front:
    """The swept SMDP policies of one problem, by increasing w2 (decreasing power)."""

    problem: BatchingProblem
    points: list[FrontPoint]
    label: str = ""

    def choose(self, slo_mean_ms: float | None = None, slo_p95_ms: float | None = None,
               slo_p99_ms: float | None = None, slo_within: tuple[float, float] | None = None) -> FrontPoint | None:
        """The least-power point meeting the SLO (exactly one), or None if none does.

        ``slo_within = (bound_ms, share)``: at least ``share`` (0–1) of requests within ``bound_ms``.
        """
        given = [k for k, v in (("mean", slo_mean_ms), ("p95", slo_p95_ms), ("p99", slo_p99_ms),
                                ("within", slo_within)) if v is not None]
        if len(given) != 1:
            raise InputError("give exactly one SLO: mean, p95 or p99 latency bound in ms, or a satisfaction share")
        if given[0] == "within":
            bound, share = (float(x) for x in slo_within)
            if not (0 < share <= 1):
                raise InputError(f"the satisfaction share must lie in (0, 1], got {share!r}")
        ok = []
        for p in self.points:
            if given[0] == "mean":
                meets = p.mean_latency_ms <= slo_mean_ms
            elif given[0] == "within":
                if bound not in p.within:
                    raise InputError(f"the sweep has no simulated share within {bound:g} ms; sweep with within_ms=({bound:g},)")
                meets = p.within[bound] >= share
            else:
                key = f"{given[0]}_ms"
                if key not in p.percentiles:
                    raise InputError(f"the sweep has no simulated {key}; run it with simulate_requests > 0")
                meets = p.percentiles[key] <= (slo_p95_ms if given[0] == "p95" else slo_p99_ms)
            if meets:
                ok.append(p)
        return min(ok, key=lambda p: p.mean_power_w) if ok else None

    def solution(self, point: FrontPoint):
        """The full :class:`~smdp_batch.solvers.Solution` of a swept point (solved again here,
        deterministically); the w2 = ∞ end is a static table, not a solve (see ``point.policy``)."""
        if not math.isfinite(point.w2_lo):
            raise InputError("the w2 = ∞ end of the front is the static table point.policy, not an SMDP solve")
        return solve(self.problem.replace(w2=point.w2_lo))

    def power_at(self, latency_ms: float) -> float:
        """F(W) of the module doc: the least power the front achieves at mean latency W (W)."""
        pts = sorted(self.points, key=lambda p: p.mean_latency_ms)
        w = np.array([p.mean_latency_ms for p in pts])
        pw = np.array([p.mean_power_w for p in pts])
        if latency_ms < w[0]:
            return math.inf
        if latency_ms >= w[-1]:
            return float(pw[-1])
        return float(np.interp(latency_ms, w, pw))


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
        """Requests per joule, as :attr:`FrontPoint.efficiency`."""
        return 1e3 * self.throughput / self.mean_power_w

    def as_dict(self) -> dict:
        return {"family": self.family, "setting": self.setting, "mean_latency_ms": self.mean_latency_ms,
                "mean_power_w": self.mean_power_w, "efficiency_req_per_j": self.efficiency, "exact": self.exact,
                "mean_latency_ci_ms": self.latency_ci, "mean_power_ci_w": self.power_ci, **self.percentiles,
                **{f"within_{b:g}ms": v for b, v in self.within.items()}}


# ------------------------------------------------------------------------------------------- jobs
def _solve_job(problem: BatchingProblem, w2: float, hint: dict | None = None) -> dict:
    """One solve, reduced to what the front keeps (small to ship back from a worker); a truncation
    that fails comes back as {"error": message}.  ``hint``: a neighbouring w2's truncation (its s_max,
    c_o and policy) where the converged search starts."""
    try:
        sol = solve(problem.replace(w2=float(w2)), hint=hint)
    except InputError as e:
        return {"error": str(e)}
    ev = sol.deployed
    return {"sig": (ev.mean_latency_ms, ev.mean_power_w), "throughput": ev.throughput,
            "policy": [int(a) for a in sol.policy[: sol.stored_range + 1]], "control_limit": sol.control_limit,
            "hint": {"s_max": sol.s_max, "abstract_cost": sol.model.abstract_cost,
                     "policy": [int(a) for a in sol.policy]}}


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


#: Finest w2 resolution of a sweep: the bisection costs a solve per halving, ~log2(ln(hi/lo)/rtol) per boundary.
RTOL_MIN = 1e-4


def _same(a: tuple, b: tuple, rtol: float = 1e-6) -> bool:
    """Same policy in service: W̄ and P̄ equal to ``rtol`` relative (see the module doc)."""
    return all(abs(x - y) <= rtol * max(abs(x), abs(y)) for x, y in zip(a, b))


def _check_sweep(w2_min: float, w2_max: float, points: int, rtol: float) -> None:
    if not (0 < w2_min < w2_max and math.isfinite(w2_max)):
        raise InputError(f"need 0 < w2_min < w2_max < ∞, got {w2_min!r}, {w2_max!r}")
    if int(points) < 2:
        raise InputError(f"need at least 2 grid points of w2, got {points!r}")
    if not (RTOL_MIN <= rtol < 1):  # each halving of rtol costs one more solve per policy boundary
        raise InputError(f"the w2 resolution rtol must lie in [{RTOL_MIN:g}, 1), got {rtol!r}")


def _anchor_job(problem: BatchingProblem) -> dict | None:
    """The w2 → ∞ end of the front: static b* with b* = argmin ζ(b)/b (least energy per request; the
    smallest such b), evaluated exactly; None when it cannot serve λ.  Every request then costs the least
    energy there is, so no policy draws less power; serving b* as soon as b* wait is the fastest way."""
    from ..baselines.simple import static_policy
    from ..solvers.evaluation import control_limit_of, evaluate_deployed

    sizes = np.asarray(problem.batch_sizes)
    b = int(sizes[int(np.argmin(problem.energy_mj() / sizes))])
    pol = static_policy(problem.batch_sizes, problem.bmax, b)
    try:
        ev = evaluate_deployed(problem, pol)
    except InputError:
        return None
    return {"sig": (ev.mean_latency_ms, ev.mean_power_w), "throughput": ev.throughput,
            "policy": [int(a) for a in pol[: problem.bmax + 1]], "control_limit": control_limit_of(pol, problem.batch_sizes)}


def sweep_fronts(problems: list[BatchingProblem], w2_min: float = 0.01, w2_max: float = 10.0, points: int = 25,
                 rtol: float = 0.02, simulate_requests: int = 0, within_ms=(), seed: int = 0, labels=None,
                 extend: int = 6, progress=None, mapper: Mapper | None = None) -> list[Front]:
    """Trace the SMDP front of each problem over w2 ∈ {0} ∪ [w2_min, w2_max] (see the module doc).

    ``extend``: up to this many doublings of w2 beyond ``w2_max`` until the policy is the least-power
    one (static b*, the w2 → ∞ end); if that end is not reached (or a truncation fails at large w2),
    it is added as a point with w2 = ∞, joined to the swept front by time-sharing.
    ``simulate_requests`` > 0 adds simulated p50/p95/p99 and the shares within ``within_ms`` to every
    point.  ``progress(n)`` is told of every n jobs done; ``mapper`` runs each round's jobs.
    """
    _check_sweep(w2_min, w2_max, points, rtol)
    if int(extend) < 0:
        raise InputError(f"extend must be ≥ 0 doublings, got {extend!r}")
    mapper = mapper or local_map
    grid = [0.0] + [float(x) for x in np.geomspace(w2_min, w2_max, int(points))]
    caches: list[dict[float, dict]] = [{} for _ in problems]

    def hint(i: int, w: float) -> dict | None:
        """The nearest w2 (log scale) solved in an earlier round: its truncation starts this solve."""
        done = [v for v, r in caches[i].items() if "hint" in r]
        if not done:
            return None
        near = min(done, key=lambda v: abs(math.log((v + 1e-3) / (w + 1e-3))))
        return caches[i][near]["hint"]

    def run(jobs: list[tuple[int, float]]) -> None:
        jobs = [(i, w) for i, w in dict.fromkeys(jobs) if w not in caches[i]]
        out = mapper(_solve_job, [problems[i] for i, _ in jobs], [w for _, w in jobs], [hint(i, w) for i, w in jobs])
        for (i, w), r in zip(jobs, out):
            caches[i][w] = r
        if progress is not None and jobs:
            progress(len(jobs))

    anchors = mapper(_anchor_job, list(problems))
    run([(i, w) for i in range(len(problems)) for w in grid])
    open_ends = {i: grid[-1] for i, a in enumerate(anchors) if a is not None}
    for _ in range(int(extend)):  # extend w2 until the least-power end is reached
        open_ends = {i: w for i, w in open_ends.items()
                     if "error" not in caches[i][w] and not _same(caches[i][w]["sig"], anchors[i]["sig"])}
        if not open_ends:
            break
        open_ends = {i: 2 * w for i, w in open_ends.items()}
        run(list(open_ends.items()))
    for cache in caches:  # a failed solve (a truncation at very large w2) ends that front's extension
        for w in [w for w, r in cache.items() if "error" in r]:
            del cache[w]
    intervals = [(i, lo, hi) for i in range(len(problems)) for lo, hi in zip(sorted(caches[i])[:-1], sorted(caches[i])[1:])]
    while intervals:  # one round: bisect every interval whose ends differ and are not yet within rtol
        split = []
        for i, lo, hi in intervals:
            if _same(caches[i][lo]["sig"], caches[i][hi]["sig"]):
                continue
            if (lo > 0 and hi / lo - 1 <= rtol) or (lo == 0 and hi <= w2_min * rtol):
                continue
            split.append((i, lo, hi, math.sqrt(lo * hi) if lo > 0 else hi * rtol / 2))
        run([(i, mid) for i, _, _, mid in split])
        for i, lo, hi, mid in split:
            if "error" in caches[i][mid]:
                raise InputError(f"w2 = {mid:.6g}: {caches[i][mid]['error']}")
        intervals = [x for i, lo, hi, mid in split for x in ((i, lo, mid), (i, mid, hi))]
    fronts = []
    for i, problem in enumerate(problems):
        pts: list[FrontPoint] = []
        for w2 in sorted(caches[i]):
            r = caches[i][w2]
            if pts and _same(pts[-1].signature, r["sig"]):
                pts[-1].w2_hi = w2
                continue
            pts.append(FrontPoint(w2, w2, r["sig"][0], r["sig"][1], r["throughput"], r["policy"],
                                  r["control_limit"], r["sig"]))
        a = anchors[i]
        if a is not None and not _same(pts[-1].signature, a["sig"]):
            pts.append(FrontPoint(math.inf, math.inf, a["sig"][0], a["sig"][1], a["throughput"], a["policy"],
                                  a["control_limit"], a["sig"]))
        fronts.append(Front(problem, pts, labels[i] if labels else ""))
    if simulate_requests:
        jobs = [(f.problem, p) for f in fronts for p in f.points]
        sims = mapper(_simulate_job, [j[0] for j in jobs], [j[1].policy for j in jobs], [int(simulate_requests)] * len(jobs),
                      [int(seed)] * len(jobs), [tuple(float(b) for b in within_ms)] * len(jobs))
        for (_, p), s in zip(jobs, sims):
            p.percentiles, p.within = s["percentiles"], s["within"]
        if progress is not None:
            progress(len(jobs))
    return fronts


def sweep_w2(problem: BatchingProblem, w2_min: float = 0.01, w2_max: float = 10.0, points: int = 25,
             rtol: float = 0.02, simulate_requests: int = 0, within_ms=(), seed: int = 0, extend: int = 6,
             progress=None, mapper: Mapper | None = None) -> Front:
    """The SMDP front of one problem (:func:`sweep_fronts` for one)."""
    return sweep_fronts([problem], w2_min, w2_max, points, rtol, simulate_requests, within_ms, seed,
                        extend=extend, progress=progress, mapper=mapper)[0]


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
        for p, s in zip(points, sims):
            p.percentiles, p.within = s["percentiles"], s["within"]
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


def dominated_by_front(front: Front, latency_ms: float, power_w: float, latency_ci: float = 0.0,
                       power_ci: float = 0.0) -> bool:
    """The dominance test of the module doc: F(W_b + h_W) ≤ P_b + h_P."""
    return front.power_at(latency_ms + latency_ci) <= (power_w + power_ci) * (1 + 1e-9)


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
