"""The Autopilot against static settings on real servers: the ONNX MLP behind Ray Serve and behind Triton
(the binary PyTriton ships), 127.0.0.1 only, a scripted load trace of five phases.

    python benchmarks/bench_autopilot.py --servers triton --lam 0.05 --phase-seconds 20   # ≈ 7 min on 2 cores
    python benchmarks/bench_autopilot.py --servers ray --lam 0.03                          # ≈ 5 min
    python benchmarks/bench_autopilot.py --model light --lam 0.1 --servers triton           # the 0.7-2 ms model
    python benchmarks/bench_autopilot.py --simulated --lam 0.05 --phase-seconds 20 --repeats 3  # ≈ 1 min, no server
    python benchmarks/bench_autopilot.py --servers triton --model standin --phase-seconds 20 --seed 0 \
        --only "autopilot on Triton's batcher" --static-delays 22,25,28,31 --json s0.json   # ≈ 9 min
    python benchmarks/bench_autopilot.py --servers ray --model standin --lam 0.05 --phase-seconds 20 --overhead-ms 15 \
        --only "autopilot on Ray's batcher" --static-delays 24,28,32,36 --seed 0 --json r0.json   # ≈ 10 min
    python benchmarks/bench_autopilot.py --combine s0.json s1.json s2.json   # the best static in hindsight
    python benchmarks/bench_autopilot.py --servers triton --model standin --stationary --phase-seconds 12 \
        --only "autopilot on Triton's batcher"   # 60 s of stationary traffic: does it re-solve for the service?

The trace (open-loop Poisson at λ0 requests/ms, ``--lam``, default 0.1): 1 steady λ0; 2 a 3× step up; 3 a
linear ramp from 3λ0 down to 0.2λ0; 4 λ0 with a 1.5× service slowdown (every batch sleeps half its own
duration after running, switched on and off from outside the server by a file); 5 steady λ0 again.  p99 SLO
50 ms.  The model (``--model``): ``heavy`` (default) runs the MLP four times per batch, 7-24 ms a batch
in its profile (``benchmarks/data/onnx_mlp_x4_cpu.csv``, measured on a busier day: alone on a quiet host it now
takes 1.6-14 ms, and served by Triton beside the client 3.3-22 ms, what the Autopilot learns), so that the
slowdown moves the tail; ``light`` runs it once, 0.7-2 ms (``onnx_mlp_cpu.csv``), where a 1.5× slowdown changes
nothing a 50 ms SLO cares about; ``standin`` is the GPU-like stand-in, a batch that sleeps l(b) = 2 + 0.5·b ms
(sleeping does not compete for the CPU, as a GPU would not; ζ(b) = 60 W × l(b)).

Four settings per server, each on the same arrival times, each planning p99 ≤ SLO − ``--overhead-ms``
(default 15 ms: the client's and the transport's share, measured here as client p99 − server p99):

* ``autopilot`` — an Autopilot (SLO optimiser, family smdp) started at λ0, ``min_samples`` 100,
  ``overhead_ms`` as above, its solves in a lower-priority child process;
* ``autopilot on Ray's batcher`` (Ray only) — the same, planning Ray's own ``serve.batch`` (``family="ray"``) and
  setting its ``batch_wait_timeout_s`` live (``autopilot_deployment(live_knobs=True)``); ``autopilot on Ray's batcher open loop``, only
  when ``--only`` names it: the same without its closed loop (``control=False``); ``autopilot on Ray's batcher
  told the client``, only when named: the same, told the client's response times every 0.25 s
  (``observe_client``), with no ``overhead_ms`` and the excess learned (``learn=True``); ``autopilot on Ray's batcher
  with the served model``, only when named, with ``--served FILE``: told the client's times, planning with the served-delay
  model that ``smdp-batch calibrate`` measured at three loads (the outside delay of the load planned for), no budget;
* ``autopilot on Triton's batcher`` (Triton only) — an Autopilot in the client planning Triton's own batcher
  (``family="triton"``), retimed live through a bank (:mod:`smdp_batch.integrations.triton_bank`): the model loaded
  at 0 ms and ``--bank`` lo:hi:count delays (default 8:48:16, a ratio of 1.14), each request sent to the member
  at the largest delay at or below the timer in force; it is told the client's own response times, so it plans
  with no ``overhead_ms`` and learns the excess (``learn=True``), and its closed loop holds the share over the SLO
  near half the 1 % a p99 allows (``TimerControl(target_share=0.005)``: a phase's transients stay within it;
  ``--bank-loop full``: at 1 %, ``off``: no loop);
* ``tuned server`` — the server's own batcher with the setting the SLO optimiser tunes for phase 1
  (``smdp-batch export --slo-p99-ms``): Ray's ``serve.batch`` batch_wait_timeout_s, Triton's
  max_queue_delay_microseconds, both with max batch 32;
* ``tuned server over the loads`` (Triton only) — Triton's batcher with the one delay the SLO optimiser tunes for
  every load of the trace at once (0.2, 1 and 3 × λ0, as ``export --load-range`` does): the static setting
  tuned for the whole trace's traffic;
* ``Triton at X ms`` (Triton and ``--simulated``, ``--static-delays X,Y,…``) — Triton's batcher at max batch 32 and
  each fixed delay of the grid, and ``Ray at X ms`` (Ray and ``--simulated``: ``simulate_ray``) Ray's ``serve.batch``
  at max batch 32 and that ``batch_wait_timeout_s``: the static settings to find the best one in hindsight, the least energy over the trace
  among those within 1 % over the SLO in every phase, against each Autopilot setting of the run (printed after the
  tables; over several runs' ``--json`` files with ``--combine``, for each server the files share);
* ``λ-bank`` — an AdaptivePolicy over SLO tables solved at 0.2, 0.35, 0.6, 1, 1.7 and 3 × λ0;
* ``static table`` — the Autopilot's first table (solved for λ0), never re-solved.

The settings run one after another on the same arrival times; their order rotates with ``--seed`` (seed s starts with
the (s mod count)-th): the first to run meets a host and a server that have served nothing yet (in six runs on Ray
Serve the Autopilot, always first, went 0.3-8 % over in phase 1, the fixed timeouts after it 0.3-3 %: the order is
not to decide which wins).

Per phase (a request belongs to the phase it arrived in; a batch to the phase it started in): the client's
p99 (ms) with a distribution-free 95 % interval (order statistics; a phase of 500 requests pins its p99
only loosely), the share of requests over the SLO (and, for an Autopilot, of those sent once it had acted on the
phase's change: after its first swap or kept plan in phases 2-5), the server's p99 (entered → answered in the model: for
Triton's own batcher the model does not see the queue, so NaN), the mean batch size, and the modelled energy
per request: ζ(b) of the CPU profile (constant 60 W × latency) at the profile size a batch of b pads up to,
× 1.5 in phase 4 (the slowdown runs the CPU 1.5× as long); and the client's own stops, which land in its
p99s as if the server had taken them: the p99 of its lag behind the send schedule, and its full garbage
collections (count and longest).  ``--gc freeze`` (the default) freezes this process's heap while each
setting's load runs (``gc.freeze()``: ray's, numba's and the package's objects are then left out of every
collection), as Ray Serve's replicas freeze theirs; ``--gc default`` leaves Python's collector alone (the load
generator's freeze included: ``SMDP_BATCH_LOADGEN_FREEZE_GC=0``).

``--simulated`` runs the same trace and settings in the simulator (:mod:`smdp_batch.autopilot.simulated`), on a
simulated clock, ``--repeats`` seeds: one instance whose batches take the profile's l(b) (the service law of the
problem: deterministic) × 1.5 in phase 4, each response ``--sim-outside-ms`` more (the server's and the client's
own time; with ``--served FILE``, what that calibration measured instead: l(b) as served, a + c·b per batch, the
return per position and the outside delay of the load), each Autopilot solve ``--sim-solve-seconds`` of simulated time; beside the four settings, the
Autopilot without its closed loop (``control=False``), the Autopilot on Triton's batcher (its plans Triton's
rule run as a table + timer, told the end-to-end times as the bank's client is), and the Autopilot on Ray's
batcher (``simulate_ray`` with the Autopilot setting the timeout live, as ``live_knobs=True`` does: planning p99 ≤
SLO − ``--overhead-ms``; with ``--served``, also ``with the served model``: planning with that calibration, no
budget, told the end-to-end times, as the real setting of that name).  The tuned server rule is Triton's
batcher there: serve 32 at once, else everything waiting once the oldest has waited the tuned delay, padded up to
the next profiled size (``short_batch="pad-up"``).  No server,
no CPU contention: what the ranking of the settings owes to the model and the traffic alone.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")  # Ray's workers import examples.*
from examples.autopilot_common import HEAVY, SIZES, STANDIN, make, problem  # noqa: E402

SLO = 50.0
OVERHEAD = {"ms": 15.0}  # --overhead-ms: every setting plans p99 ≤ SLO − this (the transport's share)
SERVED = {"path": None}  # --served: smdp-batch calibrate's file, for "autopilot on Ray's batcher with the served model"
LAM0 = {"per_ms": 0.1}  # --lam: λ0, requests/ms
ORDER = {"first": 0}  # --seed: which setting runs first on a real server (the order rotates: module doc)
MODEL = {"repeat": HEAVY}  # --model heavy (the MLP 4× per batch: 7-24 ms), light (1×: 0.7-2 ms) or standin (a sleep)
SETTINGS = ["autopilot", "autopilot on Ray's batcher", "autopilot on Triton's batcher", "tuned server",
            "tuned server over the loads", "λ-bank",
            "static table",
            "autopilot on Ray's batcher open loop", "autopilot on Ray's batcher told the client",
            "autopilot on Ray's batcher with the served model"]  # --only picks
EXTRA = SETTINGS[-3:]  # run only when --only names them
RAY_SETTINGS = [s for s in SETTINGS if s not in ("autopilot on Triton's batcher", "tuned server over the loads")]
FIXED: dict[str, float] = {}  # --static-delays: setting "Triton at X ms" / "Ray at X ms" → X, that server's own
# batcher at that fixed delay (Triton's max_queue_delay, Ray's batch_wait_timeout_s)
STATIC_PREFIX = {"triton": "Triton at ", "ray": "Ray at "}  # the fixed-delay settings of each server
BANK = {"lo_ms": 8.0, "hi_ms": 48.0, "count": 16, "loop": "half"}  # --bank: the delay grid of Triton's bank (0 and a
# geometric run); --bank-loop: its closed loop (BANK_LOOP)


def _loop(share: float | None):
    from smdp_batch.autopilot.control import TimerControl

    return lambda: False if share is None else TimerControl(target_share=share)


BANK_LOOP = {"half": _loop(0.005), "full": _loop(0.01), "off": _loop(None)}  # aiming at 0.5 % or 1 % over, or none
KIND = {"autopilot": "autopilot", "autopilot on Ray's batcher": "autopilot-ray",
        "autopilot on Triton's batcher": "autopilot-triton", "tuned server": "none", "tuned server over the loads": "none",
        "λ-bank": "bank",
        "static table": "static", "autopilot on Ray's batcher open loop": "autopilot-ray-open",
        "autopilot on Ray's batcher told the client": "autopilot-ray-client",
        "autopilot on Ray's batcher with the served model": "autopilot-ray-served"}
PHASES = ["1 steady", "2 step 3×", "3 ramp → 0.2×", "4 slow 1.5×", "5 steady"]
RATES = [(1, 1), (3, 3), (3, 0.2), (1, 1), (1, 1)]  # × λ0 at each phase's start and end
SLOW = {"phase": 3}  # the phase whose batches run 1.5× as long (None: --stationary)
SIM_SETTINGS = ["autopilot", "autopilot, open loop", "autopilot on Triton's batcher", "autopilot on Ray's batcher",
                "autopilot on Ray's batcher with the served model", "tuned server", "λ-bank",
                "static table"]  # --simulated (the served model's only with --served)


def gc_option(ap: argparse.ArgumentParser) -> None:
    """``--gc``, for both Autopilot benchmarks (:func:`use_gc` applies it)."""
    ap.add_argument("--gc", choices=("freeze", "default"), default="freeze", help="freeze (default): this process's "
                    "heap is frozen while each setting's load runs (the load generator's frozen_heap), so that a full "
                    "garbage collection no longer walks the libraries' objects and stops the client and its event "
                    "loop (33-45 ms with ray's; likely the 0.1-0.2 s stops seen with torch); default: Python's "
                    "collector untouched")


def use_gc(mode: str) -> None:
    """``--gc default``: the load generator leaves the collector alone (``loadgen.FREEZE_ENV``); ``freeze``: as it is."""
    from smdp_batch.integrations.loadgen import FREEZE_ENV

    if mode == "default":
        os.environ[FREEZE_ENV] = "0"


class FullCollections:
    """Python's full (generation-2) garbage collections in this process while open (``with``): ``pauses``, each
    (``time.time()`` s at its end, ms).  Each one stops the whole process, the client and whatever else runs in
    it; with a large heap (ray, numba, torch) for 0.05-0.2 s, in whichever phase it falls.  While open, the heap is
    frozen (:func:`smdp_batch.integrations.loadgen.frozen_heap`; not with ``--gc default``)."""

    def __init__(self):
        from smdp_batch.integrations.loadgen import frozen_heap

        self.pauses: list[tuple[float, float]] = []
        self._began = 0.0
        self._frozen = frozen_heap()

    def _on(self, what: str, info: dict) -> None:
        if what == "start":
            self._began = time.perf_counter()
        elif info["generation"] == 2:
            self.pauses.append((time.time(), (time.perf_counter() - self._began) * 1e3))

    def __enter__(self) -> FullCollections:
        self._frozen.__enter__()  # what is alive now (libraries, model, trace) is left out of every collection
        gc.callbacks.append(self._on)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on)
        self._frozen.__exit__(*exc)

    def within(self, t_lo: float, t_hi: float) -> list[float]:
        """The pauses (ms) that ended in [t_lo, t_hi) (``time.time()`` s)."""
        return [ms for t, ms in self.pauses if t_lo <= t < t_hi]


def trace(seconds: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (ms) and phase index per request; the ramp by inverting its cumulative rate."""
    T = seconds * 1000.0
    out, ph = [], []
    for k, (a, b) in enumerate(RATES):
        la, lb = a * LAM0["per_ms"], b * LAM0["per_ms"]
        n = rng.poisson(0.5 * (la + lb) * T)
        u = np.sort(rng.uniform(0.0, 0.5 * (la + lb) * T, n))  # cumulative intensity Λ(t) = la t + (lb-la) t²/2T
        if la == lb:
            t = u / la
        else:
            c = (lb - la) / (2 * T)
            t = (-la + np.sqrt(la * la + 4 * c * u)) / (2 * c)
        out.append(k * T + t)
        ph.append(np.full(n, k))
    return np.concatenate(out), np.concatenate(ph)


