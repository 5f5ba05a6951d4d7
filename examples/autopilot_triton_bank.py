"""The Autopilot retiming Triton's own dynamic batcher live, through a bank of loaded delays (127.0.0.1).

    python examples/autopilot_triton_bank.py     # about 40 s with Triton's start-up (a dozen model copies)

Triton reads ``max_queue_delay_microseconds`` when a model loads, and a reload stalls the requests in flight, so
the ONNX MLP is loaded once per delay of a grid (0, then 4 … 40 ms), each copy with Triton's batcher at max batch
32 (:mod:`smdp_batch.integrations.triton_bank`).  The Autopilot runs here, in the client: it plans Triton's rule
(``family="triton"``), and a ``BankRouter`` sends each request to the copy at the largest delay at or below its
timer, telling it each send, each answer's time as this client sees it (so no ``overhead_ms``: the excess over the
plan is learned, ``learn=True``) and each batch the copies ran.  Traffic: Poisson at 100 requests/s for 5 s, then
300/s for 10 s, p99 SLO 50 ms.  The first plan is made on the MLP as this host runs it (timed first with
``smdp-batch measure``'s API, about a second).  Printed: the Autopilot's events, the observed p99 per phase, the requests each
delay served, and the member switches.
"""

from __future__ import annotations

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from examples.autopilot_common import problem, profile_here, why_missed  # noqa: E402
from examples.autopilot_ray import LAM, PHASES, SLO, arrivals  # noqa: E402
from smdp_batch.autopilot import Autopilot, EventLog  # noqa: E402
from smdp_batch.autopilot.control import TimerControl  # noqa: E402
from smdp_batch.integrations.triton_autopilot import AutopilotModelSpec, AutopilotTriton, run_load  # noqa: E402
from smdp_batch.integrations.triton_bank import BankRouter, bank_delays_us, bank_models  # noqa: E402


def main() -> None:
    with profile_here() as here:  # the first plan is made on the MLP as this host runs it
        run(here)


def run(here: str) -> None:
    arr, phase = arrivals(np.random.default_rng(0))
    model = AutopilotModelSpec("examples.autopilot_common:make", {"kind": "none"}, dim=256, out_dim=10,
                               sys_path=(ROOT,))  # (infer, None): the plain model, batched by Triton
    delays = bank_delays_us(4.0, 40.0, 12)
    members = bank_models(model, 32, delays)
    events = EventLog()
    pilot = Autopilot(problem(LAM, profile=here), SLO, min_samples=100, family="triton", learn=True, energy_meter=None,
                      control=TimerControl(target_share=0.005))
    try:
        with AutopilotTriton(members) as srv:
            router = BankRouter(pilot, dict(zip(members, delays)), srv)
            sent, done, sizes, errors = run_load(srv, None, arr, make_input=lambda i: np.zeros(256, np.float32),
                                                 router=router)
            pilot.join(30.0)
            router.poll(force=True)
    finally:
        pilot.close()
        events.close()
    for e in events.lines():
        print("autopilot", {k: e[k] for k in ("event", "reason", "setting", "timer_ms") if k in e})
    lat = (done - sent) * 1e3
    for k, (name, lam, _) in enumerate(PHASES):
        sel = phase == k
        over = float(np.mean(np.nan_to_num(lat[sel], nan=np.inf) > SLO))
        print(f"{name:8s} λ {lam:.2f}/ms: {sel.sum()} requests, observed p99 {np.nanpercentile(lat[sel], 99):.1f} ms "
              f"(SLO {SLO:g} ms), {100 * over:.1f} % over")
        if over > 0.01:  # say why, plainly (the bank's plans are Triton's own batcher: no batcher view of ours)
            mean_batch = sizes[sel & (sizes > 0)].mean()
            print(f"         missed: {why_missed(pilot.metrics, LAM, SLO, 0.0, mean_batch, profile=here)}")
    st, m = router.stats(), pilot.metrics
    used = ", ".join(f"{int(n.rpartition('_')[2]) / 1000:g} ms: {c}" for n, c in st["sent_to"].items())
    print(f"errors {errors}; swaps {m.swaps}, rollbacks {m.rollbacks}, failed solves {m.failed_solves}; "
          f"member switches {st['switches']}; requests per delay: {used}")


if __name__ == "__main__":
    main()
