"""The Autopilot's own CPU cost at 10 000 requests/s: what share of one core its hooks take, against a bare table.

    python benchmarks/bench_autopilot_overhead.py            # 10 s of traffic at 10 000 req/s, best of 3
    python benchmarks/bench_autopilot_overhead.py --w2 0     # the latency-only table: more, smaller batches

The server is paper 004's basic model made five times faster (l(b)/5: Bmax/l(Bmax) = 14.8 requests/ms), so that
λ = 10/ms is a load of ρ = 0.68; the live table is the SMDP optimum there (``solve``, weight ``--w2`` on power).
First a discrete-event run of that table over ``--seconds`` of Poisson traffic records what a batcher would do
(each arrival, each decision epoch with its queue length, each executed batch with its duration l(b)·(1 ± 5 %)
and its requests' response times).  Then the record is replayed through the hooks, as
:class:`~smdp_batch.runtime.DynamicBatcher` calls them: ``observe_arrival(t_ms)`` per request, ``decide(n)``
per epoch, ``observe_batch(b, seconds, ok)`` and ``observe_response(ms_list)`` per batch.  The CPU time of the
replay (``time.thread_time``: this thread only) is taken for

* the Autopilot (every hook),
* a bare :class:`~smdp_batch.runtime.PolicyTable` (``decide`` only: the baseline a static table costs), and
* the replay loop alone (no-op hooks), subtracted from both,

and divided by the seconds of traffic: the share of one core.  The solver is a stub that counts calls (a
stationary stream should start none; any solve would run in its own thread, outside this figure).
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any, Callable

import numpy as np


def problem(lam_per_ms: float, w2: float) -> Any:
    from smdp_batch import BatchingProblem
    from smdp_batch.model.curves import Table

    base = BatchingProblem.basic(rho=0.3)
    fast = tuple(float(x) for x in base.latency_ms() / 5.0)
    return base.replace(lam=lam_per_ms, latency=Table(base.batch_sizes, fast), w2=w2)


def record(p: Any, table: Any, seconds: float, seed: int) -> tuple[list[tuple], dict[str, float]]:
    """The events a batcher following ``table`` sees over ``seconds`` of Poisson traffic (ms clock):
    ("a", t_ms), ("d", n), ("b", b, batch_seconds, response_ms_list)."""
    rng = np.random.default_rng(seed)
    lat = dict(zip(p.batch_sizes, p.latency_ms()))
    horizon = seconds * 1e3
    arrivals = np.cumsum(rng.exponential(1.0 / p.lam, int(p.lam * horizon * 1.1) + 100))
    arrivals = arrivals[arrivals < horizon]
    events: list[tuple] = []
    queue: list[float] = []
    busy_until, running = -1.0, None  # running: (b, seconds, arrival times)
    i, n_arr = 0, arrivals.size
    while i < n_arr or running is not None:
        if running is not None and (i >= n_arr or busy_until <= arrivals[i]):
            now = busy_until
            b, secs, times = running
            events.append(("b", b, secs, [now - t for t in times]))
            running = None
        else:
            now = float(arrivals[i])
            i += 1
            queue.append(now)
            events.append(("a", now))
            if running is not None:
                continue
        events.append(("d", len(queue)))
        b = table.decide(len(queue))
        if b > 0:
            secs = lat[b] * rng.uniform(0.95, 1.05) / 1e3
            running, queue = (b, secs, queue[:b]), queue[b:]
            busy_until = now + secs * 1e3
    sizes = [e[1] for e in events if e[0] == "b"]
    resp = np.concatenate([e[3] for e in events if e[0] == "b"])
    stats = {"arrivals": float(n_arr), "batches": float(len(sizes)), "decisions": float(sum(e[0] == "d" for e in events)),
             "mean_batch": float(np.mean(sizes)), "p99_ms": float(np.percentile(resp, 99))}
    return events, stats


def replay(events: list[tuple], arrival: Callable, decide: Callable, batch: Callable, response: Callable) -> float:
    """CPU seconds (this thread) to call the hooks for every event."""
    t0 = time.thread_time()
    for e in events:
        k = e[0]
        if k == "a":
            arrival(e[1])
        elif k == "d":
            decide(e[1])
        else:
            batch(e[1], e[2], True)
            response(e[3])
    return time.thread_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=10_000.0, help="requests per second (default 10 000)")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds of simulated traffic (default 10)")
    ap.add_argument("--w2", type=float, default=0.05, help="the table's weight on power (default 0.05)")
    ap.add_argument("--repeats", type=int, default=3, help="replays of each kind; the least CPU is reported")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from smdp_batch import solve
    from smdp_batch.runtime import PolicyTable
    from smdp_batch.autopilot import Autopilot, Plan

    p = problem(args.rate / 1e3, args.w2)
    sol = solve(p)
    table = PolicyTable(np.asarray(sol.policy, dtype=np.int64), p.batch_sizes, {"inputs": {"lam": p.lam}})
    ev = sol.deployed
    events, st = record(p, table, args.seconds, args.seed)
    calls: list[Any] = []

    def stub(problem: Any, slo_ms: float, lams: list[float]) -> None:
        calls.append(lams)
        return None

    plan = Plan(table, p.lam, None, ev.mean_latency_ms, st["p99_ms"], ev.mean_power_w)
    slo = max(4 * st["p99_ms"], 10.0)

    def noop(*a: Any) -> None:
        return None

    def configs(pilot: Autopilot) -> dict[str, tuple[Callable, ...]]:
        a, d, b, r = pilot.observe_arrival, pilot.decide, pilot.observe_batch, pilot.observe_response
        return {"loop": (noop, noop, noop, noop), "table": (noop, table.decide, noop, noop),
                "autopilot": (a, d, b, r), "observe_arrival": (a, noop, noop, noop),
                "decide": (noop, d, noop, noop), "observe_batch + observe_response": (noop, noop, b, r)}

    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for name in configs(Autopilot(p, slo, plan, solver=stub)):
            pilot = Autopilot(p, slo, plan, solver=stub)  # a fresh one per replay: the same state each time
            cpu = replay(events, *configs(pilot)[name])
            best[name] = min(best.get(name, float("inf")), cpu)
            if name == "autopilot":
                m = pilot.metrics
    net = {k: max(v - best["loop"], 0.0) for k, v in best.items()}
    table_cpu, pilot_cpu = net["table"], net["autopilot"]
    print(f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}; "
          f"λ = {args.rate:,.0f} req/s for {args.seconds:g} s of simulated traffic (ρ = {p.rho:.2f}), table w2 = {args.w2:g}")
    print(f"traffic: {st['arrivals']:,.0f} arrivals, {st['decisions']:,.0f} decisions, {st['batches']:,.0f} batches "
          f"(mean size {st['mean_batch']:.1f}); solves started {len(calls)} (stub), "
          f"λ̂ {m.lam_hat * 1e3 if m.lam_hat else float('nan'):,.0f} req/s")
    print(f"replay loop alone: {best['loop']:.3f} s CPU (subtracted); best of {args.repeats}")
    for name, cpu in (("bare PolicyTable (decide)", table_cpu), ("Autopilot (all hooks)", pilot_cpu)):
        print(f"{name:26s} {cpu:7.3f} s CPU = {100 * cpu / args.seconds:5.2f} % of one core")
    counts = {"observe_arrival": st["arrivals"], "decide": st["decisions"],
              "observe_batch + observe_response": st["batches"]}
    for name, n in counts.items():
        print(f"  of which {name:34s} {net[name]:6.3f} s CPU ({1e6 * net[name] / n:.2f} µs per call)")
    per = (pilot_cpu - table_cpu) / args.seconds
    print(f"the Autopilot's own share: {100 * per:.2f} % of one core "
          f"({1e6 * (pilot_cpu - table_cpu) / st['arrivals']:.2f} µs per request)")


if __name__ == "__main__":
    main()