TRACE_LOADS = (0.2, 1.0, 3.0)  # × λ0: the loads of the trace, for the server rule tuned over all of them


def tuned(family: str, loads=(1.0,)) -> dict:
    """The server's batcher tuned by the SLO optimiser for p99 ≤ SLO − overhead at λ0 × each of ``loads``."""
    from smdp_batch.analysis.slo import optimise

    lams = [LAM0["per_ms"] * f for f in loads]
    ans = optimise(problem(max(lams), MODEL["repeat"]), {"p99": SLO - OVERHEAD["ms"]}, lams, families=(family,),
                   requests=100_000, seed=0, defaults=False)
    s = ans.best[family]
    return {"spec": s.spec, **s.knobs}


def pad_up(b: int) -> int:
    return next(s for s in SIZES if s >= b)


def p99_ci(x: np.ndarray) -> tuple[float, float]:
    """A distribution-free 95 % interval for the p99 of the sample x: the order statistics whose ranks are the
    binomial(n, 0.99) 2.5 % and 97.5 % quantiles (NaN where n is too small for one)."""
    from scipy.stats import binom

    x = np.sort(x[np.isfinite(x)])
    n = x.size
    if n < 100:
        return math.nan, math.nan
    lo, hi = int(binom.ppf(0.025, n, 0.99)), int(binom.ppf(0.975, n, 0.99)) + 1
    return float(x[max(lo - 1, 0)]), float(x[hi - 1]) if hi <= n else math.inf


