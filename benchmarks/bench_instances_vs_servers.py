"""Two instances sharing one queue: the c-server table against what users run today, all simulated alike.

Scenario: paper 004's basic l(b) and ζ(b), exponential batch times (the c-server model is exact for them), table
sizes 1,2,4,8,16,32, 2 instances, ρ per instance 0.5 / 0.7 / 0.9, w1 = w2 = 1.  Each setting is simulated on
the same Poisson stream (``--requests``, seed 0) by the event simulator on 2 instances sharing the queue:

* the c-server table (``solve --instances 2``);
* splitting the load over 2 queues, each with its own optimal one-instance table (simulated at λ/2);
* the one-instance table solved at λ/2, run on both instances behind the shared queue;
* Triton (max_batch_size 32) with the max_queue_delay of least objective on a 12-point grid, and its default
  (delay 0): forming any size (l(b) and ζ(b) of the same curves), and padding each batch to 1,2,4,…,32 as a
  model with those TensorRT profiles must.

``--all-sizes`` instead solves the c-server table with every size 1..32 (``solve --instances 2 --max-states``: 108 273
states at ρ 0.5 and 0.7, 5–6 s and 0.4 GB each) and puts it beside Triton forming any size
with its delay tuned on a finer grid (the 12 points and 0, 0.125, …, 6 ms), both simulated on the same stream.

    python benchmarks/bench_instances_vs_servers.py [--requests 200000] [--all-sizes]
"""

from __future__ import annotations

import argparse

import numpy as np

from smdp_batch.analysis.compare import timeout_delays
from smdp_batch.analysis.simulate import simulate
from smdp_batch.baselines.servers import triton
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers.multi_pi import solve_instances


def _row(name: str, w: float, p: float, p99: float, best: float) -> str:
    return f"    {name:<34} {w + p:>8.3f} {w:>8.3f} {p:>8.3f} {p99:>8.2f}   {100 * ((w + p) / best - 1):>+6.2f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--all-sizes", action="store_true", help="the c-server table with every size 1..32 (ρ 0.5, 0.7)")
    a = ap.parse_args()
    if a.all_sizes:
        return all_sizes(a.requests)
    c = 2
    print(f"{c} instances, exponential batch times, basic l(b) and ζ(b), {a.requests} simulated requests, seed 0")
    print(f"    {'setting':<34} {'w1W̄+w2P̄':>8} {'W̄ ms':>8} {'P̄ W':>8} {'p99 ms':>8}   vs c-server table")
    for rho in (0.5, 0.7, 0.9):
        p = BatchingProblem.from_rho(rho, service="exp", batch_sizes="1,2,4,8,16,32", instances=c)
        half = p.replace(instances=1, lam=p.lam / c)
        sol = solve_instances(p)
        one = solve_instances(half)
        rows = []
        s = simulate(p, np.asarray(sol.table), requests=a.requests, seed=0)
        rows.append(("c-server table, shared queue", s.mean_latency_ms, s.mean_power_w, s.percentiles["p99_ms"]))
        s = simulate(half, np.asarray(one.table), requests=a.requests, seed=0)
        rows.append((f"split: {c} queues, own tables", s.mean_latency_ms, c * s.mean_power_w, s.percentiles["p99_ms"]))
        s = simulate(p, np.asarray(one.table), requests=a.requests, seed=0)
        rows.append(("1-instance table, shared queue", s.mean_latency_ms, s.mean_power_w, s.percentiles["p99_ms"]))
        full = p.replace(batch_sizes=tuple(range(1, 33)))  # Triton forms any size ≤ max_batch_size
        for name, prob, pad in (("any size", full, ()), ("padded to 1,2,4,…", p, (1, 2, 4, 8, 16, 32))):
            tri = []
            for d in timeout_delays(p):
                s = simulate(prob, triton(32, d * 1000.0, pad=pad), requests=a.requests, seed=0)
                tri.append((s.mean_latency_ms + s.mean_power_w, d, s))
            _, d, s = min(tri, key=lambda x: x[0])
            rows.append((f"Triton tuned, {name} ({d * 1000:.0f} µs)", s.mean_latency_ms, s.mean_power_w,
                         s.percentiles["p99_ms"]))
            s = tri[0][2]
            rows.append((f"Triton default, {name}", s.mean_latency_ms, s.mean_power_w, s.percentiles["p99_ms"]))
        best = rows[0][1] + rows[0][2]
        print(f"  ρ = {rho} per instance (λ = {p.lam * 1e3:.0f} req/s); exact ĝ of the c-server table "
              f"{sol.table_eval.avg_cost:.3f}")
        for r in rows:
            print(_row(*r, best))


def all_sizes(requests: int) -> None:
    """The c-server table on every size 1..32 against Triton forming any size, its delay tuned on a finer grid."""
    print(f"2 instances, exponential batch times, basic l(b) and ζ(b), every size 1..32, {requests} simulated "
          "requests, seed 0")
    print(f"    {'setting':<34} {'w1W̄+w2P̄':>8} {'W̄ ms':>8} {'P̄ W':>8} {'p99 ms':>8}   vs c-server table")
    for rho in (0.5, 0.7):
        p = BatchingProblem.from_rho(rho, service="exp", instances=2)
        sol = solve_instances(p, max_states=400_000)
        s = simulate(p, np.asarray(sol.table), requests=requests, seed=0)
        rows = [("c-server table, sizes 1..32", s.mean_latency_ms, s.mean_power_w, s.percentiles["p99_ms"])]
        tri = []
        for d in sorted(set(timeout_delays(p)) | {0.125 * k for k in range(49)}):
            s = simulate(p, triton(32, d * 1000.0), requests=requests, seed=0)
            tri.append((s.mean_latency_ms + s.mean_power_w, d, s))
        _, d, s = min(tri, key=lambda x: x[0])
        rows.append((f"Triton tuned, {len(tri)} delays ({d * 1000:.0f} µs)", s.mean_latency_ms, s.mean_power_w,
                     s.percentiles["p99_ms"]))
        print(f"  ρ = {rho} per instance (λ = {p.lam * 1e3:.0f} req/s); {sol.states} states, solved in "
              f"{sol.solve_time_s:.0f} s; exact ĝ of the c-server table {sol.table_eval.avg_cost:.3f}")
        best = rows[0][1] + rows[0][2]
        for r in rows:
            print(_row(*r, best))


if __name__ == "__main__":
    main()
