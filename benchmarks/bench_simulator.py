"""Requests simulated per second: smdp-batch's numba simulator vs a straightforward SimPy model.

Both run the paper's basic scenario (deterministic batch times, ρ = 0.7) under the same SMDP table
(w2 = 1.6) and the same arrival times, in this one process.  With deterministic service the two must
produce identical response times, which the script checks before it prints the ratio.  The SimPy model
is what a user would write in an afternoon: one server Resource, an arrival process feeding a
queue, and a dispatcher that applies the table at each completion or arrival to an idle server.

Timings are single-threaded (numba kernel, numpy); ours are the best of --repeat runs.

    python benchmarks/bench_simulator.py                     # 10^7 requests ours, 2·10^5 SimPy
    python benchmarks/bench_simulator.py --requests 2000000 --simpy-requests 100000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy

from smdp_batch import BatchingProblem, solve
from smdp_batch.analysis.simulate import poisson_arrivals, response_times, simulate


def simpy_run(problem: BatchingProblem, table: np.ndarray, arrivals: np.ndarray) -> np.ndarray:
    """Response times (ms) of a SimPy model of the batch server under a table policy (det service)."""
    env = simpy.Environment()
    lat = dict(zip(problem.batch_sizes, problem.latency_ms()))
    top = table.size - 1
    queue: list[float] = []
    resp = np.full(arrivals.size, np.nan)
    state = {"busy": False, "head": 0}
    wake = [env.event()]

    def source():
        last = 0.0
        for t in arrivals:
            yield env.timeout(t - last)
            last = t
            queue.append(t)
            if not state["busy"] and not wake[0].triggered:
                wake[0].succeed()

    def server():
        while True:
            n = len(queue)
            b = int(table[min(n, top)])
            if b == 0:
                wake[0] = env.event()
                yield wake[0]
                continue
            state["busy"] = True
            batch = queue[:b]
            del queue[:b]
            yield env.timeout(lat[b])
            for t in batch:
                resp[state["head"]] = env.now - t
                state["head"] += 1
            state["busy"] = False

    env.process(source())
    env.process(server())
    env.run()
    return resp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--simpy-requests", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs for smdp-batch")
    args = ap.parse_args()

    problem = BatchingProblem.basic(rho=0.7, w2=1.6)
    sol = solve(problem)
    table = np.asarray(sol.policy[: sol.s_max + 1])

    # identical results on identical arrivals (deterministic service)
    arr = poisson_arrivals(problem.lam, args.simpy_requests, np.random.default_rng(args.seed))
    response_times(problem, sol, arr[:1000])  # compile the kernel
    t = time.perf_counter()
    ref = simpy_run(problem, table, arr)
    t_simpy = time.perf_counter() - t
    ours = response_times(problem, sol, arr)
    n_ok = int((~np.isnan(ref)).sum())
    same = np.allclose(ours[:n_ok], ref[:n_ok], rtol=0, atol=1e-9) and int((~np.isnan(ours)).sum()) == n_ok

    def best(f, repeat):
        out = []
        for _ in range(repeat):
            t = time.perf_counter()
            f()
            out.append(time.perf_counter() - t)
        return min(out)

    rng = np.random.default_rng(args.seed)
    # equal work: Poisson arrivals generated and every response time computed (what the SimPy model does)
    t_bare = best(lambda: response_times(problem, sol, poisson_arrivals(problem.lam, args.requests, rng)), args.repeat)
    # the full simulate(): warm-up, batch means, power, p50/p90/p95/p99 and their intervals
    t_full = best(lambda: simulate(problem, sol, requests=args.requests, seed=args.seed), args.repeat)
    big = simulate(problem, sol, requests=args.requests, seed=args.seed)

    rate_simpy = args.simpy_requests / t_simpy
    rate_bare = args.requests / t_bare
    rate_full = args.requests / t_full
    print(f"scenario: paper 004 basic, ρ = 0.7, SMDP table w2 = 1.6 (control limit {sol.control_limit}), det service")
    print(f"identical response times on the {n_ok} shared requests: {same}")
    print(f"{'run':<44}{'requests':>12}{'seconds':>10}{'req/s':>12}{'vs SimPy':>10}")
    print(f"{'SimPy model (response times)':<44}{args.simpy_requests:>12}{t_simpy:>10.3f}{rate_simpy:>12.3g}{1:>9.0f}x")
    print(f"{'smdp-batch response_times (same work)':<44}{args.requests:>12}{t_bare:>10.3f}{rate_bare:>12.3g}"
          f"{rate_bare / rate_simpy:>9.0f}x")
    print(f"{'smdp-batch simulate (with all statistics)':<44}{args.requests:>12}{t_full:>10.3f}{rate_full:>12.3g}"
          f"{rate_full / rate_simpy:>9.0f}x")
    print(f"full run: W̄ = {big.mean_latency_ms:.4f} ± {big.mean_latency_ci:.2g} ms, P̄ = {big.mean_power_w:.4f} W, "
          f"p95 = {big.percentiles['p95_ms']:.3f} ms (paper Table I: 6.90 ms, 44.96 W, 9.96 ms)")


if __name__ == "__main__":
    main()