def summarise(arr, phase, sent, done, batches, seconds: float, served: np.ndarray, events=(),
              client: FullCollections | None = None) -> list[dict]:
    """Per phase: the client's p99 (ms) and share over the SLO, the server's p99 (``served``: each request's
    entered/answered times in the model, s), mean batch size, energy per request (mJ).  With an Autopilot's
    ``events`` (each with ``wall_s``), also the share over the SLO once it has acted on the phase's change: of the
    requests sent after its first event in phases 2-5 (a swap or a kept plan: the detector fired and the solve
    ended), the whole of phase 1; NaN where a phase saw no event.  The client's own stops: the p99 of its lag behind
    the send schedule (ms), and its full garbage collections in the phase (``client``)."""
    from smdp_batch.integrations.loadgen import send_lag_ms

    zeta = dict(zip(SIZES, problem(LAM0["per_ms"], MODEL["repeat"]).energy_mj()))
    lat = (done - sent) * 1e3
    lag = send_lag_ms(sent, arr, 1.0)
    in_server = (served[:, 1] - served[:, 0]) * 1e3
    t_first = np.nanmin(sent)
    rows = []
    for k, name in enumerate(PHASES):
        sel = phase == k
        x = lat[sel]
        ok = np.isfinite(x)
        t_lo, t_hi = t_first + k * seconds, t_first + (k + 1) * seconds
        bs = [b for b, t0, _ in batches if t_lo <= t0 < t_hi]
        e = sum(zeta[pad_up(b)] for b in bs) * (1.5 if k == SLOW["phase"] else 1.0)
        y = in_server[sel]
        y = y[np.isfinite(y)]
        fired = [e["wall_s"] for e in events if "wall_s" in e and t_lo <= e["wall_s"] < t_hi]
        after = sel & (sent >= (min(fired) if fired and k > 0 else (t_lo if k == 0 else np.inf)))
        y_after = np.nan_to_num(lat[after], nan=np.inf)
        lag_k = lag[sel][np.isfinite(lag[sel])]
        gcs = client.within(t_lo, t_hi) if client is not None else []
        rows.append({"phase": name, "requests": int(sel.sum()), "answered": int(ok.sum()),
                     "client_lag_p99_ms": float(np.percentile(lag_k, 99)) if lag_k.size else math.nan,
                     "client_gc_full": len(gcs), "client_gc_max_ms": max(gcs, default=0.0),
                     "over_slo_once_fired": float(np.mean(y_after > SLO)) if after.any() and events else math.nan,
                     "p99_ms": float(np.percentile(x[ok], 99)) if ok.any() else math.nan,
                     "p99_ci_ms": p99_ci(x[ok]),
                     "server_p99_ms": float(np.percentile(y, 99)) if y.size else math.nan,
                     "over_slo": float(np.mean(~ok | (np.nan_to_num(x, nan=np.inf) > SLO))),
                     "mean_batch": float(np.mean(bs)) if bs else math.nan,
                     "mj_per_request": e / max(sum(bs), 1)})
    return rows


