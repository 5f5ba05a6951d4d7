"""The Autopilot in plain asyncio: ``DynamicBatcher(infer, Autopilot(problem, slo))`` on the ONNX MLP.

    python examples/autopilot_asyncio.py            # about 20 s; 127.0.0.1 is not even needed

It first times the MLP on this host (``smdp-batch measure``'s API, about a second) and plans on that profile: the
shipped one was measured on another machine.  Open-loop Poisson traffic at λ = 0.1 requests/ms (100/s) for 5 s, then 3× that for 10 s.  The Autopilot
starts from the SLO optimiser's table for λ, finds the step, re-solves in a lower-priority child process and swaps; the
script prints each swap (one JSON line on the ``smdp_batch`` logger) and then the metrics and the observed
p99 per phase.  The p99 printed is the client's (submit → result), which includes the hop to the model's thread and
back that the batcher's hooks do not see: ``OVERHEAD_MS`` budgets it (planned with 0 ms, the first phase's client
p99 was 52.3 ms against the 50 ms SLO).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.autopilot_common import make, problem, profile_here, served_speed, why_missed  # noqa: E402

from smdp_batch.runtime import DynamicBatcher  # noqa: E402

LAM, SLO, OVERHEAD_MS = 0.1, 50.0, 5.0


async def phase(batcher, lam_per_ms: float, seconds: float, rng) -> list[float]:
    """Poisson arrivals at lam for ``seconds``; returns the response times (ms) of its requests."""
    times: list[float] = []

    async def one(x):
        t0 = time.perf_counter()
        await batcher.submit(x)
        times.append((time.perf_counter() - t0) * 1e3)

    tasks, t_start, t_next = [], time.perf_counter(), 0.0
    x = np.zeros(256, np.float32)
    while t_next < seconds:
        delay = t_start + t_next - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(x)))
        t_next += rng.exponential(1.0 / (lam_per_ms * 1000.0))
    await asyncio.gather(*tasks)
    return times


async def main() -> None:
    with profile_here() as here:  # the first table is planned on the MLP as this host runs it
        await run(here)


async def run(here: str) -> None:
    infer, pilot = make("autopilot", LAM, SLO, overhead_ms=OVERHEAD_MS, profile=here)
    gc.collect()  # the model and the Autopilot are built: freeze what is alive, so that a full garbage collection
    gc.freeze()  # no longer walks it and stops the event loop (docs/how-to/runtime.md)
    rng = np.random.default_rng(0)
    print(f"start: {pilot.table} at λ {LAM}/ms, planned p99 {pilot.plan.p99_ms:.1f} ms, P̄ {pilot.plan.power_w:.2f} W")

    async def infer_async(items):
        return await asyncio.to_thread(infer, items)

    missed = []
    async with DynamicBatcher(infer_async, pilot) as batcher:
        for name, lam, secs in (("steady", LAM, 5.0), ("3x step", 3 * LAM, 10.0)):
            t = await phase(batcher, lam, secs, rng)
            over = float(np.mean(np.asarray(t) > SLO))  # a p99 SLO holds while at most 1 % of requests are over it
            print(f"{name:8s} λ {lam:.2f}/ms: {len(t)} requests, observed p99 {np.percentile(t, 99):.1f} ms "
                  f"(SLO {SLO:g} ms), {100 * over:.1f} % over it")
            if over > 0.01:
                missed.append(name)
    pilot.join(10.0)
    pilot.close()  # ends the solve process; the table stays
    m = pilot.metrics
    print(f"swaps {m.swaps}, rollbacks {m.rollbacks}, failed solves {m.failed_solves}; "
          f"λ̂ {m.lam_hat if m.lam_hat is not None else math.nan:.3f}/ms; "
          f"live table {m.live_table}: planned at λ {m.planned_lam:.3f}/ms, p99 {m.planned_p99_ms:.1f} ms, "
          f"P̄ {m.planned_power_w:.2f} W; observed p99 of the last responses {m.observed_p99_ms:.1f} ms")
    speed = served_speed(m, problem(LAM, profile=here).latency_ms())  # how fast the model ran while served against the profile measured here
    print(f"served, the model ran at {'?' if speed is None else f'{speed[0]:.2g}–{speed[1]:.2g}'} × its profile "
          "measured here (l̂(b) ÷ l(b), sizes that ran ≥ 5 batches)")
    for name in missed:  # say why, plainly
        print(f"missed in {name}: {why_missed(m, LAM, SLO, OVERHEAD_MS, math.nan, profile=here)}")


if __name__ == "__main__":
    asyncio.run(main())
