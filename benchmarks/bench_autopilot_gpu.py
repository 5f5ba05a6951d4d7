"""The Autopilot on a GPU: a torch model on CUDA behind the asyncio DynamicBatcher, energy from NVML.

    python benchmarks/bench_autopilot_gpu.py --json gpu.json         # ≈ 5 min on one H200 (torch, nvidia-ml-py)
    python benchmarks/bench_autopilot_gpu.py --backend numpy --phase-seconds 4 --sizes 8   # a dry run, CPU

What it does, in one process:

1. **Profile.** ``smdp_batch.measure`` times the model at every batch size 1..B (``--sizes``, default 32) and
   reads ζ(b) from NVML's total-energy counter (``energy="nvml"``), written as a profile CSV.  The model
   (``--backend torch``): ``--layers`` bf16 linear layers of width ``--width`` with ReLU, each request
   ``--tokens`` rows: a fixed weight-streaming cost per batch plus compute per request, as in LLM serving.
2. **Load.** λ0 is ``--load`` × the stable rate B/l(B) of the profile.  Five phases of ``--phase-seconds``
   each, open-loop Poisson: steady λ0; a 3× step; a ramp from 3λ0 down to 0.2λ0; λ0 with a 1.5× service
   slowdown (the model runs its layers one and a half times: real GPU work, so time and energy both grow);
   steady λ0.  p99 SLO ``--slo-ms`` (default 4·l(B), at least 20 ms).
3. **Settings**, each on the same arrival times, each a ``DynamicBatcher`` in this process:
   ``autopilot`` (an Autopilot started at λ0 from the profile, ``energy_meter="auto"``: NVML),
   ``tuned triton`` (Triton's dynamic batcher, max batch B and the max_queue_delay the SLO optimiser tunes
   for phase 1, run as its table + timer, which the simulator tests show equal to Triton request by
   request), ``static table`` (the Autopilot's first table, never re-solved).
4. **Per phase:** the p99 response time (ms) with a distribution-free 95 % interval, the share over the
   SLO, the mean batch, and the **measured** energy per request: NVML's counter over the phase (the
   whole board, idle draw included) ÷ requests; where the p99 went (the p99 of each part over the phase's
   requests: the client's lag behind its send schedule, the wait in the batcher, the batch's model time, the
   return from batch end to the client) and the served batch time over the profile's; the board's state, read
   from NVML every 50 ms (median SM clock, hottest temperature, mean power, and the share of readings whose
   clocks its power limit or a thermal slowdown held down), which tells a slower GPU from a slower server; and the
   process's full garbage collections (count, longest).  At the end, the Autopilot's ζ̂(b) from its energy meter
   beside the profile's ζ(b) — two methods on one counter: the profile runs one size back to back between
   two refreshes (``measure``), the meter fits the live mix of sizes and idle time — and its idle power.

Only 127.0.0.1 is not even needed: no server, no network.  With ``--backend numpy`` (no GPU) the model is a
numpy matmul stack, energy is the profile's constant power, and the NVML columns are NaN.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from bench_autopilot import LAM0, PHASES, FullCollections, gc_option, p99_ci, trace, use_gc  # noqa: E402

from smdp_batch.runtime import DynamicBatcher, PolicyTable  # noqa: E402


class Model:
    """``--layers`` linear layers of ``--width`` with ReLU; request i is ``--tokens`` rows of one input."""

    def __init__(self, args):
        self.backend, self.tokens, self.slow = args.backend, args.tokens, False
        if args.backend == "torch":
            import torch

            g = torch.Generator(device="cuda").manual_seed(args.seed)
            w = args.width
            self.torch = torch
            self.weights = [torch.randn(w, w, device="cuda", dtype=torch.bfloat16, generator=g) / math.sqrt(w)
                            for _ in range(args.layers)]
            self.x = torch.randn(args.sizes * args.tokens, w, device="cuda", dtype=torch.bfloat16, generator=g)
        else:
            rng = np.random.default_rng(args.seed)
            w = args.width
            self.weights = [rng.standard_normal((w, w)).astype(np.float32) / math.sqrt(w) for _ in range(args.layers)]
            self.x = rng.standard_normal((args.sizes * args.tokens, w)).astype(np.float32)

    def __call__(self, items: list) -> list:
        b = len(items)
        layers = self.weights + (self.weights[: len(self.weights) // 2] if self.slow else [])
        y = self.x[: b * self.tokens]
        if self.backend == "torch":
            for w in layers:
                y = self.torch.relu(y @ w)
            out = y.view(b, self.tokens, -1)[:, 0, 0].float().cpu().numpy()  # synchronises
        else:
            for w in layers:
                y = np.maximum(y @ w, 0.0)
            out = y.reshape(b, self.tokens, -1)[:, 0, 0]
        return [float(v) for v in out]


# NVML's clock-event (throttle) reason bits: the board's power limit, and thermal slowdowns (software or hardware)
POWER_CAP, THERMAL = 0x4, 0x20 | 0x40


class Counter:
    """NVML's total-energy counter (J) of GPU 0 (``ok`` False where there is none), and the board's state: SM clock
    (MHz), temperature (°C), power draw (W) and whether its clocks are held down by the power limit or by heat."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.read_mj = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(self.h)
            self.read_mj()
            self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            self.ok = True
        except Exception:  # noqa: BLE001 - no GPU: modelled energy only
            self.ok = False

    def joules(self) -> float:
        return self.read_mj() / 1e3 if self.ok else math.nan

    def state(self) -> tuple:
        """(time.time() s, SM clock MHz, temperature °C, power W, clock-event reason bits); NaNs without NVML."""
        if not self.ok:
            return (time.time(), math.nan, math.nan, math.nan, 0)
        nv, h = self.nv, self.h
        return (time.time(), float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                nv.nvmlDeviceGetPowerUsage(h) / 1e3, int(self._reasons(h)))


