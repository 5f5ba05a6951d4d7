"""Several instances at a p99 SLO: the least power each setting needs, all simulated alike on the c instances.

Scenario: paper 004's basic l(b) and ζ(b), fixed (det) batch times, every size 1..32, c = 2 and 4 instances
sharing one queue, ρ per instance 0.5 and 0.8, p99 ≤ the SLO.  For each setting the SLO optimiser
(``compare --instances c``) finds the knob of least power whose p99 plus its 95 % half-width meets the SLO, on one
seeded Poisson stream (``--requests`` per load):

* table + timer: the SMDP tables (the c-server SMDP's w2 front, on the finest model that solves within its limits,
  and the one-instance tables at λ/c) with a timer, and Triton's forms, which are members of it;
* Triton tuned (max_queue_delay; with preferred sizes), TF-Serving tuned, Ray Serve's replicas tuned;
* split: c queues, each with its own table + timer tuned at λ/c (the power of c of them);
* Triton's default (max_queue_delay 0).

``--contention K:S[:E],…`` runs the table on instances that slow each other down (every batch S× as long
while K are busy; ρ then counts the slowdown at c busy).  The split row is then not priced (c queues on one
device contend too, which a one-instance model leaves out); Ray Serve's replicas contend like the instances.

``--figure PATH`` also draws the least power (table + timer) against the total load for c = 1..4 at the SLO, with
an idle power per instance (``--idle-w``, charged by the simulator for the time each instance runs no batch).

    python benchmarks/bench_instances_slo.py [--requests 200000] [--figure docs/images/instances_power.png]
    python benchmarks/bench_instances_slo.py --contention 2:1.5,3:1.9,4:2.3
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from smdp_batch.analysis.slo import optimise
from smdp_batch.model.problem import BatchingProblem

ROWS = (("table+timer", "table + timer (smdp-batch)"), ("triton", "Triton tuned"),
        ("triton-preferred", "Triton tuned, preferred sizes"), ("tfserving", "TF-Serving tuned"),
        ("ray", "Ray Serve replicas tuned"))


def _power(s) -> str:
    return "—" if s is None else f"{s.power_w:.2f}"


def table(requests: int, slos: dict, contention: str | None = None) -> None:
    print(f"least power (W) meeting p99 ≤ SLO; basic l(b), ζ(b), det, sizes 1..32; {requests} requests per load, seed 0"
          + (f"; contention {contention}" if contention else ""))
    for c in (2, 4):
        for rho in (0.5, 0.8):
            p = BatchingProblem.from_rho(rho, instances=c, contention=contention)
            slo = {"p99": slos[rho]}
            t0 = time.perf_counter()
            a = optimise(p, slo, requests=requests, seed=0)
            split = None
            if not contention:
                half = p.replace(instances=1, lam=p.lam / c)
                s = optimise(half, slo, families=("table+timer",), requests=requests, seed=0, defaults=False)
                split = s.best["table+timer"]
            tt = a.best["table+timer"]
            print(f"\n  c = {c}, ρ {rho} per instance ({p.lam * 1e3:.0f} req/s), p99 ≤ {slos[rho]:g} ms "
                  f"({time.perf_counter() - t0:.0f} s)")
            for fam, name in ROWS:
                if fam not in a.best:
                    print(f"    {name:<32} {'not simulated with contention':>30}")
                    continue
                b = a.best.get(fam)
                gap = "" if b is None or tt is None else f"{100 * (b.power_w / tt.power_w - 1):+6.2f} %"
                spec = "" if b is None else b.spec
                print(f"    {name:<32} {_power(b):>8} ± {0 if b is None else b.power_ci:.2f}  {gap:>9}   {spec}")
            sp = None if split is None else c * split.power_w
            gap = "" if sp is None or tt is None else f"{100 * (sp / tt.power_w - 1):+6.2f} %"
            if contention:
                print(f"    {'split: ' + str(c) + ' queues, each tuned':<32} {'not priced (queues contend)':>30}")
            else:
                print(f"    {'split: ' + str(c) + ' queues, each tuned':<32} {'—' if sp is None else f'{sp:.2f}':>8}"
                      f"          {gap:>9}   {'' if split is None else split.spec}")
            d = next((x for x in a.defaults if x.spec.startswith("triton:") and "delay_us=0" in x.spec), None)
            if d is not None:
                dp = float(np.mean([x.power_w for x in d.loads]))
                ok = "" if d.meets else " (breaks the SLO)"
                print(f"    {'Triton default (delay 0)':<32} {dp:>8.2f}          "
                      f"{'' if tt is None else f'{100 * (dp / tt.power_w - 1):+6.2f} %':>9}{ok}")


def figure(path: str, requests: int, slo_ms: float, idle_w: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = BatchingProblem.from_rho(0.5)
    top = 0.85 * base.max_lam  # 85 % of what one instance can carry
    loads = np.linspace(0.15, 3.4, 8) * top
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for c in (1, 2, 3, 4):
        xs, ys = [], []
        for lam in loads:
            if lam >= 0.95 * c * base.max_lam:
                continue
            p = base.replace(instances=c, lam=float(lam))
            a = optimise(p, {"p99": slo_ms}, families=("table+timer",), requests=requests, seed=0, defaults=False,
                         idle_power_w=idle_w)
            s = a.best["table+timer"]
            if s is None:
                continue
            xs.append(lam * 1e3)
            ys.append(s.power_w)
        ax.plot(xs, ys, marker="o", label=f"{c} instance{'s' if c > 1 else ''}")
        print(f"  c = {c}: " + ", ".join(f"{x:.0f} req/s {y:.1f} W" for x, y in zip(xs, ys)))
    ax.set_xlabel("total load (requests/s)")
    ax.set_ylabel("least power meeting the SLO (W)")
    ax.set_title(f"Least power with p99 ≤ {slo_ms:g} ms: table + timer on c instances\n"
                 f"(paper 004 basic model, fixed batch times, idle {idle_w:g} W per instance)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="instances sharing one queue")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"  figure written to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--figure", default=None, help="also draw power against load for c = 1..4 into this PNG")
    ap.add_argument("--slo-ms", type=float, default=20.0, help="the figure's p99 SLO (ms)")
    ap.add_argument("--idle-w", type=float, default=20.0, help="the figure's idle power per instance (W)")
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--contention", default=None, help="K:S[:E],… for K = 2..4: instances that slow each other")
    a = ap.parse_args()
    if not a.no_table:
        table(a.requests, {0.5: 10.0, 0.8: 20.0}, a.contention)
    if a.figure:
        figure(a.figure, a.requests, a.slo_ms, a.idle_w)


if __name__ == "__main__":
    main()
