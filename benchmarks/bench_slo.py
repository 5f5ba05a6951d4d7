"""The savings table: least power at a p99 SLO, the SMDP table + timer against every tuned server rule and
the rules' default settings, on six scenarios × three SLOs (1.5×, 2× and 3× the smallest achievable p99).

    python benchmarks/bench_slo.py            # the table (≈ 3 min on 2 cores), then the timings
    python benchmarks/bench_slo.py --quick    # two scenarios, then the timings
    python benchmarks/bench_slo.py --timings  # the timings only

**Timings**: the search time of one load and of a 5-load range (ρ/3 .. ρ) on the basic, ONNX and heavy-tailed
scenarios, and of an SLO out of reach, each beside the same search on one thread (which must give every figure
the same) and with its shortcuts off as well (one thread, no screen, service draws drawn again for every run: the
search as it was before them), in this process, with the ratio and whether the answers agree (the same setting,
or powers within their intervals).

Every candidate of one cell runs on the same arrivals (200 000 requests, seed 0); a setting meets the SLO
when p99 + its 95 % half-width ≤ the bound.  Each chosen setting is then simulated afresh with 10⁶ requests
and another seed (``fresh p99``), which must meet the SLO.  ``Δ vs best rule`` is the best tuned rule's
power minus the table + timer's (positive: the table + timer saves), with the 95 % interval of the
difference.  ``answer`` is the family of what smdp-batch recommends (the least power of all families: the
table + timer unless a server rule outside it wins).  The smallest achievable p99 is the least simulated p99 of the greedy table (serve what is
waiting, up to Bmax) and the SMDP table at w2 = 0 (least mean latency).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from smdp_batch.analysis import sim_draws, slo
from smdp_batch.analysis.simulate import simulate
from smdp_batch.analysis.slo import RULE_FAMILIES, load_grid, optimise
from smdp_batch.baselines import parse_policy
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers import solve

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE = os.path.join(HERE, "data", "onnx_mlp_cpu.csv")


def scenarios(quick: bool):
    out = [("basic ρ 0.3", BatchingProblem.basic(rho=0.3)), ("basic ρ 0.5", BatchingProblem.basic(rho=0.5))]
    if quick:
        return out
    out += [
        ("basic ρ 0.8", BatchingProblem.basic(rho=0.8)),
        ("hyperexp ρ 0.5", BatchingProblem.preset("fig9-hyperexp", rho=0.5)),
        ("gamma:0.5 ρ 0.5", BatchingProblem.basic(rho=0.5, service="gamma:0.5")),
        ("measured ONNX MLP ρ 0.5", onnx(0.5)),
        ("lognormal:1 ρ 0.5", BatchingProblem.basic(rho=0.5, service="lognormal:1")),
    ]
    return out


def onnx(rho: float) -> BatchingProblem:
    return BatchingProblem.from_rho(rho, batch_sizes=(1, 2, 4, 8, 16, 32), latency=f"csv:{PROFILE}",
                                    energy=f"csv:{PROFILE}", service=f"empirical:{PROFILE}")


def smallest_p99(p: BatchingProblem) -> float:
    greedy = parse_policy("greedy", p.batch_sizes, p.bmax)[:-1]
    sol = solve(p.replace(w2=0.0))
    fast = np.asarray(sol.policy)[: sol.s_max + 1]
    return min(simulate(p, t, requests=200_000, seed=0).percentiles["p99_ms"] for t in (greedy, fast))


def cell(name: str, p: BatchingProblem, factor: float, p99min: float) -> dict:
    slo = factor * p99min
    t0 = time.perf_counter()
    ans = optimise(p, {"p99": slo}, requests=200_000, seed=0)
    secs = time.perf_counter() - t0
    rec = ans.best["table+timer"]
    best_rule = ans.best_rule()
    fresh = simulate(p, rec.rule, requests=1_000_000, seed=12345).percentiles["p99_ms"] if rec else math.nan
    defaults = {d.spec: (d.power_w if d.meets else float(np.mean([x.power_w for x in d.loads])), d.meets)
                for d in ans.defaults}
    row = {"scenario": name, "factor": factor, "slo": slo, "rec": rec, "best_rule": best_rule, "ans": ans,
           "answer": ans.recommended,
           "fresh_p99": fresh, "defaults": defaults, "seconds": secs}
    return row


def fmt_power(s) -> str:
    return "—" if s is None else f"{s.power_w:.3f} ± {s.power_ci:.2f}"


def table(quick: bool) -> int:
    """The savings table (module doc); the number of cells that lose or break their SLO."""
    rows = []
    for name, p in scenarios(quick):
        m = smallest_p99(p)
        for factor in (1.5, 2.0, 3.0):
            rows.append(cell(name, p, factor, m))
            r = rows[-1]
            print(f"  {name:24s} ×{factor:g} done in {r['seconds']:.1f} s", file=sys.stderr)
    fams = ("smdp",) + RULE_FAMILIES
    print("| scenario | p99 SLO [ms] | table+timer setting | P̄ [W] | " + " | ".join(fams)
          + " | Δ vs best rule [W] | Triton default (delay 0) | Ray default (max 10, 10 ms) | fresh p99 [ms] | answer | search [s] |")
    print("|" + "---|" * (10 + len(fams)))
    bad = 0
    for r in rows:
        ans, rec, br = r["ans"], r["rec"], r["best_rule"]
        if rec is not None and br is not None:
            ci = math.hypot(rec.power_ci, br.power_ci)
            delta = br.power_w - rec.power_w
            dtext = f"{delta:+.3f} ± {ci:.2f}"
            if delta < -ci:
                bad += 1
                dtext += " LOSES"
        else:
            dtext = "—"
        if rec is not None and not r["fresh_p99"] <= r["slo"]:
            bad += 1
        tri = next(((v, ok) for k, (v, ok) in r["defaults"].items() if k.startswith("triton") and "delay_us=0" in k), None)
        ray = next(((v, ok) for k, (v, ok) in r["defaults"].items() if k.startswith("ray")), None)
        show = lambda d: "—" if d is None else f"{d[0]:.2f}{'' if d[1] else ' (breaks SLO)'}"
        print(f"| {r['scenario']} | {r['slo']:.3g} (×{r['factor']:g}) | `{rec.spec if rec else '—'}` | {fmt_power(rec)} | "
              + " | ".join(fmt_power(ans.best.get(f)) for f in fams)
              + f" | {dtext} | {show(tri)} | {show(ray)} | {r['fresh_p99']:.3f} | {r['answer'].family if r['answer'] else '—'} "
              f"| {r['seconds']:.1f} |")
    print(f"\ncells where the table + timer loses beyond the interval, or breaks its SLO on a fresh seed: {bad}")
    return bad


def timed(p: BatchingProblem, bound: float, lams, shortcuts: bool, workers: int | None = None):
    """(answer, seconds) of one search, with its shortcuts (the screen, kept service draws) on or off, on
    ``workers`` threads (default: one per CPU)."""
    saved = slo.SCREEN_MIN, sim_draws.CACHE_BYTES
    if not shortcuts:
        slo.SCREEN_MIN, sim_draws.CACHE_BYTES = 10**12, 0
    sim_draws._CACHE.clear()
    try:
        t0 = time.perf_counter()
        ans = optimise(p, {"p99": bound}, lams, requests=200_000, workers=workers)
        return ans, time.perf_counter() - t0
    finally:
        slo.SCREEN_MIN, sim_draws.CACHE_BYTES = saved


def _figures(a) -> tuple:
    """Every family's setting and figures, the defaults' and the fresh check's: what threads must not change."""
    return (tuple((f, None if s is None else (s.spec, s.loads)) for f, s in sorted(a.best.items())),
            tuple((s.spec, s.loads) for s in a.defaults), None if a.fresh is None else a.fresh.loads, a.evaluations)


