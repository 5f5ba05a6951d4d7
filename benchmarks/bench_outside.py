"""The outside delay learned online against the closed loop alone, on the simulated clock.

    python benchmarks/bench_outside.py                  # 3 seeds (about 3 minutes on 2 cores)
    python benchmarks/bench_outside.py --seeds 0 --steep

A server whose front end slows with load: each response spends, after its batch ends, 2 + Exp(1) ms at λ0,
5 + Exp(2) ms at 2·λ0 and 9 + Exp(3) ms at 3·λ0 (``--steep``: 2 + Exp(1), 6 + Exp(2), 10 + Exp(3.5)), drawn at the
traffic's rate (a :class:`~smdp_batch.model.served.ServedDelay` the simulator serves with).  Paper 004's basic
scenario at ρ 0.2 (λ0), a p99 SLO of 40 ms and four 20 s phases: λ0, 3·λ0, λ0, 2·λ0.  Two Autopilots (the default
solver, a solve taking 1 s of simulated time, at most one every 2 s), both told every response's end-to-end time
(``observe_served``) and no overhead budget:

* ``loop only``: ``learn_outside=False``: the plans model the batcher alone, and the closed loop on the share over
  the SLO shortens the timer by what the server adds;
* ``learned``: told each request's batcher view beside it, it learns the outside delay per load and plans with it
  (:mod:`smdp_batch.autopilot.outside`).

Printed per run: the share of requests over the SLO in each phase, the energy per request (mJ) over the trace and
the ratio learned ÷ loop only on the same arrivals (common random numbers), swaps and rollbacks.  What the simulation
leaves out: the host's CPU (a solve does not slow the batches beside it).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from smdp_batch.autopilot import Autopilot
from smdp_batch.autopilot.simulated import Phase, SimClock, simulate
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.model.served import ServedDelay

SLO_MS = 40.0
PARTS = {"default": ((2.0, 1.0), (5.0, 2.0), (9.0, 3.0)), "steep": ((2.0, 1.0), (6.0, 2.0), (10.0, 3.5))}


def server(lam: float, parts) -> ServedDelay:
    """The simulated server's outside delay at λ0, 2·λ0, 3·λ0 (5 000 draws each, seed 0)."""
    rng = np.random.default_rng(0)
    return ServedDelay(0.0, 0.0, 0.0, tuple(lam * 1e3 * f for f in (1.0, 2.0, 3.0)),
                       tuple(m + rng.exponential(s, 5000) for m, s in parts))


def run(learn: bool, seed: int, true: ServedDelay, p: BatchingProblem) -> dict:
    clock = SimClock()
    ap = Autopilot(p, SLO_MS, clock=clock, solve_in="clock", energy_meter=None, learn_outside=learn,
                   min_interval_s=2.0)
    phases = [Phase(20.0, p.lam), Phase(20.0, 3 * p.lam), Phase(20.0, p.lam), Phase(20.0, 2 * p.lam)]
    sim = simulate(ap, p, phases, seed=seed, clock=clock, served=True, outside_ms=true)
    m = ap.metrics
    return {"over": [r["over_slo"] for r in sim.summary(SLO_MS)], "swaps": m.swaps, "rollbacks": m.rollbacks,
            "mj": float(sim.batch_energy_mj.sum() / sim.batch_size.sum()), "outside_p99": m.outside_p99_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of the arrivals and batch times")
    ap.add_argument("--steep", action="store_true", help="an outside delay that grows faster with load")
    args = ap.parse_args()
    p = BatchingProblem.basic(rho=0.2)
    true = server(p.lam, PARTS["steep" if args.steep else "default"])
    print("outside p99 at λ0, 2λ0, 3λ0 [ms]:", ", ".join(f"{np.percentile(o, 99):.1f}" for o in true.outside_ms))
    print("| seed | Autopilot | over the SLO per phase (λ0, 3λ0, λ0, 2λ0) | mJ/request | learned ÷ loop | swaps | "
          "rollbacks | learned outside p99 at the end [ms] |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in (int(s) for s in args.seeds.split(",")):
        t0 = time.perf_counter()
        base = run(False, seed, true, p)
        new = run(True, seed, true, p)
        for name, r in (("loop only", base), ("learned", new)):
            ratio = f"{new['mj'] / base['mj']:.4f}" if r is new else ""
            print(f"| {seed} | {name} | {' / '.join(f'{100 * x:.2f} %' for x in r['over'])} | {r['mj']:.3f} | {ratio} | "
                  f"{r['swaps']} | {r['rollbacks']} | {r['outside_p99']:.2f} |")
        print(f"  (seed {seed}: {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