async def with_slowdown(load, slow_file: str, seconds: float):
    """Run ``load`` (a coroutine) while the slowdown file exists during the slow phase (4; none: --stationary)."""
    if SLOW["phase"] is None:
        return await load

    async def control():
        await asyncio.sleep(SLOW["phase"] * seconds)
        open(slow_file, "w").close()
        await asyncio.sleep(seconds)
        os.remove(slow_file)

    ctl = asyncio.ensure_future(control())
    try:
        return await load
    finally:
        ctl.cancel()
        if os.path.exists(slow_file):
            os.remove(slow_file)


async def told_replay(h, x, arr, max_seconds: float):
    """``replay`` through ``h`` that tells the replica the client's response times with their request ids every
    0.25 s (``observe_client``): the Autopilot then judges what the client sees, and learns the outside delay
    from each time beside the request's batcher view."""
    from smdp_batch.integrations.loadgen import replay

    told: list = []

    async def send(j):
        t0 = time.perf_counter()
        r = await h.remote(j, x)
        told.append(((time.perf_counter() - t0) * 1e3, j))
        return r

    async def tell():
        while True:
            await asyncio.sleep(0.25)
            if told:
                batch, told[:] = list(told), []
                h.observe_client.remote([ms for ms, _ in batch], [j for _, j in batch])

    teller = asyncio.ensure_future(tell())
    try:
        return await replay(send, arr, 1.0, max_seconds=max_seconds)
    finally:
        teller.cancel()


def rotated(items: list) -> list:
    """The settings in the order they run on a server: rotated by ``--seed``, so that over seeds each runs first, on
    the host (and the server) that has served nothing yet, as often as the others (module doc)."""
    k = ORDER["first"] % len(items) if items else 0
    return items[k:] + items[:k]


def run_ray(arr, phase, seconds, tmp) -> dict:
    from smdp_batch.integrations.loadgen import replay
    from smdp_batch.integrations.ray_serve import RayServe, autopilot_deployment

    knobs = tuned("ray")
    x = np.zeros(256, np.float32)
    out = {"_tuned": knobs["spec"]}
    with RayServe(num_cpus=2) as rs:
        for i, name in rotated(list(enumerate(s for s in SETTINGS if s in RAY_SETTINGS
                                              or s.startswith(STATIC_PREFIX["ray"])))):
            slow = os.path.join(tmp, f"ray{i}.slow")
            mk = functools.partial(make, KIND[name], LAM0["per_ms"], SLO, slow, 100, overhead_ms=OVERHEAD["ms"],
                                   repeat=MODEL["repeat"], served_path=SERVED["path"])
            fixed = static_batching(name)  # Ray's timeout in s
            sb = (32, float(knobs["timeout_s"])) if name == "tuned server" else \
                (fixed[0], fixed[1] / 1e6) if fixed else None
            live = KIND[name].startswith("autopilot-ray")
            h = rs.deploy(autopilot_deployment(f"s{i}", mk, serve_batch=sb, live_knobs=live), f"s{i}")
            if KIND[name] in ("autopilot-ray-client", "autopilot-ray-served"):
                load = told_replay(h, x, arr, 10 * seconds)
            else:
                load = replay(lambda j, h=h: h.remote(j, x), arr, 1.0, max_seconds=10 * seconds)
            with FullCollections() as client:
                sent, done, results, errors = asyncio.run(with_slowdown(load, slow, seconds))
            batches = h.batches.remote().result(timeout_s=60)
            m = h.metrics.remote().result(timeout_s=60)
            served = np.full((arr.size, 2), np.nan)
            for j, t_in, t_out in h.served_times.remote().result(timeout_s=60):
                served[j] = t_in, t_out
            events = h.autopilot_events.remote().result(timeout_s=60) if m else []
            out[name] = {"rows": summarise(arr, phase, sent, done, batches, seconds, served, events, client),
                         "errors": errors,
                         "metrics": m and {k: m.get(k) for k in ("swaps", "rollbacks", "failed_solves", "solves", "infeasible",
                                                                 "lam_hat", "latency_hat_ms", "excess_ms", "target_p99_ms",
                                                                 "observed_p99_ms", "timer_scale", "knob_changes",
                                                                 "batch_wait_timeout_ms")},
                         "events": events}
            rs.delete(f"s{i}")
            print(f"ray {name}: done ({errors} errors)", flush=True)
    return out