def profile(model: Model, args, path: str):
    from smdp_batch.measure import measure
    from smdp_batch.model.problem import BatchingProblem

    sizes = tuple(range(1, args.sizes + 1))
    kw = {"energy": "nvml"} if args.backend == "torch" else {"power_w": 60.0}
    m = measure(lambda batch: model(batch), lambda b: list(range(b)), sizes=sizes, warmup=3,
                repeats=args.repeats, progress=False, **kw)
    m.write(path)
    return BatchingProblem(1e-3, batch_sizes=sizes, latency=f"csv:{path}", energy=f"csv:{path}"), m.meta


async def serve(model: Model, policy, wait, arr, phase, seconds, counter: Counter) -> dict:
    """Replay the trace into a DynamicBatcher; per-request latency, batches, and the counter at phase edges."""
    from smdp_batch.integrations.loadgen import replay, send_lag_ms

    batches: list = []  # (size, start s, end s) of every batch
    start = np.full(len(arr), np.nan)  # each request's batch start and end (time.time() s)
    end = np.full(len(arr), np.nan)

    def infer(items):
        t0 = time.time()
        out = model(items)
        t1 = time.time()
        batches.append((len(items), t0, t1))
        start[items], end[items] = t0, t1
        return out

    edges: list = []

    async def clock():  # the counter at each phase edge, and the slowdown in phase 4
        t0 = time.perf_counter()
        for k in range(len(PHASES) + 1):
            await asyncio.sleep(max(0.0, t0 + k * seconds - time.perf_counter()))
            edges.append((time.time(), counter.joules()))
            model.slow = k == 3

    board: list = []  # the board's state every 50 ms (Counter.state), read on a thread off the event loop
    stop = threading.Event()

    def watch():
        while not stop.wait(0.05):
            board.append(counter.state())

    sampler = threading.Thread(target=watch, daemon=True)
    sampler.start()
    try:
        with FullCollections() as collections:  # --gc freeze: the heap frozen first
            async with DynamicBatcher(infer, policy, max_wait_ms=wait) as batcher:
                ctl = asyncio.ensure_future(clock())
                sent, done, _, errors = await replay(lambda i: batcher.submit(i), arr, 1.0,
                                                     max_seconds=len(PHASES) * seconds + 5)
                await ctl
    finally:
        stop.set()
        sampler.join()
    model.slow = False
    return {"sent": sent, "done": done, "start": start, "end": end, "batches": batches, "edges": edges,
            "errors": errors, "lag_ms": send_lag_ms(sent, arr, 1.0), "board": board,
            "gc": collections}


