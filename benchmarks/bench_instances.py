"""The c-server SMDP's size and cost: c = 2, 4, 8 instances with Bmax 32 at ρ 0.5 and 0.9 per instance.

Each case runs in its own process (peak memory is that process's), under a time limit, and prints the state count,
the configurations of the instances, the truncation N, policy iterations, the solve time, the peak memory and
whether it converged, or the one line that refused it before work.  Beside it, the one-server solve of the same
scenario at its share of the load (today's answer per instance), for scale.

    python benchmarks/bench_instances.py            # the whole grid (several minutes on 2 cores)
    python benchmarks/bench_instances.py --quick    # c = 2 only
    python benchmarks/bench_instances.py --busy     # under contention: the table n ↦ b and the busy-aware table
    python benchmarks/bench_instances.py --bound    # every size 1..32 bracketed on 2, 3 and 4 instances

``--busy`` prints, for instances that slow each other (exponential batch times), the exact cost above the optimum
of the table n ↦ b that Triton-like batchers follow and of the busy-aware table (k busy, n) ↦ b that the runtime
follows, with the solve time (both tables included).

``--bound`` brackets the optimum over every size 1..32 (``solve --size-bound auto``: the exact optimum of the sizes
1,2,4,8,16,32 above, a certified class model below) on 2, 3 and 4 instances at ρ 0.5, 0.7 and 0.9, each case in
its own process, and on 2 instances beside the exact every-size optimum, which solves there: where the optimum
lies between the two, as a share of the bracket.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import warnings

CASE = textwrap.dedent("""
    import json, resource, sys, time
    from smdp_batch.errors import InputError
    from smdp_batch.model.problem import BatchingProblem
    from smdp_batch.solvers import solve
    from smdp_batch.solvers.multi_pi import solve_instances
    c, rho, sizes, service = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    p = BatchingProblem.from_rho(rho, service=service, batch_sizes=sizes, instances=c)
    t = time.perf_counter()
    one = solve(p.replace(instances=1, lam=p.lam / c))
    t1 = time.perf_counter() - t
    try:
        s = solve_instances(p, throw=False)
    except InputError as e:
        print(json.dumps({"refused": str(e), "one_s": t1}))
        sys.exit(0)
    print(json.dumps({"states": s.states, "configs": s.configurations, "N": s.n_max, "its": s.iterations,
                      "solve_s": s.solve_time_s, "converged": s.converged, "one_s": t1,
                      "mem_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "g": s.optimal.avg_cost, "g_split": one.deployed.mean_latency_ms * p.w1
                      + p.w2 * c * one.deployed.mean_power_w}))
