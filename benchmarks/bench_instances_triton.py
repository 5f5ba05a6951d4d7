"""Two instances on a real Triton (PyTriton's binary) against the simulator on two instances, same arrival stream.

Triton's ``instance_group { count: 2 }`` with its dynamic batcher feeds two stub instances (each a Python-backend
process whose batch of b sleeps l(b)·scale, paper 004's basic l(b)); the simulator runs the same rule on two
instances sharing one queue, on the very arrival times the client sent.  Two loads (ρ 0.5 and 0.8 per instance),
three settings each: the Triton rule tuned on 2 instances for p99 ≤ 20 ms (``compare --instances 2``'s best
Triton), Triton's default (delay 0) and delay 2 ms with preferred sizes 8/16/32.  Reported: measured and
modelled W̄, p95 and mean batch, and their ratios (the issue's tolerance: W̄ and mean batch within 10 %).

    python benchmarks/bench_instances_triton.py [--scale 50] [--requests 400]

Needs ``pip install -e ".[triton]"``; 127.0.0.1 only; bounded (each run a few hundred requests); about 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from smdp_batch import BatchingProblem
from smdp_batch.analysis.simulate import poisson_arrivals
from smdp_batch.analysis.slo import optimise
from smdp_batch.baselines.servers import triton
from smdp_batch.integrations.loadgen import compare

C = 2


def plan() -> list[tuple]:
    """(ρ, problem on C instances, label, rule) for each run."""
    out = []
    for rho in (0.5, 0.8):
        p = BatchingProblem.basic(rho=rho, instances=C)
        best = optimise(p, {"p99": 20.0}, families=("triton",), requests=100_000, defaults=False).best["triton"]
        rules = [("delay 0 (default)", triton(32, 0)), ("delay 2 ms, preferred 8/16/32", triton(32, 2000, (8, 16, 32)))]
        if best is not None:
            rules.insert(0, (f"tuned on {C} instances, p99 ≤ 20 ms", triton(32, best.knobs["delay_us"])))
        out += [(rho, p, label, rule) for label, rule in rules]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=50.0)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from smdp_batch.integrations.triton import ModelSpec, TritonServer, run_load

    t0 = time.time()
    runs = plan()
    models = {}
    for i, (_, p, _, rule) in enumerate(runs):
        lat = dict(zip(p.batch_sizes, p.latency_ms()))
        models[f"m{i}"] = ModelSpec(rule.maxb, rule.delay * 1000.0, tuple(int(x) for x in rule.pref), lat, instances=C)
    rows = []
    with TritonServer(models, a.scale) as srv:
        for i, (rho, p, label, rule) in enumerate(runs):
            run = run_load(srv, f"m{i}", poisson_arrivals(p.lam, a.requests, np.random.default_rng(a.seed)))
            c = compare(p, rule, run)
            rows.append({"rho": rho, "setting": label, "rule": rule.spec, "errors": run.errors,
                         "measured": c["measured"], "model": c["model"],
                         "ratios": {k: v for k, v in c.items() if k.endswith("ratio")}})
    if a.json:
        print(json.dumps(rows, indent=1, default=float))
        return
    print(f"real Triton, instance_group count {C}, vs the simulator on {C} instances (same arrivals; scale {a.scale:g}, "
          f"{a.requests} requests per run, {time.time() - t0:.0f} s)")
    print(f"  {'ρ':>4} {'setting':<34} {'W̄ meas':>8} {'W̄ model':>8} {'ratio':>6} {'p95 meas':>8} {'p95 model':>9} "
          f"{'batch meas':>10} {'batch model':>11} {'ratio':>6}")
    for r in rows:
        m, s, q = r["measured"], r["model"], r["ratios"]
        print(f"  {r['rho']:>4} {r['setting']:<34} {m['mean_latency_ms']:>8.3f} {s['mean_latency_ms']:>8.3f} "
              f"{q['latency_ratio']:>6.3f} {m['p95_ms']:>8.2f} {s['p95_ms']:>9.2f} {m['mean_batch_size']:>10.2f} "
              f"{s['mean_batch_size']:>11.2f} {q['batch_size_ratio']:>6.3f}"
              + ("" if r["errors"] == 0 else f"  ({r['errors']} errors)"))


if __name__ == "__main__":
    main()
