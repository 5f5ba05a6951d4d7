"""What a change of Triton's batching delay costs while it serves: a model reload through its model-management API.

    python benchmarks/bench_triton_retime.py            # about 40 s on 2 cores

Triton reads ``max_queue_delay_microseconds`` (and the preferred sizes) when a model loads, so an Autopilot could
only retime Triton's own batcher by reloading the model with an edited config.  This measures that reload under
load: Triton (the binary PyTriton ships) in explicit model-control mode on 127.0.0.1, one model whose batch of b
sleeps l(b) = 2 + 0.5·b ms (a GPU-like stand-in: sleeping does not compete for the CPU), Triton's dynamic batcher
at max batch 32, delay 5 ms; open-loop Poisson at ``--rate`` requests/s (default 200) for 16 s, time scale 1.
At 4, 8 and 12 s the delay is set to 10, 5 and 10 ms by :meth:`~smdp_batch.integrations.triton.TritonServer.retime`
(``load_model`` with the edited config).  Printed: each load call's duration; the requests that failed; the
client's p99 and maximum in the second before each change, during its load call and in the second after it,
beside the whole run's (past its first second); and the
median wait of the first request of the batches that were not full (what the delay sets) in the 3 s before and
after each change, which shows when the new delay was in force.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from smdp_batch.analysis.simulate import poisson_arrivals  # noqa: E402
from smdp_batch.integrations.triton import ModelSpec, TritonServer, run_load  # noqa: E402

SIZES = range(1, 33)
CHANGES = ((4.0, 10_000.0), (8.0, 5_000.0), (12.0, 10_000.0))  # (s after the start, new delay µs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s (default 200)")
    ap.add_argument("--seconds", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    lat = {b: 2.0 + 0.5 * b for b in SIZES}
    spec = ModelSpec(32, 5_000.0, (), lat)
    n = int(a.rate * a.seconds)
    arr = poisson_arrivals(a.rate / 1000.0, n, np.random.default_rng(a.seed))
    with TritonServer({"m": spec}, 1.0, model_control="explicit") as srv:
        box: dict = {}
        load = threading.Thread(target=lambda: box.update(run=run_load(srv, "m", arr, max_seconds=a.seconds + 30)))
        t_start = time.perf_counter()
        load.start()
        calls = []
        for at_s, us in CHANGES:
            time.sleep(max(at_s - (time.perf_counter() - t_start), 0.0))
            t_call = (time.perf_counter() - t_start) * 1000.0
            calls.append((at_s, us, t_call, srv.retime("m", us)))
        load.join()
    run = box["run"]
    lat_ms, sent = run.latency_ms, run.arrival_ms
    ok = np.isfinite(lat_ms)
    steady = ok & (sent >= 1000.0)  # past the first second (the model's first batches)
    print(f"{n} requests at {a.rate:g}/s over {a.seconds:g} s; failed: {int((~ok).sum()) + run.errors}; "
          f"p99 {np.percentile(lat_ms[steady], 99):.1f} ms, max {lat_ms[steady].max():.1f} ms after the first second")
    waits = []  # (batch start ms, first request's wait ms) of the batches that were not full
    for k, (b, _) in run.batches.items():
        if b < 32:
            first = float(sent[run.batch_of == k].min())
            waits.append((run.batch_times[k][0], run.batch_times[k][0] - first))
    w = np.array(waits)
    print("| change at | new delay | load call [s] | p99 / max 1 s before [ms] | p99 / max during the call [ms] | "
          "p99 / max 1 s after [ms] | median wait 3 s before → after [ms] |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for at_s, us, t_call, secs in calls:
        end = t_call + secs * 1000.0
        before = ok & (sent >= t_call - 1000.0) & (sent < t_call)
        during = ok & (sent >= t_call) & (sent < end)
        after = ok & (sent >= end) & (sent < end + 1000.0)
        wb = w[(w[:, 0] >= t_call - 3000.0) & (w[:, 0] < t_call), 1]
        wa = w[(w[:, 0] >= t_call + secs * 1000.0) & (w[:, 0] < t_call + secs * 1000.0 + 3000.0), 1]
        cells = [f"{np.percentile(lat_ms[m], 99):.1f} / {lat_ms[m].max():.1f}" for m in (before, during, after)]
        print(f"| {at_s:g} s | {us / 1000:g} ms | {secs:.2f} | {' | '.join(cells)} | {np.median(wb):.1f} → "
              f"{np.median(wa):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