""")


BOUND = textwrap.dedent("""
    import json, resource, sys, time
    from smdp_batch.model.problem import BatchingProblem
    from smdp_batch.solvers.multi_bound import bound_every_size
    from smdp_batch.solvers.multi_pi import solve_instances
    c, rho, exact = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
    p = BatchingProblem.from_rho(rho, service="exp", instances=c)
    b = bound_every_size(p)
    t = time.perf_counter()
    g = solve_instances(p, max_states=400_000).optimal.model_cost if exact else None
    print(json.dumps({"lower": b.lower, "upper": b.upper, "ratio": b.ratio, "classes": len(b.classes),
                      "states": b.states, "bound_s": b.solve_time_s, "exact": g, "exact_s": time.perf_counter() - t,
                      "slack": b.slack, "mem_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


def bound(timeout: float) -> None:
    print("every size 1..32 on c instances, exponential batch times, basic l(b) and ζ(b): ĝ* in [lower, upper]")
    print(f"{'c':>2} {'ρ':>4} {'lower':>9} {'upper':>9} {'gap':>7} {'ratio':>5} {'classes':>7} {'states':>7} "
          f"{'bound s':>7} {'peak MB':>7}  exact every size")
    for c in (2, 3, 4):
        for rho in (0.5, 0.7, 0.9):
            try:
                out = subprocess.run([sys.executable, "-c", BOUND, str(c), str(rho), "1" if c == 2 else "0"],
                                     capture_output=True, text=True, timeout=timeout)
                r = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
                    "why": out.stderr.strip().splitlines()[-1]}
            except subprocess.TimeoutExpired:
                r = {"why": f"over {timeout:g} s"}
            if "why" in r:
                print(f"{c:>2} {rho:>4}  {r['why'][:150]}", flush=True)
                continue
            lo, up = r["lower"], r["upper"]
            ex = ("" if r["exact"] is None else f"{r['exact']:.4f} ({r['exact_s']:.1f} s), "
                  f"{100 * (r['exact'] - lo) / (up - lo):.0f} % of the way up")
            print(f"{c:>2} {rho:>4} {lo:>9.4f} {up:>9.4f} {100 * (up - lo) / lo:>6.2f}% {r['ratio']:>5g} "
                  f"{r['classes']:>7} {r['states']:>7} {r['bound_s']:>7.1f} {r['mem_mb']:>7.0f}  {ex}", flush=True)


BUSY_CASES = ((2, "2:1.5:0.8", 0.7, "1,2,4,8"), (3, "2:1.3,3:1.8:1.2", 0.7, "1,2,4,8"),
              (2, "2:1.5:0.8", 0.5, "1,2,4,8,16,32"), (3, "2:1.3,3:1.8:1.2", 0.9, "1,2,4,8"),
              (4, "2:1.5,3:1.9,4:2.3", 0.8, "8,16,32"), (2, None, 0.7, "1,2,4,8,16,32"))


def busy() -> None:
    from smdp_batch.model.problem import BatchingProblem
    from smdp_batch.solvers.multi_pi import solve_instances

    print("exponential batch times, basic l(b) and ζ(b); cost above the optimum (exact, c-server model)")
    print(f"{'c':>2} {'contention':<18} {'ρ':>4} {'sizes':<14} {'table n ↦ b':>12} {'busy-aware':>11} {'solve s':>8}")
    for c, spec, rho, sizes in BUSY_CASES:
        p = BatchingProblem.from_rho(rho, service="exp", batch_sizes=sizes, instances=c, contention=spec)
        with warnings.catch_warnings():  # a truncation that does not converge says so in its row
            warnings.simplefilter("ignore")
            s = solve_instances(p, throw=False)
        o = s.optimal.avg_cost
        b = "not kept" if s.busy_eval is None else f"{100 * (s.busy_eval.avg_cost / o - 1):+.4f} %"
        print(f"{c:>2} {spec or 'none':<18} {rho:>4} {sizes:<14} {100 * (s.table_eval.avg_cost / o - 1):>+10.4f} % "
              f"{b:>11} {s.solve_time_s:>8.2f}{'' if s.converged else '  NOT converged'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--service", default="exp")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--busy", action="store_true", help="busy-aware tables under contention")
    ap.add_argument("--bound", action="store_true", help="every size bracketed on 2, 3 and 4 instances")
    a = ap.parse_args()
    if a.busy:
        return busy()
    if a.bound:
        return bound(a.timeout)
    grid = [(2, "1,2,4,8,16,32"), (4, "1,2,4,8,16,32"), (4, "8,16,32"), (8, "16,32")]
    if a.quick:
        grid = grid[:1]
    print(f"service {a.service}, Bmax 32, l(b) = 0.3051 b + 1.0524 ms (paper 004 basic); ρ per instance")
    print(f"{'c':>2} {'sizes':<15} {'ρ':>4} {'states':>7} {'configs':>7} {'N':>5} {'PI':>3} {'solve s':>8} "
          f"{'peak MB':>8} {'1-server s':>10}  ĝ vs split   note")
    for c, sizes in grid:
        for rho in (0.5, 0.9):
            try:
                out = subprocess.run([sys.executable, "-c", CASE, str(c), str(rho), sizes, a.service],
                                     capture_output=True, text=True, timeout=a.timeout)
                r = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
                    "refused": out.stderr.strip().splitlines()[-1]}
            except subprocess.TimeoutExpired:
                r = {"refused": f"over {a.timeout:g} s"}
            if "states" in r:
                gain = 100 * (1 - r["g"] / r["g_split"])
                print(f"{c:>2} {sizes:<15} {rho:>4} {r['states']:>7} {r['configs']:>7} {r['N']:>5} {r['its']:>3} "
                      f"{r['solve_s']:>8.2f} {r['mem_mb']:>8.0f} {r['one_s']:>10.3f}  {gain:>+6.2f} %    "
                      f"{'converged' if r['converged'] else 'NOT converged'}")
            else:
                print(f"{c:>2} {sizes:<15} {rho:>4} {'—':>7} {'':>7} {'':>5} {'':>3} {'':>8} {'':>8} "
                      f"{r.get('one_s', float('nan')):>10.3f}  {'':>9}   {r['refused'][:150]}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
