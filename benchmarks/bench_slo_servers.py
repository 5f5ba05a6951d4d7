"""Exported settings with a p99 SLO and a load range, run on the real Triton and Ray Serve (127.0.0.1).

    python benchmarks/bench_slo_servers.py       # basic scenario, ρ 0.2..0.6, p99 ≤ 20 ms (≈ 3 min, 2 cores)

The Triton config (preferred sizes + max_queue_delay) and the Ray Serve @serve.batch setting are what
``export --to triton|ray --slo-p99-ms 18 --load-range LO:HI`` writes (the plan keeps 10 % of the 20 ms bound
for the servers' own time); each runs 400 Poisson requests at the low, middle and high load, time scale 50.
"""

from __future__ import annotations

import sys

from smdp_batch.analysis.slo import load_grid
from smdp_batch.integrations.slo_check import check_exports
from smdp_batch.model.problem import BatchingProblem

SLO = 20.0


def main() -> int:
    p = BatchingProblem.basic(rho=0.6)
    lams = load_grid(p, p.lam / 3, p.lam)
    rows = check_exports(p, SLO, lams)
    print(f"| server | setting | load [req/s] | answered | p99 measured [ms] | p99 model, same stream | p99 planned | "
          f"P̄ measured [W] | P̄ model | meets p99 ≤ {SLO:g} ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for r in rows:
        if r["setting"] is None:
            print(f"| {r['target']} | no setting meets the SLO | | | | | | | | |")
            bad += 1
            continue
        bad += not r["meets_slo"]
        print(f"| {r['target']} | `{r['setting']}` | {r['load_per_s']:.0f} | {r['answered']}/{r['requests']} | "
              f"{r['p99_ms']:.2f} | {r['p99_model_ms']:.2f} | {r['p99_planned_ms']:.2f} | {r['mean_power_w']:.2f} | "
              f"{r['mean_power_model_w']:.2f} | {'yes' if r['meets_slo'] else 'NO'} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
