"""Latency–power trade-off curves and SLO-driven choice of the weight w2 (paper 004 §VII-B, Figs. 4–6).

Sweeping w2 (w1 = 1) traces the SMDP front of (W̄, P̄) pairs.  Policies change in steps as w2 grows:
many weights give the same deployed policy.  Two weights give *the same policy in service* when the
exact W̄ and P̄ of their tables (eq. 30 extension) agree to 1e-6 relative.  Their tables may still
differ at queue lengths so rare (probability ~1e-10) that no metric can tell them apart.

The sweep starts on a log grid and bisects (geometrically) every interval whose two ends give
different policies, until the ends are within ``rtol`` of each other.  So each policy's range of w2 is
known to that relative precision.

SLO choice (§VII-B1 and B3): among the swept policies that meet the SLO (mean latency, or a simulated
p95/p99, or a satisfaction share for a latency bound), the one with the least power; the output gives
its whole w2 range.

Baseline dominance: a baseline point (W_b, P_b) is *dominated by the front* when the front's power at
latency W_b, linearly interpolated between neighbouring SMDP points (time-sharing between them
achieves it), is at most P_b.  Only latencies inside the swept front's range are comparable: a
baseline slower than the slowest swept point needs a sweep to larger w2 (which, at large w2, needs
very long truncations; see the README's limits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .model.problem import BatchingProblem
from .solvers import solve

__all__ = ["FrontPoint", "Front", "sweep_w2", "dominated_by_front"]


@dataclass
class FrontPoint:
    """One distinct deployed policy of the sweep, with the range of w2 that gives it."""

    w2_lo: float
    w2_hi: float
    mean_latency_ms: float
    mean_power_w: float
    throughput: float
    policy: list[int]
    control_limit: int | None
    signature: tuple = field(repr=False, default=())
    percentiles: dict = field(default_factory=dict)  # simulated, when asked

    @property
    def efficiency(self) -> float:
        """Requests per mJ: λ / P̄ (paper 004 Fig. 5(c))."""
        return self.throughput / self.mean_power_w

    def as_dict(self) -> dict:
        return {"w2_lo": self.w2_lo, "w2_hi": self.w2_hi, "mean_latency_ms": self.mean_latency_ms,
                "mean_power_w": self.mean_power_w, "efficiency_req_per_mj": self.efficiency,
                "control_limit": self.control_limit, "policy": self.policy, **self.percentiles}


@dataclass
class Front:
    problem: BatchingProblem
    points: list[FrontPoint]  # by increasing w2 (decreasing power)

    def choose(self, slo_mean_ms: float | None = None, slo_p95_ms: float | None = None,
               slo_p99_ms: float | None = None) -> FrontPoint | None:
        """The least-power point meeting the SLO (exactly one bound), or None if none does."""
        given = [(k, v) for k, v in (("mean_latency_ms", slo_mean_ms), ("p95_ms", slo_p95_ms), ("p99_ms", slo_p99_ms))
                 if v is not None]
        if len(given) != 1:
            raise InputError("give exactly one SLO: mean, p95 or p99 latency bound in ms")
        key, bound = given[0]
        ok = []
        for p in self.points:
            value = p.mean_latency_ms if key == "mean_latency_ms" else p.percentiles.get(key)
            if value is None:
                raise InputError(f"the sweep has no simulated {key}; run it with simulate_requests > 0")
            if value <= bound:
                ok.append(p)
        return min(ok, key=lambda p: p.mean_power_w) if ok else None


def _signature(sol) -> tuple:
    ev = sol.deployed
    return (ev.mean_latency_ms, ev.mean_power_w)


def _same(a: tuple, b: tuple, rtol: float = 1e-6) -> bool:
    """Same policy in service: W̄ and P̄ equal to ``rtol`` relative (see the module doc)."""
    return all(abs(x - y) <= rtol * max(abs(x), abs(y)) for x, y in zip(a, b))


def sweep_w2(problem: BatchingProblem, w2_min: float = 0.01, w2_max: float = 10.0, points: int = 25,
             rtol: float = 0.02, simulate_requests: int = 0, seed: int = 0, progress=None) -> Front:
    """Trace the SMDP front over w2 ∈ [w2_min, w2_max] (plus w2 = 0); see the module doc."""
    if not (0 < w2_min < w2_max and math.isfinite(w2_max)):
        raise InputError(f"need 0 < w2_min < w2_max, got {w2_min!r}, {w2_max!r}")
    if int(points) < 2 or not (0 < rtol < 1):
        raise InputError("need at least 2 grid points and 0 < rtol < 1")
    cache: dict[float, tuple] = {}

    def at(w2: float):
        if w2 not in cache:
            sol = solve(problem.replace(w2=float(w2)))
            cache[w2] = (sol, _signature(sol))
            if progress is not None:
                progress(1)
        return cache[w2]

    grid = [0.0] + list(np.geomspace(w2_min, w2_max, int(points)))
    stack = list(zip(grid[:-1], grid[1:]))
    while stack:  # bisect intervals whose ends differ, down to rtol
        lo, hi = stack.pop()
        if _same(at(lo)[1], at(hi)[1]):
            continue
        if lo > 0 and hi / lo - 1 <= rtol or lo == 0 and hi <= w2_min * rtol:
            continue
        mid = math.sqrt(lo * hi) if lo > 0 else hi * rtol / 2
        stack += [(lo, mid), (mid, hi)]
    ws = sorted(cache)
    pts: list[FrontPoint] = []
    for w2 in ws:
        sol, sig = cache[w2]
        if pts and _same(pts[-1].signature, sig):
            pts[-1].w2_hi = float(w2)
            continue
        ev = sol.deployed
        pts.append(FrontPoint(float(w2), float(w2), ev.mean_latency_ms, ev.mean_power_w, ev.throughput,
                              [int(a) for a in sol.policy[: sol.s_max + 1]], sol.control_limit, sig))
    if simulate_requests:
        from .simulate import simulate

        for p in pts:
            sol = cache[p.w2_lo][0]
            res = simulate(problem, sol, requests=int(simulate_requests), seed=seed)
            p.percentiles = {k: res.percentiles[k] for k in ("p95_ms", "p99_ms")}
    return Front(problem, pts)


def dominated_by_front(front: Front, latency_ms: float, power_w: float) -> bool:
    """True if the front's interpolated power at ``latency_ms`` is ≤ ``power_w`` (see the module doc)."""
    pts = sorted(front.points, key=lambda p: p.mean_latency_ms)
    w = np.array([p.mean_latency_ms for p in pts])
    p = np.array([p.mean_power_w for p in pts])
    if not (w[0] <= latency_ms <= w[-1]):
        raise InputError(
            f"latency {latency_ms:.4g} ms lies outside the swept front [{w[0]:.4g}, {w[-1]:.4g}] ms; widen the w2 range"
        )
    return float(np.interp(latency_ms, w, p)) <= power_w * (1 + 1e-9)