def run_triton(arr, phase, seconds, tmp) -> dict:
    import dataclasses

    from smdp_batch.autopilot import Autopilot, EventLog
    from smdp_batch.integrations.triton_autopilot import AutopilotModelSpec, AutopilotTriton, run_load
    from smdp_batch.integrations.triton_bank import BankRouter, bank_delays_us, bank_models

    knobs = tuned("triton")
    wide = tuned("triton", TRACE_LOADS) if "tuned server over the loads" in SETTINGS else knobs
    out = {"_tuned": knobs["spec"], "_tuned_wide": wide["spec"]}
    specs, banks = {}, {}
    names = [x for x in SETTINGS if not KIND[x].startswith("autopilot-ray")  # Ray's live knobs and delays: Ray only
             and not x.startswith(STATIC_PREFIX["ray"])]
    delays = bank_delays_us(BANK["lo_ms"], BANK["hi_ms"], BANK["count"])
    for i, name in enumerate(names):
        bank = KIND[name] == "autopilot-triton"  # the members are the plain model; the Autopilot is in this process
        kw = {"kind": "none" if bank else KIND[name], "lam": LAM0["per_ms"], "slo_p99_ms": SLO,
              "slow_file": os.path.join(tmp, f"tr{i}.slow"), "min_samples": 100, "overhead_ms": OVERHEAD["ms"],
              "repeat": MODEL["repeat"]}
        tb = {"tuned server": (32, float(knobs["delay_us"])),
              "tuned server over the loads": (32, float(wide["delay_us"]))}.get(name) or static_batching(name)
        spec = AutopilotModelSpec("examples.autopilot_common:make", kw, dim=256, out_dim=10, sys_path=(ROOT,),
                                  triton_batching=tb)
        if bank:
            banks[f"s{i}"] = bank_models(spec, 32, delays, prefix=f"s{i}")
            specs.update(banks[f"s{i}"])
        else:
            specs[f"s{i}"] = spec
    with AutopilotTriton(specs) as srv:
        for i, name in rotated(list(enumerate(names))):
            key = f"s{i}"
            slow = os.path.join(tmp, f"tr{i}.slow")
            views: list = []
            pilot = router = events = None
            if key in banks:
                events = EventLog()
                pilot = Autopilot(problem(LAM0["per_ms"], MODEL["repeat"]), SLO, min_samples=100, overhead_ms=0.0,
                                  family="triton", learn=True, energy_meter=None,
                                  control=BANK_LOOP[BANK["loop"]]())
                router = BankRouter(pilot, dict(zip(banks[key], delays)), srv)

            async def load(key=key, views=views, router=router):
                return await asyncio.to_thread(run_load, srv, None if router else key, arr, 1.0,
                                               lambda j: np.zeros(256, np.float32), 10 * seconds, served=views,
                                               router=router)

            with FullCollections() as client:
                sent, done, sizes, errors = asyncio.run(with_slowdown(load(), slow, seconds))
            m = None
            if pilot is not None:
                pilot.join(30.0)
                router.poll(force=True)
                m = {**dataclasses.asdict(pilot.metrics), **router.stats(), "events": events.lines()}
                events.close()
                pilot.close()
                batches = sorted((b, t0, t1) for n in banks[key] for b, _, t0, t1 in srv.batches(n))
            else:
                for _ in range(100):
                    m = srv.metrics(key)
                    if m is None or m["solves"] == m["swaps"] + m["kept"] + m["failed_solves"] + m["infeasible"]:
                        break
                    time.sleep(0.2)
                batches = [(b, t0, t1) for b, _, t0, t1 in srv.batches(key)]
            served = np.array(views, dtype=np.float64).reshape(-1, 2)
            keep = ("swaps", "rollbacks", "failed_solves", "solves", "infeasible", "kept", "lam_hat", "latency_hat_ms",
                    "excess_ms", "target_p99_ms", "observed_p99_ms", "timer_ms", "timer_scale", "switches", "sent_to")
            out[name] = {"rows": summarise(arr, phase, sent, done, batches, seconds, served, (m or {}).get("events", ()),
                                           client),
                         "errors": errors, "metrics": m and {k: m[k] for k in keep if k in m},
                         "events": (m or {}).get("events", [])}
            print(f"triton {name}: done ({errors} errors)", flush=True)
    return out


def static_batching(name: str) -> tuple[int, float] | None:
    """(max batch, delay µs) of a ``--static-delays`` setting ("Triton at X ms", "Ray at X ms"), else None."""
    return (32, FIXED[name] * 1e3) if name in FIXED else None


def whole_trace(rows: list[dict]) -> tuple[float, float]:
    """(mJ/request over the trace, the largest share over the SLO in any phase) of one run's rows."""
    n = sum(r["requests"] for r in rows)
    return sum(r["mj_per_request"] * r["requests"] for r in rows) / n, max(r["over_slo"] for r in rows)


