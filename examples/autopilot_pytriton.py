"""The Autopilot behind a real Triton (the binary PyTriton ships) on 127.0.0.1.

    python examples/autopilot_pytriton.py       # about 30 s with Triton's start-up

It first times the MLP on this host (``smdp-batch measure``'s API, about a second) and plans the first table on that
profile, as ``examples/autopilot_asyncio.py`` does.  Triton's own dynamic batcher is off: the model (decoupled, ``async def execute``) takes single requests and
puts them into one DynamicBatcher whose table is an Autopilot, built in Triton's Python-backend process by
``examples.autopilot_common:make`` (see :mod:`smdp_batch.integrations.triton_autopilot` for why).  The client
streams Poisson traffic over gRPC: λ = 0.1 requests/ms (100/s) for 5 s, then 3× that for 10 s.  Printed: the
Autopilot's events (swaps), its metrics, and the observed p99 per phase as the client sees it.  The client's
time beyond the batcher's view (gRPC, Triton's front end, the Python backend's hand-offs: 5-6 ms here) is budgeted
as ``OVERHEAD_MS``; planned with 0 ms, the client's p99 was 56.0 / 54.5 ms against the 50 ms SLO.
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from examples.autopilot_common import profile_here, why_missed  # noqa: E402
from examples.autopilot_ray import LAM, PHASES, SLO, arrivals  # noqa: E402

OVERHEAD_MS = 10.0
from smdp_batch.integrations.triton_autopilot import AutopilotModelSpec, AutopilotTriton, run_load  # noqa: E402


def main() -> None:
    with profile_here() as here:  # the first plan is made on the MLP as this host runs it
        run(here)


def run(here: str) -> None:
    arr, phase = arrivals(np.random.default_rng(0))
    spec = AutopilotModelSpec("examples.autopilot_common:make", {"kind": "autopilot", "lam": LAM, "slo_p99_ms": SLO,
                                                                "overhead_ms": OVERHEAD_MS, "profile": here},
                              dim=256, out_dim=10, sys_path=(ROOT,))
    with AutopilotTriton({"onnx": spec}) as srv:
        sent, done, sizes, errors = run_load(srv, "onnx", arr, make_input=lambda i: np.zeros(256, np.float32))
        m = None
        for _ in range(150):  # wait for a solve in flight (the model writes its metrics every 0.2 s)
            m = srv.metrics("onnx")
            if m is not None and m["solves"] == m["swaps"] + m["failed_solves"] + m["infeasible"]:
                break
            time.sleep(0.2)
    assert m is not None
    for e in m["events"]:
        print("autopilot", e)
    lat = (done - sent) * 1e3
    for k, (name, lam, _) in enumerate(PHASES):
        sel = phase == k
        over, mean_batch = float(np.mean(np.nan_to_num(lat[sel], nan=np.inf) > SLO)), sizes[sel & (sizes > 0)].mean()
        print(f"{name:8s} λ {lam:.2f}/ms: {sel.sum()} requests, observed p99 {np.nanpercentile(lat[sel], 99):.1f} ms "
              f"(SLO {SLO:g} ms), {100 * over:.1f} % over, mean batch {mean_batch:.2f}")
        if over > 0.01:  # say why, plainly
            print(f"         missed: {why_missed(m, LAM, SLO, OVERHEAD_MS, mean_batch, profile=here)}")
    print(f"errors {errors}; swaps {m['swaps']}, rollbacks {m['rollbacks']}, failed solves {m['failed_solves']}; "
          f"λ̂ {m['lam_hat'] if m['lam_hat'] is not None else math.nan:.3f}/ms; live table {m['live_table']}: "
          f"planned at λ {m['planned_lam']:.3f}/ms, "
          f"p99 {m['planned_p99_ms']:.1f} ms, P̄ {m['planned_power_w']:.2f} W; the model's observed p99 "
          f"{m['observed_p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