def agree(a, b) -> str:
    x, y = a.recommended, b.recommended
    if x is None or y is None:
        return "yes (none)" if x is None and y is None else "NO"
    if x.spec == y.spec:
        return "yes (same setting)"
    ci = math.hypot(x.power_ci, y.power_ci)
    return f"yes (P̄ {x.power_w - y.power_w:+.3f} ± {ci:.2f} W)" if abs(x.power_w - y.power_w) <= ci else "NO"


def timings() -> int:
    """The search time of each case (module doc), with its shortcuts and without, side by side."""
    cases = [("basic ρ 0.5", BatchingProblem.basic(rho=0.5), 20.0),
             ("measured ONNX MLP ρ 0.5", onnx(0.5), 4.78),
             ("hyperexp ρ 0.5", BatchingProblem.preset("fig9-hyperexp", rho=0.5), 106.0),
             ("gamma:0.5 ρ 0.5", BatchingProblem.basic(rho=0.5, service="gamma:0.5"), 69.3),
             ("lognormal:1 ρ 0.5", BatchingProblem.basic(rho=0.5, service="lognormal:1"), 60.0),
             ("lognormal:1 ρ 0.5, out of reach", BatchingProblem.basic(rho=0.5, service="lognormal:1"), 40.0)]
    optimise(BatchingProblem.basic(rho=0.5), {"p99": 20.0}, requests=200_000)  # compile once
    print(f"\nsearch: {slo.default_workers()} threads (one per CPU); one thread: the same search on one; "
          "without shortcuts: one thread, no screen, service draws drawn again for every run")
    print("\n| scenario | p99 SLO [ms] | loads | search [s] | simulations | one thread [s] | without shortcuts [s] | "
          "ratio | same answer |")
    print("|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for name, p, bound in cases:
        for n in (1, 5):
            lams = None if n == 1 else load_grid(p, p.lam / 3, p.lam)
            fast, t_fast = timed(p, bound, lams, True)
            one, t_one = timed(p, bound, lams, True, workers=1)
            slow, t_slow = timed(p, bound, lams, False, workers=1)
            same = agree(fast, slow)
            bad += same == "NO" or _figures(fast) != _figures(one)  # threads never change a figure
            span = "1" if n == 1 else f"5 ({lams[0] * 1e3:.0f}..{lams[-1] * 1e3:.0f} req/s)"
            print(f"| {name} | {bound:g} | {span} | {t_fast:.2f} | {fast.evaluations} | {t_one:.2f} | {t_slow:.2f} | "
                  f"{t_slow / t_fast:.1f}× | {same} |", flush=True)
    print(f"\ncases where the two answers disagree: {bad}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timings", action="store_true", help="the timings only")
    args = ap.parse_args()
    bad = 0 if args.timings else table(args.quick)
    bad += timings()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