def hindsight(runs: list[dict], server: str = "triton") -> str:
    """The best static setting in hindsight over ``runs`` (each run's results on ``server``, the same settings): the
    least energy over the trace among the settings within 1 % over the SLO in every phase of every run, and the
    energy of each Autopilot setting against it, run by run."""
    names = [k for k in runs[0] if not k.startswith("_") and all(k in r for r in runs)]
    per = {n: [whole_trace(r[n]["rows"]) for r in runs] for n in names}  # (mJ/request, worst share) per run
    lines = [f"\nbest static setting on {server} in hindsight over {len(runs)} runs (within 1 % over the SLO in every "
             "phase of every run)\n", "| setting | mJ/request per run | worst phase > SLO | meets |", "|---|---|---:|---|"]
    ok = {}
    for name in names:
        worst = max(w for _, w in per[name])
        ok[name] = worst <= 0.01
        lines.append(f"| {name} | {', '.join(f'{e:.2f}' for e, _ in per[name])} | {100 * worst:.1f} % | "
                     f"{'yes' if ok[name] else 'no'} |")
    pilots = [n for n in names if n.startswith("autopilot")]
    static = [n for n in names if n not in pilots and ok[n]]
    if not static or not pilots:
        return "\n".join(lines + ["", "no static setting met the SLO in every phase of every run"
                                   if not static else "no Autopilot setting in these runs"])
    mean = {n: float(np.mean([e for e, _ in per[n]])) for n in names}
    best = min(static, key=mean.get)
    lines.append(f"\nbest static: {best} ({mean[best]:.2f} mJ/request, mean of runs)")
    for pilot in pilots:
        ratio = [a / b for (a, _), (b, _) in zip(per[pilot], per[best])]
        lines.append(f"{pilot}: {mean[pilot]:.2f} mJ/request, {', '.join(f'{x:.3f}' for x in ratio)} × the best static "
                     "run by run" + ("" if ok[pilot] else " (more than 1 % over the SLO in some phase)"))
    return "\n".join(lines)