def p99(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(np.percentile(x, 99)) if x.size else math.nan


def summarise(run: dict, phase, slo: float, lat_profile, counter_ok: bool) -> list[dict]:
    """Per phase: the client's p99 and where it went (each a p99 over the phase's requests, ms): the client's lag
    behind its send schedule, the wait in the batcher (sent → its batch starts), the model (the batch's time) and
    the return (batch end → the client has the answer); the served l(b) over the profile's, batch-weighted."""
    lat = (run["done"] - run["sent"]) * 1e3
    lag = run["lag_ms"]
    wait, model, back = ((run["start"] - run["sent"]) * 1e3, (run["end"] - run["start"]) * 1e3,
                         (run["done"] - run["end"]) * 1e3)
    rows = []
    for k, name in enumerate(PHASES):
        sel = phase == k
        x = lat[sel]
        ok = np.isfinite(x)
        (t_lo, e_lo), (t_hi, e_hi) = run["edges"][k], run["edges"][k + 1]
        inside = [(b, (t1 - t0) * 1e3) for b, t0, t1 in run["batches"] if t_lo <= t0 < t_hi]
        bs = [b for b, _ in inside]
        st = [x for x in run["board"] if t_lo <= x[0] < t_hi]
        clk, temp, watts = (np.array([x[i] for x in st], dtype=np.float64) for i in (1, 2, 3))
        bits = np.array([x[4] for x in st], dtype=np.int64)
        gcs = run["gc"].within(t_lo, t_hi)
        rows.append({"phase": name, "requests": int(sel.sum()), "answered": int(np.isfinite(run["done"][sel]).sum()),
                     "p99_ms": float(np.percentile(x[ok], 99)) if ok.any() else math.nan,
                     "p99_ci_ms": p99_ci(x[ok]),
                     "over_slo": float(np.mean(~ok | (np.nan_to_num(x, nan=np.inf) > slo))),
                     "mean_batch": float(np.mean(bs)) if bs else math.nan,
                     "j_per_request": (e_hi - e_lo) / max(sum(bs), 1),
                     "client_lag_p99_ms": p99(lag[sel]), "wait_p99_ms": p99(wait[sel]),
                     "model_p99_ms": p99(model[sel]), "return_p99_ms": p99(back[sel]),
                     # full garbage collections in the phase: each stops this process, the batcher and client
                     "gc_full": len(gcs), "gc_max_ms": max(gcs, default=0.0),
                     "served_over_profile": (sum(t for _, t in inside) / sum(lat_profile[b - 1] for b in bs)
                                             if bs else math.nan),
                     # the board over the phase (NVML, every 50 ms; NaN without it): median SM clock, hottest
                     # reading, mean power, and the share of readings whose clocks the power limit or heat held down
                     "sm_clock_mhz": float(np.median(clk)) if clk.size else math.nan,
                     "temperature_max_c": float(np.max(temp)) if temp.size else math.nan,
                     "power_mean_w": float(np.mean(watts)) if watts.size else math.nan,
                     "power_capped": float(np.mean(bits & POWER_CAP != 0)) if counter_ok and bits.size else math.nan,
                     "thermal_slowdown": float(np.mean(bits & THERMAL != 0)) if counter_ok and bits.size else math.nan})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("torch", "numpy"), default="torch")
    ap.add_argument("--sizes", type=int, default=32, help="largest batch size B (sizes 1..B)")
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--load", type=float, default=0.2, help="λ0 as a share of the stable rate B/l(B)")
    ap.add_argument("--slo-ms", type=float, default=None)
    ap.add_argument("--phase-seconds", type=float, default=12.0)
    ap.add_argument("--only", default="autopilot,tuned triton,static table")
    ap.add_argument("--seed", type=int, default=0)
    gc_option(ap)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.backend == "numpy" and args.width == 8192:
        args.width, args.layers, args.tokens = 1024, 3, 32

    from smdp_batch.analysis.slo import optimise
    from smdp_batch.baselines.servers import triton_table
    from smdp_batch.autopilot import Autopilot

    model, counter = Model(args), Counter()
    tmp = tempfile.mkdtemp()
    t0 = time.time()
    prob, meta = profile(model, args, os.path.join(tmp, "profile.csv"))
    lat, zeta = prob.latency_ms(), prob.energy_mj()
    B = args.sizes
    lam0 = args.load * B / lat[-1]
    slo = args.slo_ms or max(20.0, round(4 * lat[-1]))
    prob = prob.replace(lam=lam0)
    print(f"profile ({time.time() - t0:.0f} s, energy: {meta.get('energy_source', '?')}): l(1) {lat[0]:.2f} ms, "
          f"l({B}) {lat[-1]:.2f} ms; ζ(1) {zeta[0]:.0f} mJ, ζ({B}) {zeta[-1]:.0f} mJ; λ0 {lam0:.3f}/ms, "
          f"p99 SLO {slo:g} ms", flush=True)
    LAM0["per_ms"] = lam0
    arr, phase = trace(args.phase_seconds, np.random.default_rng(args.seed))

    t0 = time.time()
    ans = optimise(prob, {"p99": slo}, [lam0], families=("triton",), requests=100_000, seed=0, defaults=False)
    rule = ans.best["triton"].rule
    print(f"tuned triton for phase 1: {rule.spec} ({time.time() - t0:.0f} s)", flush=True)

    print(f"idle power (NVML, before and after the sizes): {meta.get('idle_power_w')} W "
          f"(readings {meta.get('idle_power_readings_w')})", flush=True)
    out: dict = {"device": meta.get("device"), "profile": {"latency_ms": lat.tolist(), "energy_mj": zeta.tolist()},
                 "measure": {k: meta.get(k) for k in ("energy_source", "energy_method", "idle_power_w",
                                                      "idle_power_readings_w", "elapsed_s", "libraries", "method")},
                 "lam0": lam0, "slo_ms": slo, "tuned": rule.spec, "settings": {}}
    out["gc"] = args.gc
    use_gc(args.gc)
    for name in args.only.split(","):
        pilot = None
        if name == "tuned triton":
            policy, wait = PolicyTable(triton_table(rule.maxb, tuple(rule.pref)), prob.batch_sizes), rule.delay
        else:
            pilot = Autopilot(prob, slo, min_samples=100, min_interval_s=1.0)
            # "auto": the table's own timer, or the batcher's safety bound where the plan has none (None would
            # follow the table exactly, and the trace's last requests would wait for an arrival that never comes)
            policy, wait = (pilot if name == "autopilot" else pilot.table), "auto"
        run = asyncio.run(serve(model, policy, wait, arr, phase, args.phase_seconds, counter))
        rows = summarise(run, phase, slo, lat, counter.ok)
        res: dict = {"rows": rows, "errors": run["errors"]}
        if pilot is not None:
            pilot.join(30.0)
            m = pilot.metrics
            pilot.close()
            if name == "autopilot":
                res["metrics"] = {k: getattr(m, k) for k in ("swaps", "rollbacks", "failed_solves", "infeasible", "solves",
                                                            "lam_hat", "energy_source", "idle_power_w",
                                                            "energy_hat_mj", "latency_hat_ms")}
                res["meter_intervals"] = pilot.meter.intervals if pilot.meter is not None else 0
        out["settings"][name] = res
        print(f"\n{name} ({run['errors']} errors)")
        print(f"  {'phase':15s} {'requests':>8s} {'p99 ms':>8s} {'95% CI':>15s} {'> SLO':>6s} {'batch':>6s} {'J/req':>7s}"
              f"  | p99 ms of: {'lag':>5s} {'wait':>5s} {'model':>5s} {'return':>6s}  served/profile"
              f"  | full GCs, longest ms"
              f"  | board: SM MHz  °C max  W mean  power-capped  thermal")
        for r in rows:
            lo, hi = r["p99_ci_ms"]
            print(f"  {r['phase']:15s} {r['requests']:8d} {r['p99_ms']:8.1f} {f'{lo:.1f}-{hi:.1f}':>15s} "
                  f"{100 * r['over_slo']:5.1f}% {r['mean_batch']:6.1f} {r['j_per_request']:7.3f}"
                  f"  |            {r['client_lag_p99_ms']:5.1f} {r['wait_p99_ms']:5.1f} {r['model_p99_ms']:5.1f} "
                  f"{r['return_p99_ms']:6.1f}  {r['served_over_profile']:14.2f}"
                  f"  | {r['gc_full']:8d} {r['gc_max_ms']:11.1f}"
                  f"  |        {r['sm_clock_mhz']:6.0f} {r['temperature_max_c']:6.0f} {r['power_mean_w']:7.0f}"
                  f" {100 * r['power_capped']:12.0f}% {100 * r['thermal_slowdown']:7.0f}%", flush=True)
        if "metrics" in res:
            mm = res["metrics"]
            print(f"  swaps {mm['swaps']}, rollbacks {mm['rollbacks']}, failed {mm['failed_solves']}, "
                  f"infeasible {mm['infeasible']}; energy from {mm['energy_source']} "
                  f"({res['meter_intervals']} counter intervals), idle {mm['idle_power_w']:.0f} W")
            for b in sorted({1, 2, 4, 8, 16, B} & set(range(1, B + 1))):
                print(f"  ζ({b:2d}): profile {zeta[b - 1]:8.1f} mJ, meter {mm['energy_hat_mj'][b - 1]:8.1f} mJ "
                      f"(l̂ {mm['latency_hat_ms'][b - 1]:.2f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    return 0


if __name__ == "__main__":
    sys.exit(main())
