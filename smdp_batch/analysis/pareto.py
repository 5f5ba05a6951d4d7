"""Latency–power trade-off curves, baselines on them, and SLO-driven choice of w2 (paper 004 §VII-B, Figs. 4–6).

Sweeping w2 (w1 = 1) traces the SMDP front of (W̄, P̄) pairs.  Policies change in steps as w2 grows:
many weights give the same deployed policy.  Two weights give *the same policy in service* when the
W̄ and P̄ of their tables as deployed (eq. 30 extension, exact to 1e-8 relative) agree to 1e-6 relative.  Their tables may still
differ at queue lengths so rare (probability ~1e-10) that no metric can tell them apart.

**Sweep.** w2 = 0 first, then a log grid of w2 and doublings beyond it until the least-power end,
then rounds that split every interval whose two ends (a at w2 = lo, b at hi) give different policies.
The split is at the weight where a and b cost the same, w* = w1·(W̄_b − W̄_a)/(P̄_a − P̄_b) (the
non-inferior set estimation of Cohon, *Multiobjective Programming and Planning*, 1978; the sandwich
bound of Rennen, van Dam & den Hertog, INFORMS J. Computing 23, 2011).  Each policy's (W̄, P̄) is a
vertex of the convex set of achievable pairs, so:

* if the solve at w* does not cost less than a and b there, no vertex lies between them: the two are
  neighbours on the front and the interval is closed, exactly;
* the supporting lines at a (normal (w1, lo)) and b (normal (w1, hi)) bound every policy between
  them; when that bound leaves at most ``ftol`` of the objective below the chord at w*, the interval is
  left *open*: the drawn front (chords) is within ftol of the true one there (default 1e-3; ftol = 0
  resolves every vertex).  Intervals narrower than ``rtol`` are not split either.

The first solve of a front is a converged one; every later solve starts from the nearest solved w2
(:func:`~smdp_batch.solvers.search.search_near`: one warm-started truncation around the neighbour's,
whose overflow state is negligible, so W̄ and P̄ are exact; the table itself is verified only when a
point is exported, :meth:`Front.solution`).  Where the neighbour's own table failed that overflow test up
to :data:`OVERFLOW_SMAX` states (heavy-tailed batch times, ρ near 1), the solve is a converged one at once: a
near solve would fail there too (measured on lognormal σ = 1 fronts, every one did, at 0.2 s each; the fronts of
exponential, fixed, gamma, hyperexponential and lognormal times at ρ 0.3–0.9 came out the same to round-off, in
28 s against 44 s for all 48).  Open gaps are resolved on demand: :meth:`Front.choose`
solves in the gaps next to its pick (so the pick is the least-power policy meeting the SLO among all,
with exact w2 edges) and :func:`dominated_by_front` in the gap under a baseline.  Each round's solves
are independent and go to a *mapper* (:mod:`smdp_batch.parallel`: this process or Dask); the rounds
do not depend on the mapper, so neither does the result.  Several scenarios and loads share the rounds.

**SLO choice** (§VII-B1 and B3): among the front's policies that meet the SLO — mean latency (exact), a
simulated p95/p99, or a simulated satisfaction share P(W ≤ bound) ≥ target (Fig. 6(c)) — the one with
the least power; its whole w2 range is reported.  The gaps next to the pick are solved first, so for a
mean-latency SLO no policy of the front, swept or not, meets it with less power; for simulated SLOs the
policies between the pick and its lower-power neighbour are simulated too.

**Baselines** (Fig. 5) are :mod:`~smdp_batch.analysis.rule_points`' (greedy and static-b tables exact, the
servers' timeout rules simulated over their delay knob); their names are re-exported here, where the
notebooks have always imported them.  What this module adds is the test of a baseline against the front:

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
from ..limits import REQUESTS_LIMIT, WEIGHT_LIMIT
from ..model.problem import BatchingProblem
from .parallel import Mapper, local_map
from .rule_points import BaselinePoint, _simulate_job, baseline_points, default_statics, latency_cdfs
from ..solvers import solve

__all__ = ["FrontPoint", "Front", "BaselinePoint", "sweep_w2", "sweep_fronts", "baseline_points",
           "dominated_by_front", "latency_cdfs", "default_statics"]


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
    hint: dict | None = field(repr=False, default=None)  # its truncation, where a neighbouring solve starts

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
    open_gaps: list[tuple[float, float]] = field(default_factory=list)  # (w2, w2) pairs left within ftol
    settings: dict = field(default_factory=dict)  # the sweep's ftol, rtol and simulation settings

    def choose(self, slo_mean_ms: float | None = None, slo_p95_ms: float | None = None,
               slo_p99_ms: float | None = None, slo_within: tuple[float, float] | None = None) -> FrontPoint | None:
        """The least-power point meeting the SLO (exactly one), or None if none does.

        Where the sweep left the front within ftol next to the pick, this solves there first (and
        simulates new points with the sweep's settings), so the pick is the least-power policy meeting
        the SLO among all of the front's, and its w2 range is exact at both ends (or resolved to rtol).
        ``slo_within = (bound_ms, share)``: at least ``share`` (0–1) of requests within ``bound_ms``.
        """
        given = [k for k, v in (("mean", slo_mean_ms), ("p95", slo_p95_ms), ("p99", slo_p99_ms),
                                ("within", slo_within)) if v is not None]
        if len(given) != 1:
            raise InputError("give exactly one SLO: mean, p95 or p99 latency bound in ms, or a satisfaction share")
        if given[0] == "within":
            bound, share = (float(x) for x in slo_within)  # type: ignore[union-attr]  # the one SLO given
            if not (0 < share <= 1):
                raise InputError(f"the satisfaction share must lie in (0, 1], got {share!r}")

        def meets(p: FrontPoint) -> bool:
            if given[0] == "mean":
                return p.mean_latency_ms <= slo_mean_ms  # type: ignore[operator]  # the one SLO given
            if given[0] == "within":
                if bound not in p.within:
                    raise InputError(f"the sweep has no simulated share within {bound:g} ms; sweep with within_ms=({bound:g},)")
                return p.within[bound] >= share
            key = f"{given[0]}_ms"
            if key not in p.percentiles:
                raise InputError(f"the sweep has no simulated {key}; run it with simulate_requests > 0")
            return p.percentiles[key] <= (slo_p95_ms if given[0] == "p95" else slo_p99_ms)

        while True:
            ok = [p for p in self.points if meets(p)]
            pick = min(ok, key=lambda p: p.mean_power_w) if ok else None
            if pick is None:
                return None
            k = self.points.index(pick)
            # the gap after the pick may hold a lower-power policy that meets the SLO; the gap before it
            # bounds the pick's own w2 range: both are resolved exactly where the sweep stopped at ftol
            if not (self._refine_gap(k) or self._refine_gap(k - 1)):
                return pick

    def _refine_gap(self, k: int) -> bool:
        """One solve in the open gap between points k and k+1 (left at ftol by the sweep), at the sandwich
        weight w*; False when there is no open gap there.  A solve at w* that does not beat both ends
        closes the gap: the two are neighbouring vertices, both optimal at w*, which ends both ranges."""
        if k < 0 or k + 1 >= len(self.points):
            return False
        left, right = self.points[k], self.points[k + 1]
        gap = (left.w2_hi, right.w2_lo)
        if gap not in self.open_gaps:
            return False
        self.open_gaps.remove(gap)
        w1, lo, hi = self.problem.w1, gap[0], gap[1]
        if lo > 0 and hi / lo - 1 <= self.settings.get("rtol", 0.0):
            return True
        mid, width = _sandwich(w1, left.signature, right.signature, lo, hi)
        r = _solve_job(self.problem, mid, left.hint)
        if "error" in r:
            raise InputError(f"w2 = {mid:.6g}: {r['error']}")
        point = _point(mid, r)
        if math.isfinite(width) and not _improves(w1, left.signature, right.signature, point.signature, mid):
            left.w2_hi, right.w2_lo = mid, mid  # a tie: both optimal at w*, the edge of both ranges
        elif _same(point.signature, left.signature):
            left.w2_hi = mid
            self.open_gaps.append((mid, hi))
        elif _same(point.signature, right.signature):
            right.w2_lo = mid
            self.open_gaps.append((lo, mid))
        else:  # a policy between the two: the front gains a point and two gaps to check
            if self.settings.get("requests"):
                _simulate_point(self.problem, point, self.settings)
            self.points.insert(k + 1, point)
            self.open_gaps += [(lo, mid), (mid, hi)]
        return True

    def refine_at(self, latency_ms: float) -> bool:
        """One solve in the open gap (if any) whose two points bracket this mean latency; False if none."""
        for k in range(len(self.points) - 1):
            if self.points[k].mean_latency_ms <= latency_ms <= self.points[k + 1].mean_latency_ms:
                if self._refine_gap(k):
                    return True
        return False

    def solution(self, point: FrontPoint):
        """The full :class:`~smdp_batch.solvers.Solution` of a swept point: a converged solve at the
        geometric middle of its w2 range (deterministic); the w2 = ∞ end is a static table, not a
        solve (see ``point.policy``)."""
        if not math.isfinite(point.w2_lo):
            raise InputError("the w2 = ∞ end of the front is the static table point.policy, not an SMDP solve")
        # inside the range: its ends may be tie weights, where the neighbouring policy is optimal too
        w2 = math.sqrt(point.w2_lo * point.w2_hi) if point.w2_lo > 0 and math.isfinite(point.w2_hi) else point.w2_lo
        return solve(self.problem.replace(w2=w2))

    def power_at(self, latency_ms: float) -> float:
        """F(W) of the module doc: the least power the front achieves at mean latency W (W)."""
        pts = sorted(self.points, key=lambda p: p.mean_latency_ms)
        if not pts:
            return math.inf
        w = np.array([p.mean_latency_ms for p in pts])
        pw = np.array([p.mean_power_w for p in pts])
        if latency_ms < w[0]:
            return math.inf
        if latency_ms >= w[-1]:
            return float(pw[-1])
        return float(np.interp(latency_ms, w, pw))


# ------------------------------------------------------------------------------------------- jobs
def _solve_job(problem: BatchingProblem, w2: float, hint: dict | None = None) -> dict:
    """One front point, reduced to what the front keeps (small to ship back from a worker); a truncation
    that fails comes back as {"error": message}.

    ``hint`` (a neighbouring w2's truncation: s_max, c_o, policy) selects the *near* solve
    (:func:`~smdp_batch.solvers.search.search_near`: one truncation around the neighbour's, warm-started,
    not verified against a larger one); the first point of a front, and any point the near solve cannot
    settle, gets a converged solve (:func:`~smdp_batch.solvers.solve`).  Either way W̄ and P̄ are the
    exact metrics of the table as deployed (eq. 30).  ``policy`` is kept up to the start of its last
    run of equal actions (eq. 30 repeats that action beyond)."""
    from ..solvers.evaluation import control_limit_of, evaluate_deployed
    from ..solvers.search import NEAR_OVERFLOW, Candidates, search_near

    p = problem.replace(w2=float(w2))
    try:
        cand = None
        near = hint if hint is not None and hint.get("near", True) else None  # where a near solve may settle
        if near is not None:
            cands = Candidates(p, 1e-3)
            cands.warm = np.asarray(near["policy"], dtype=np.int64)
            c_o = max(100.0, float(near["abstract_cost"]))  # at least solve()'s default c_o (paper 004 Table II)
            cand = search_near(cands, int(near["s_max"]), c_o, 2 * int(near["s_max"]))
        if cand is not None:
            pol, s_max, c_o = cand.res.policy, cand.model.s_max, cand.model.abstract_cost  # type: ignore[union-attr]  # search_near returns solved ones
        else:
            sol = solve(p, hint=hint)
            pol, s_max, c_o = sol.policy, sol.s_max, sol.model.abstract_cost
        # eq. 19's boundary: at light tails exact to round-off at any s_max, so equal policies get equal metrics
        # and the sweep's tie test (_improves, 1e-9) closes intervals; the tail boundary's doubling stops at tol.
        # Where eq. 19 needs more than OVERFLOW_SMAX states (near ρ = 1, heavy-tailed batch times: its cost grows
        # as the square of the truncation), the tail boundary (exact to 1e-10) evaluates it instead
        # A neighbour whose overflow check failed says the tail is that heavy here too (it is the batch-time law's
        # and the load's, not w2's): its attempt, up to OVERFLOW_SMAX states, is skipped (measured: lognormal σ = 1,
        # ρ 0.5, 0.98 s of a 2.1 s front went on attempts that all failed)
        overflow_ok = hint is None or hint.get("overflow", True)
        if overflow_ok:
            try:
                ev = evaluate_deployed(p, pol, tol=NEAR_OVERFLOW, boundary="overflow", max_smax=OVERFLOW_SMAX)
            except InputError:
                overflow_ok = False
        if not overflow_ok:
            ev = evaluate_deployed(p, pol)
    except InputError as e:
        return {"error": str(e)}
    table = np.asarray(pol[:-1])
    change = np.nonzero(table[1:] != table[:-1])[0]
    keep = int(change[-1]) + 2 if change.size else 1
    return {"sig": (ev.mean_latency_ms, ev.mean_power_w), "throughput": ev.throughput,
            "policy": [int(a) for a in table[:keep]], "control_limit": control_limit_of(pol, p.batch_sizes),
            # a near solve that did not settle next door will not here either (heavy tails: the overflow test needs
            # more than twice the neighbour's truncation): the solves started from this one go straight to solve();
            # so too where this table's own overflow check failed up to OVERFLOW_SMAX, the test a near solve passes
            # by (measured: lognormal σ = 1, every near solve started from such a point failed, 0.2 s each)
            "hint": {"s_max": s_max, "abstract_cost": c_o, "policy": [int(a) for a in pol], "overflow": overflow_ok,
                     "near": overflow_ok and (hint is None or (near is not None and cand is not None))}}


def _point(w2: float, r: dict) -> FrontPoint:
    return FrontPoint(w2, w2, r["sig"][0], r["sig"][1], r["throughput"], r["policy"], r["control_limit"], r["sig"],
                      hint=r.get("hint"))


def _simulate_point(problem: BatchingProblem, point: FrontPoint, settings: dict) -> None:
    s = _simulate_job(problem, point.policy, settings["requests"], settings["seed"], settings["within_ms"])
    _set_simulated(problem, point, s, settings["requests"])


def _set_simulated(problem: BatchingProblem, point: FrontPoint, s: dict, requests: int) -> None:
    """Store a front point's simulated percentiles; a simulation that failed (a run too short to settle near
    ρ = 1: the exact evaluation says the policy is stable) is refused on one line naming the load and the fix."""
    if "error" in s:
        raise InputError(
            f"simulating the front's policy at w2 = {point.w2_lo:.6g} (ρ = {problem.rho:.6g}, exact W̄ = "
            f"{point.mean_latency_ms:.6g} ms) with {requests} requests failed: {s['error']}; simulate more requests "
            f"(--requests, ≤ {REQUESTS_LIMIT}) or use a lower load, or drop the simulated percentiles")
    point.percentiles, point.within = s["percentiles"], s["within"]


#: The largest truncation a front point's metrics are taken from with eq. 19's boundary (else the tail boundary).
OVERFLOW_SMAX = 2048

#: Default front tolerance: an interval of w2 is not split further once no policy between its ends can
#: cost less than this share of the objective below their chord (the sandwich bound of the module doc).
FTOL = 1e-3

#: Finest w2 resolution of a sweep: the bisection costs a solve per halving, ~log2(ln(hi/lo)/rtol) per boundary.
RTOL_MIN = 1e-4


def _same(a: tuple, b: tuple, rtol: float = 1e-6) -> bool:
    """Same policy in service: W̄ and P̄ equal to ``rtol`` relative (see the module doc)."""
    return all(abs(x - y) <= rtol * max(abs(x), abs(y)) for x, y in zip(a, b))


def _sandwich(w1: float, a: tuple, b: tuple, lo: float, hi: float) -> tuple[float, float]:
    """(w*, gap) for two solved ends a = (W̄, P̄) at w2 = lo and b at w2 = hi (module doc, *Sandwich*).

    w* is the weight at which a and b cost the same, w1·(W̄_b − W̄_a)/(P̄_a − P̄_b); gap bounds, relative
    to that cost, how much cheaper at w* any policy between them can be: every policy lies above the
    supporting lines w1·W + lo·P ≥ g_a(lo) and w1·W + hi·P ≥ g_b(hi), which meet at a point T, and
    gap = (g_a(w*) − w1·W_T − w*·P_T) / g_a(w*).  A degenerate pair (no such w* strictly inside) gives
    the geometric midpoint and an infinite gap.
    """
    (wa, pa), (wb, pb) = a, b
    mid = math.sqrt(lo * hi) if lo > 0 else hi / 2
    if not (pa > pb and wb > wa) or not math.isfinite(hi):
        return mid, math.inf
    w_star = w1 * (wb - wa) / (pa - pb)
    if not (lo < w_star < hi):  # rounding at a tie: bisect instead
        return mid, math.inf
    ga, gb = w1 * wa + lo * pa, w1 * wb + hi * pb
    p_t = (gb - ga) / (hi - lo)
    w_t = (ga - lo * p_t) / w1
    g_star = w1 * wa + w_star * pa
    return w_star, max(g_star - (w1 * w_t + w_star * p_t), 0.0) / g_star


def _improves(w1: float, a: tuple, b: tuple, c: tuple, w: float) -> bool:
    """Whether the point c solved at w2 = w costs less there than both ends a and b (by > 1e-9 relative):
    if not, at the tie weight w* no policy beats a and b, so none lies strictly between them."""
    ga = min(w1 * a[0] + w * a[1], w1 * b[0] + w * b[1])
    return w1 * c[0] + w * c[1] < ga * (1 - 1e-9)


def _check_sweep(w2_min: float, w2_max: float, points: int, rtol: float, ftol: float = 0.0) -> None:
    if not (0 <= ftol < 0.1):
        raise InputError(f"the front tolerance ftol must lie in [0, 0.1) (a share of the objective), got {ftol!r}")
    if not (0 < w2_min < w2_max and math.isfinite(w2_max)):
        raise InputError(f"need 0 < w2_min < w2_max < ∞, got {w2_min!r}, {w2_max!r}")
    if w2_max > WEIGHT_LIMIT:  # only the ratio w2/w1 shapes the policy: beyond it the costs overflow
        raise InputError(f"w2_max must be ≤ {WEIGHT_LIMIT:g}, got {w2_max!r}; only w2/w1 shapes the policy: scale both down")
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


def sweep_fronts(problems: list[BatchingProblem], w2_min: float = 0.01, w2_max: float = 10.0, points: int = 5,
                 rtol: float = 0.02, simulate_requests: int = 0, within_ms=(), seed: int = 0, labels=None,
                 extend: int = 6, progress=None, mapper: Mapper | None = None, ftol: float = FTOL) -> list[Front]:
    """Trace the SMDP front of each problem over w2 ∈ {0} ∪ [w2_min, w2_max] (see the module doc).

    ``extend``: up to this many doublings of w2 beyond ``w2_max`` until the policy is the least-power
    one (static b*, the w2 → ∞ end); if that end is not reached (or a truncation fails at large w2),
    it is added as a point with w2 = ∞, joined to the swept front by time-sharing.
    ``ftol`` (share of the objective) and ``rtol`` (relative width of w2) stop the splitting as the
    module doc says; the gaps left open are ``Front.open_gaps``.
    ``simulate_requests`` > 0 adds simulated p50/p95/p99 and the shares within ``within_ms`` to every
    point.  ``progress(n)`` is told of every n jobs done; ``mapper`` runs each round's jobs.
    """
    _check_sweep(w2_min, w2_max, points, rtol, ftol)
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
    run([(i, 0.0) for i in range(len(problems))])  # w2 = 0 first: every later solve starts near a neighbour
    run([(i, w) for i in range(len(problems)) for w in grid])
    open_ends = {i: grid[-1] for i, a in enumerate(anchors) if a is not None}
    for _ in range(int(extend)):  # extend w2 until the least-power end is reached
        open_ends = {i: w for i, w in open_ends.items()
                     if "error" not in caches[i][w] and not _same(caches[i][w]["sig"], anchors[i]["sig"])}
        if not open_ends:
            break
        open_ends = {i: 2 * w for i, w in open_ends.items()}
        run(list(open_ends.items()))
    for i, cache in enumerate(caches):  # a failed solve (a truncation at very large w2) ends that front's extension
        failed = {w: r["error"] for w, r in cache.items() if "error" in r}
        for w in failed:
            del cache[w]
        if not cache:  # not one policy of this front could be solved: refuse, naming the load and the reason
            label = f" ({labels[i]})" if labels and labels[i] else ""
            raise InputError(f"no policy of the front at ρ = {problems[i].rho:.6g}, λ = {problems[i].lam:.6g} /ms{label} "
                             f"could be solved: {failed[min(failed)]}")
    intervals = [(i, lo, hi) for i in range(len(problems)) for lo, hi in zip(sorted(caches[i])[:-1], sorted(caches[i])[1:])]
    open_gaps: list[list[tuple[float, float]]] = [[] for _ in problems]
    ties: list[list[float]] = [[] for _ in problems]
    while intervals:  # one round: split every interval whose front is not yet resolved (module doc)
        split = []
        for i, lo, hi in intervals:
            a, b = caches[i][lo], caches[i][hi]
            if _same(a["sig"], b["sig"]) or (lo > 0 and hi / lo - 1 <= rtol) or (lo == 0 and hi <= w2_min * rtol):
                continue
            mid, gap = _sandwich(problems[i].w1, a["sig"], b["sig"], lo, hi)
            if gap <= ftol:
                open_gaps[i].append((lo, hi))
                continue
            split.append((i, lo, hi, mid, math.isfinite(gap)))
        run([(i, mid) for i, _, _, mid, _ in split])
        intervals = []
        for i, lo, hi, mid, tie in split:
            if "error" in caches[i][mid]:
                raise InputError(f"w2 = {mid:.6g}: {caches[i][mid]['error']}")
            if tie and not _improves(problems[i].w1, caches[i][lo]["sig"], caches[i][hi]["sig"], caches[i][mid]["sig"], mid):
                ties[i].append(mid)  # the two ends are neighbouring vertices: nothing lies between them
                continue
            intervals += [(i, lo, mid), (i, mid, hi)]
    fronts = []
    for i, problem in enumerate(problems):
        pts: list[FrontPoint] = []
        for w2 in sorted(caches[i]):
            r = caches[i][w2]
            if pts and _same(pts[-1].signature, r["sig"]):
                pts[-1].w2_hi = w2
                continue
            pts.append(_point(w2, r))
        for w in ties[i]:  # both neighbours are optimal at a closed gap's tie weight: it ends both ranges
            j = next(j for j, p in enumerate(pts) if p.w2_lo <= w <= p.w2_hi)
            if pts[j].w2_lo == w and j > 0:
                pts[j - 1].w2_hi = w
            elif pts[j].w2_hi == w and j + 1 < len(pts):
                pts[j + 1].w2_lo = w
        a = anchors[i]
        if a is not None and not _same(pts[-1].signature, a["sig"]):
            pts.append(FrontPoint(math.inf, math.inf, a["sig"][0], a["sig"][1], a["throughput"], a["policy"],
                                  a["control_limit"], a["sig"]))
        fronts.append(Front(problem, pts, labels[i] if labels else "", open_gaps[i],
                            {"ftol": ftol, "rtol": rtol, "requests": int(simulate_requests), "seed": int(seed),
                             "within_ms": tuple(float(b) for b in within_ms)}))
    if simulate_requests:
        jobs = [(f.problem, p) for f in fronts for p in f.points]
        sims = mapper(_simulate_job, [j[0] for j in jobs], [j[1].policy for j in jobs], [int(simulate_requests)] * len(jobs),
                      [int(seed)] * len(jobs), [tuple(float(b) for b in within_ms)] * len(jobs))
        for (f, p), s in zip(jobs, sims):
            _set_simulated(f, p, s, int(simulate_requests))
        if progress is not None:
            progress(len(jobs))
    return fronts


def sweep_w2(problem: BatchingProblem, w2_min: float = 0.01, w2_max: float = 10.0, points: int = 5,
             rtol: float = 0.02, simulate_requests: int = 0, within_ms=(), seed: int = 0, extend: int = 6,
             progress=None, mapper: Mapper | None = None, ftol: float = FTOL) -> Front:
    """The SMDP front of one problem (:func:`sweep_fronts` for one)."""
    return sweep_fronts([problem], w2_min, w2_max, points, rtol, simulate_requests, within_ms, seed,
                        extend=extend, progress=progress, mapper=mapper, ftol=ftol)[0]


def dominated_by_front(front: Front, latency_ms: float, power_w: float, latency_ci: float = 0.0,
                       power_ci: float = 0.0) -> bool:
    """The dominance test of the module doc: F(W_b + h_W) ≤ P_b + h_P.

    Where that latency falls in a gap the sweep left within ftol, the front is resolved there first
    (:meth:`Front.refine_at`) until the test passes or the gap is closed: F is an upper bound of the
    true front inside a gap, so a baseline is never declared undominated for want of a solve."""
    w = latency_ms + latency_ci
    while True:
        if front.power_at(w) <= (power_w + power_ci) * (1 + 1e-9):
            return True
        if not front.refine_at(w):
            return False