def table(server: str, res: dict) -> str:
    wide = f"; over the loads: {res['_tuned_wide']}" if "_tuned_wide" in res else ""
    lines = [f"\n{server} (tuned server setting: {res['_tuned']}{wide}; p99 SLO {SLO:g} ms)\n",
             "| phase | setting | p99 ms (client) [95 % interval] | > SLO | > SLO once fired | p99 ms (server) | "
             "mean batch | mJ/request | client: lag p99 ms, full GCs (longest ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    names = [x for x in SETTINGS if x in res]
    for k, ph in enumerate(PHASES):
        for name in names:
            r = res[name]["rows"][k]
            lo, hi = r["p99_ci_ms"]
            fired = r.get("over_slo_once_fired", math.nan)
            fired_s = "—" if math.isnan(fired) else f"{100 * fired:.1f} %"
            lines.append(f"| {ph} | {name} | {r['p99_ms']:.1f} [{lo:.0f}, {hi:.0f}] | {100 * r['over_slo']:.1f} % | "
                         f"{fired_s} | {r['server_p99_ms']:.1f} | "
                         f"{r['mean_batch']:.2f} | {r['mj_per_request']:.1f} | "
                         f"{r.get('client_lag_p99_ms', math.nan):.1f}, {r.get('client_gc_full', 0)} "
                         f"({r.get('client_gc_max_ms', 0.0):.0f}) |")
    for name in names:
        m = res[name]["metrics"]
        extra = f", swaps {m['swaps']}, rollbacks {m['rollbacks']}, failed solves {m['failed_solves']}" if m else ""
        if m and m.get("knob_changes") is not None:
            extra += f", timeout set {m['knob_changes']} times (last {m['batch_wait_timeout_ms']:.1f} ms)"
        if m and m.get("switches") is not None:
            used = ", ".join(f"{n.rpartition('_')[2]} µs: {c}" for n, c in sorted(
                m["sent_to"].items(), key=lambda x: int(x[0].rpartition('_')[2])))
            extra += f", {m['switches']} member switches (requests per delay: {used})"
        lines.append(f"\n* {name}: errors {res[name]['errors']}{extra}")
    return "\n".join(lines)


def run_simulated(seconds: float, seeds: range, outside_ms, solve_s: float) -> dict:
    """The settings in the simulator (module doc): per setting, the rows of each seed and the Autopilot's events."""
    from smdp_batch.autopilot import Autopilot, slo_plan
    from smdp_batch.autopilot.control import TimerControl
    from smdp_batch.autopilot.simulated import Phase, SimClock, simulate, simulate_ray
    from smdp_batch.runtime import PolicyTable
    from smdp_batch.runtime.bank import AdaptivePolicy, PolicyBank

    lam, target = LAM0["per_ms"], SLO - OVERHEAD["ms"]
    p = problem(lam, MODEL["repeat"])
    phases = [Phase(seconds, a * lam, None if a == b else b * lam, slowdown=1.5 if k == SLOW["phase"] else 1.0,
                    name=PHASES[k]) for k, (a, b) in enumerate(RATES)]
    knobs = tuned("triton")

    def triton_at(ms: float) -> PolicyTable:  # Triton's batcher: 32 at once, else wait for the delay
        return PolicyTable(np.where(np.arange(33) >= 32, 32, 0), p.batch_sizes, {"inputs": {"lam": lam},
                                                                                 "max_wait_ms": ms})

    triton = triton_at(float(knobs["delay_us"]) / 1e3)
    plans = [slo_plan(p.replace(lam=lam * f), target, [lam * f]) for f in (0.2, 0.35, 0.6, 1.0, 1.7, 3.0)]
    bank = AdaptivePolicy(PolicyBank([pl.table for pl in plans if pl is not None]))
    out: dict = {"_tuned": knobs["spec"]}
    for name in SIM_SETTINGS:
        rows, events = [], []
        for seed in seeds:
            clock = SimClock()
            on_triton = name == "autopilot on Triton's batcher"  # told the end-to-end times, as the bank's client
            on_ray = name.startswith("autopilot on Ray's batcher")  # sets Ray's timeout live, as the real deployment
            modelled = name == "autopilot on Ray's batcher with the served model"  # planning with --served's model
            pilot = Autopilot(p, SLO, min_samples=100, overhead_ms=0.0 if on_triton or modelled else OVERHEAD["ms"],
                              solve_in="clock", clock=clock, solve_seconds=solve_s, energy_meter=None,
                              control=TimerControl(target_share=0.005) if on_triton else name != "autopilot, open loop",
                              family="triton" if on_triton else "ray" if on_ray else "smdp", learn=on_triton,
                              served=outside_ms if modelled else None)
            fixed = static_batching(name)
            if on_ray:
                run = simulate_ray(p, phases, max(p.batch_sizes), pilot, seed=seed, clock=clock, outside_ms=outside_ms)
            elif fixed and name.startswith(STATIC_PREFIX["ray"]):  # Ray's batcher closes batches on its own timer
                run = simulate_ray(p, phases, fixed[0], fixed[1] / 1e3, seed=seed, outside_ms=outside_ms)
            else:
                policy = triton_at(fixed[1] / 1e3) if fixed else {"tuned server": triton, "λ-bank": bank,
                                                                   "static table": pilot.table}.get(name, pilot)
                run = simulate(policy, p, phases, seed=seed, clock=clock, outside_ms=outside_ms, served=on_triton,
                               short_batch="pad-up" if name == "tuned server" or fixed else "auto")  # a plan's own form
            rows.append(run.summary(SLO))
            events.append([e["event"] for e in run.events] if name.startswith("autopilot") else [])
        out[name] = {"rows": rows, "events": events}
        print(f"simulated {name}: done", flush=True)
    return out


def sim_table(res: dict, outside_ms, solve_s: float) -> str:
    n = len(res[SIM_SETTINGS[0]]["rows"])
    outside = f"outside {outside_ms:g} ms per" if isinstance(outside_ms, (int, float)) else \
        f"the calibrated server ({outside_ms.source.get('server', '?')}, {outside_ms.source.get('date', '?')}) adding to each"
    lines = [f"\nsimulated ({n} seeds; tuned server = Triton's batcher, {res['_tuned']}; {outside} "
             f"response; a solve {solve_s:g} s; p99 SLO {SLO:g} ms)\n",
             "| phase | setting | p99 ms (mean over seeds) [range] | > SLO (mean) | mean batch | mJ/request |",
             "|---|---|---:|---:|---:|---:|"]
    for k, ph in enumerate(PHASES):
        for name in SIM_SETTINGS:
            rs = [r[k] for r in res[name]["rows"]]
            p99 = np.array([r["p99_ms"] for r in rs])
            lines.append(f"| {ph} | {name} | {p99.mean():.1f} [{p99.min():.1f}, {p99.max():.1f}] | "
                         f"{100 * np.mean([r['over_slo'] for r in rs]):.1f} % | "
                         f"{np.mean([r['mean_batch'] for r in rs]):.2f} | {np.mean([r['mj_per_request'] for r in rs]):.1f} |")
    for name in SIM_SETTINGS:
        total = [sum(r["mj_per_request"] * r["requests"] for r in run) / sum(r["requests"] for r in run)
                 for run in res[name]["rows"]]
        over = [sum(r["over_slo"] * r["requests"] for r in run) / sum(r["requests"] for r in run)
                for run in res[name]["rows"]]
        ev = res[name]["events"]
        extra = "".join(f", {k} {sum(e.count(k) for e in ev) / n:g}" for k in ("swap", "rollback", "kept", "blocked")
                        ) if name.startswith("autopilot") else ""
        lines.append(f"\n* {name}: whole trace {np.mean(total):.1f} mJ/request, {100 * np.mean(over):.2f} % over the "
                     f"SLO (mean of seeds){extra} per run")
    return "\n".join(lines)


def picked(only: str, names: list[str]) -> set[str]:
    """The settings ``--only`` names, comma-separated (a name may hold a comma itself: the longest match wins);
    an unknown one ends the run with one line naming the valid ones."""
    tokens, keep, i = [t.strip() for t in only.split(",")], set(), 0
    while i < len(tokens):
        j = next((j for j in range(len(tokens), i, -1) if ", ".join(tokens[i:j]) in names), None)
        if j is None:
            print(f"--only: unknown setting {tokens[i]!r}; valid: {'; '.join(names)}", file=sys.stderr)
            sys.exit(2)
        keep.add(", ".join(tokens[i:j]))
        i = j
    return keep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase-seconds", type=float, default=10.0)
    ap.add_argument("--servers", default="ray,triton")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--overhead-ms", type=float, default=OVERHEAD["ms"],
                    help="the SLO's share left to the transport: every setting plans p99 ≤ SLO − this (ms)")
    ap.add_argument("--served", help="the served-delay file (smdp-batch calibrate) that \"autopilot on Ray's batcher with "
                    "the served model\" plans with; with --simulated, what the simulated server adds (its l(b) as "
                    "served, per-batch time, return per position and outside delay per load) instead of "
                    "--sim-outside-ms")
    ap.add_argument("--lam", type=float, default=LAM0["per_ms"], help="λ0, requests/ms (default 0.1: 100/s)")
    ap.add_argument("--model", choices=("heavy", "light", "standin"), default="heavy",
                    help="heavy: the MLP 4× per batch (7-24 ms, onnx_mlp_x4_cpu.csv); light: once (0.7-2 ms); standin: "
                    "the GPU-like stand-in, a batch that sleeps 2 + 0.5·b ms")
    ap.add_argument("--only", help="comma-separated settings to run (default: all)")
    ap.add_argument("--bank", default="8:48:16", help="Triton's bank: lo:hi:count, 0 ms and count − 1 delays "
                    "spaced geometrically from lo to hi ms")
    ap.add_argument("--bank-loop", choices=sorted(BANK_LOOP), default="half", help="the bank Autopilot's closed loop: "
                    "aiming at half the 1 %% a p99 allows (default), at 1 %%, or off")
    ap.add_argument("--static-delays", help="Triton: also run its batcher at each of these fixed delays (ms, "
                    "comma-separated), the grid for the best static setting in hindsight (--combine)")
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="print the best static setting in hindsight over "
                    "these runs' --json files (Triton), and the Autopilot's energy against it; no run")
    ap.add_argument("--stationary", action="store_true", help="five steady phases at λ0, no slowdown: stationary "
                    "traffic, where an Autopilot should not re-solve for the service (its events list the reasons)")
    ap.add_argument("--simulated", action="store_true", help="run the trace in the simulator, no server (module doc)")
    ap.add_argument("--repeats", type=int, default=3, help="--simulated: seeds (from --seed)")
    ap.add_argument("--sim-outside-ms", type=float, default=5.0, help="--simulated: each response's time outside "
                    "the batcher (ms)")
    ap.add_argument("--sim-solve-seconds", type=float, default=2.0, help="--simulated: a solve's simulated time (s)")
    gc_option(ap)
    a = ap.parse_args()
    use_gc(a.gc)
    if a.stationary:
        PHASES[:] = [f"{k + 1} steady" for k in range(5)]
        RATES[:] = [(1, 1)] * 5
        SLOW["phase"] = None
    if a.combine:
        try:
            runs = []
            for f in a.combine:
                with open(f) as fh:
                    runs.append(json.load(fh))
            servers = [x for x in STATIC_PREFIX if all(isinstance(r, dict) and x in r for r in runs)]
            if not servers:
                raise ValueError("no server's results in every file")
        except (OSError, ValueError) as e:
            print(f"--combine: {e} (expected this benchmark's --json files of runs on the same server)",
                  file=sys.stderr)
            return 2
        for server in servers:
            print(hindsight([r[server] for r in runs], server))
        return 0
    if a.static_delays:
        try:
            grid = sorted({float(x) for x in a.static_delays.split(",")})
            if not all(0 <= x <= 1000 for x in grid):
                raise ValueError
        except ValueError:
            print(f"--static-delays: expected delays in 0..1000 ms, comma-separated, got {a.static_delays!r}",
                  file=sys.stderr)
            return 2
        for x in grid:
            for prefix in STATIC_PREFIX.values():
                name = f"{prefix}{x:g} ms"
                FIXED[name] = x
                SETTINGS.append(name)
                KIND[name] = "none"
                SIM_SETTINGS.append(name)  # the simulator runs Triton's rule and Ray's (simulate_ray)
    SERVED["path"], ORDER["first"] = a.served, a.seed
    if "autopilot on Ray's batcher with the served model" in (a.only or "") and not a.served:
        raise SystemExit("\"autopilot on Ray's batcher with the served model\" needs --served FILE (smdp-batch calibrate's file)")
    if not a.served:  # the simulator's Autopilot plans with the model of the calibration it serves with
        SIM_SETTINGS.remove("autopilot on Ray's batcher with the served model")
    OVERHEAD["ms"], LAM0["per_ms"], MODEL["repeat"] = a.overhead_ms, a.lam, {"heavy": HEAVY, "standin": STANDIN}.get(
        a.model, 1)
    from smdp_batch.errors import InputError
    from smdp_batch.integrations.triton_bank import bank_delays_us

    try:
        lo, hi, count = a.bank.split(":")
        BANK.update(lo_ms=float(lo), hi_ms=float(hi), count=int(count), loop=a.bank_loop)
    except ValueError:
        print(f"--bank: expected lo:hi:count (ms, ms, members), got {a.bank!r}", file=sys.stderr)
        return 2
    try:
        bank_delays_us(BANK["lo_ms"], BANK["hi_ms"], BANK["count"])
    except InputError as e:
        print(f"--bank: {e}", file=sys.stderr)
        return 2
    if a.only:
        keep = picked(a.only, SIM_SETTINGS if a.simulated else SETTINGS)
        SETTINGS[:] = [x for x in SETTINGS if x in keep or x in FIXED]
        SIM_SETTINGS[:] = [x for x in SIM_SETTINGS if x in keep or x in FIXED]
    else:
        SETTINGS[:] = [x for x in SETTINGS if x not in EXTRA]
    if a.simulated:
        t0 = time.perf_counter()
        outside = a.sim_outside_ms
        if a.served:  # the simulated server adds what the calibrated one was measured to add
            from smdp_batch.model.served import ServedDelay

            try:
                outside = ServedDelay.load(a.served)
            except (OSError, InputError) as e:
                print(f"--served: {e}", file=sys.stderr)
                return 2
        res = run_simulated(a.phase_seconds, range(a.seed, a.seed + a.repeats), outside, a.sim_solve_seconds)
        print(sim_table(res, outside, a.sim_solve_seconds))
        if FIXED:
            print(hindsight([{k: {"rows": res[k]["rows"][i]} for k in SIM_SETTINGS} for i in range(a.repeats)],
                            "the simulated clock"))
        print(f"\n{time.perf_counter() - t0:.0f} s in all")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1, default=float)
        return 0
    arr, phase = trace(a.phase_seconds, np.random.default_rng(a.seed))
    print(f"{arr.size} requests, {len(PHASES)} phases of {a.phase_seconds:g} s", flush=True)
    results = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smdp-autopilot-bench-") as tmp:
        for server in a.servers.split(","):
            results[server] = (run_ray if server == "ray" else run_triton)(arr, phase, a.phase_seconds, tmp)
    for server, res in results.items():
        print(table(server, res))
    if FIXED:
        for server, res in results.items():
            print(hindsight([res], server))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
