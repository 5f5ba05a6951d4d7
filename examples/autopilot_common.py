"""Shared by the autopilot examples and ``benchmarks/bench_autopilot.py``: the ONNX MLP of
:mod:`examples.onnx_mlp` as a batching problem, and the factories the servers call in their own processes.

* :func:`problem` — l(b) and ζ(b) from the CPU profile ``benchmarks/data/onnx_mlp_cpu.csv`` (measured with
  ``smdp-batch measure examples.onnx_mlp:infer``; ζ is a constant 60 W × latency: a CPU has no energy counter
  here), sizes 1, 2, 4, 8, 16, 32, at the arrival rate ``lam`` (requests/ms); with ``repeat=HEAVY`` the
  heavy variant, :func:`infer_heavy` (the MLP four times per batch, ``onnx_mlp_x4_cpu.csv``, measured with
  ``smdp-batch measure examples.autopilot_common:infer_heavy --make-batch examples.onnx_mlp:make_batch
  --warmup 5 --repeats 40 --power-w 60``), which the Autopilot benchmark uses; with ``repeat=STANDIN`` the GPU-like
  stand-in, a batch that sleeps l(b) = 2 + 0.5·b ms (sleeping does not compete for the CPU, as a GPU would not),
  ζ(b) = 60 W × l(b).
* :func:`make_infer` — the model's infer function (a list of vectors → a list of logit rows).  While the file
  ``slow_file`` exists every batch sleeps ``slow - 1`` times its own duration after running: a service
  slowdown injected from outside the server process.
* :func:`make` — ``(infer, policy)`` for :func:`smdp_batch.integrations.ray_serve.autopilot_deployment` and
  :class:`smdp_batch.integrations.triton_autopilot.AutopilotModelSpec`; ``kind`` picks the policy:
  ``autopilot`` (an Autopilot), ``autopilot-ray`` (an Autopilot planning Ray's own batcher, for
  ``autopilot_deployment(live_knobs=True)``; ``autopilot-ray-open``: without its closed loop; ``autopilot-ray-client``: told the client's times, no
  ``overhead_ms``, the excess learned; ``autopilot-ray-served``: told the client's times, planning with the
  served-delay model of ``smdp-batch calibrate``'s file ``served_path``), ``static`` (the Autopilot's first table, never re-solved), ``bank`` (a λ-bank
  AdaptivePolicy of SLO tables over a grid of rates), or ``none`` (the server batches by itself).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from examples import onnx_mlp  # noqa: E402

PROFILE = os.path.join(ROOT, "benchmarks", "data", "onnx_mlp_cpu.csv")
HEAVY = 4  # the heavy variant runs the MLP this many times per batch (the benchmark's: batches of 4-22 ms)
STANDIN = 0  # ``repeat`` for the GPU-like stand-in: no MLP, the batch sleeps l(b) = 2 + 0.5·b ms
PROFILES = {1: PROFILE, HEAVY: os.path.join(ROOT, "benchmarks", "data", "onnx_mlp_x4_cpu.csv")}
SIZES = (1, 2, 4, 8, 16, 32)
STANDIN_W = 60.0  # the stand-in's power while a batch runs (W): ζ(b) = 60 W × l(b), as the CPU profiles'


def standin_ms(b: int) -> float:
    """The GPU-like stand-in's batch time l(b) = 2 + 0.5·b ms (a sleep: it does not compete for the CPU)."""
    return 2.0 + 0.5 * b


def problem(lam: float, repeat: int = 1, profile: str | None = None):
    """The ONNX MLP as a batching problem at rate ``lam`` (1/ms); ``repeat`` = HEAVY: the heavy variant; STANDIN:
    the GPU-like stand-in (l(b) = 2 + 0.5·b ms, ζ(b) = 60 W × l(b), deterministic).  ``profile``: a profile CSV
    measured on this host (``smdp-batch measure``), in place of the shipped one."""
    from smdp_batch.model.problem import BatchingProblem

    if repeat == STANDIN:
        lat = tuple(standin_ms(b) for b in SIZES)
        def table(vals) -> str:  # a curve given per size: table:1=V1,2=V2,…
            return "table:" + ",".join(f"{b}={v:g}" for b, v in zip(SIZES, vals))

        return BatchingProblem(float(lam), batch_sizes=SIZES, latency=table(lat), energy=table(STANDIN_W * x for x in lat))
    path = profile or PROFILES[repeat]
    return BatchingProblem(float(lam), batch_sizes=SIZES, latency=f"csv:{path}", energy=f"csv:{path}")


def infer_heavy(items: list) -> list:
    """The heavy variant: the MLP run HEAVY times on the batch (what ``onnx_mlp_x4_cpu.csv`` measures)."""
    for _ in range(HEAVY - 1):
        onnx_mlp.infer(items)
    return onnx_mlp.infer(items)


def infer_standin(items: list) -> list:
    """The GPU-like stand-in: sleep l(b) and answer ten zeros per request (the MLP's output shape)."""
    time.sleep(standin_ms(len(items)) / 1e3)
    return [[0.0] * 10 for _ in items]


def make_infer(slow_file: str | None = None, slow: float = 1.5, repeat: int = 1):
    if repeat != STANDIN:
        onnx_mlp.session()  # build the session now, not in the first batch
    state = {"checked": 0.0, "on": False}
    run = {HEAVY: infer_heavy, STANDIN: infer_standin}.get(repeat, onnx_mlp.infer)

    def infer(items: list) -> list:
        t0 = time.perf_counter()
        out = run(list(items))
        if slow_file is not None:
            now = time.monotonic()
            if now - state["checked"] > 0.1:
                state["checked"], state["on"] = now, os.path.exists(slow_file)
            if state["on"]:
                time.sleep((slow - 1.0) * (time.perf_counter() - t0))
        return out

    return infer


def make(kind: str = "autopilot", lam: float = 0.1, slo_p99_ms: float = 50.0, slow_file: str | None = None,
         min_samples: int = 200, bank_factors=(0.2, 0.35, 0.6, 1.0, 1.7, 3.0), overhead_ms: float = 0.0,
         repeat: int = 1, served_path: str | None = None, profile: str | None = None):
    """``(infer, policy)`` built in the calling (server) process; see the module docstring.  ``overhead_ms``:
    the part of the SLO left to the transport outside the server: every table plans p99 ≤ SLO − overhead_ms."""
    import logging

    from smdp_batch.autopilot import Autopilot, slo_plan

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # swaps: one JSON line each
    infer = make_infer(slow_file, repeat=repeat)
    if kind == "none":
        return infer, None
    p = problem(lam, repeat, profile)
    if kind == "bank":
        from smdp_batch.runtime.bank import AdaptivePolicy, PolicyBank

        plans = [slo_plan(p.replace(lam=lam * f), slo_p99_ms - overhead_ms, [lam * f]) for f in bank_factors]
        return infer, AdaptivePolicy(PolicyBank([pl.table for pl in plans if pl is not None]))
    if kind in ("autopilot-ray", "autopilot-ray-open"):  # plans Ray's own batcher; the deployment sets its timeout live
        return infer, Autopilot(p, slo_p99_ms, min_samples=min_samples, overhead_ms=overhead_ms, family="ray",
                                control=kind == "autopilot-ray")
    if kind == "autopilot-ray-client":  # told the client's own times: no budget outside them, the excess learned
        return infer, Autopilot(p, slo_p99_ms, min_samples=min_samples, overhead_ms=0.0, family="ray", learn=True)
    if kind == "autopilot-ray-served":  # told the client's times, planning with the served-delay model measured at
        # three loads (smdp-batch calibrate): the outside delay of the load planned for, no budget, nothing learned
        from smdp_batch.model.served import ServedDelay

        return infer, Autopilot(p, slo_p99_ms, min_samples=min_samples, overhead_ms=0.0, family="ray",
                                served=ServedDelay.load(served_path))
    pilot = Autopilot(p, slo_p99_ms, min_samples=min_samples, overhead_ms=overhead_ms)
    if kind == "static":
        return infer, pilot.table
    return infer, pilot


@contextlib.contextmanager
def profile_here() -> Iterator[str]:
    """The MLP timed on this host at each size (``smdp-batch measure``'s API, about a second), written as the
    profile CSV the first table is planned on: yields its path (one line printed against the shipped profile) and
    removes it on leaving.  The shipped profile was measured on another machine, and a host slower than it
    (measured: 6–7 × on one) breaks the first table's SLO until the Autopilot's first re-solve."""
    from smdp_batch.measure import measure

    with tempfile.TemporaryDirectory(prefix="smdp-autopilot-example-") as folder:
        m = measure(onnx_mlp.infer, onnx_mlp.make_batch, SIZES, warmup=5, repeats=20, power_w=60.0, progress=False)
        here = m.write(os.path.join(folder, "onnx_mlp_here.csv"))[0]
        shipped, own = problem(0.1).latency_ms(), problem(0.1, profile=here).latency_ms()
        print(f"measured here: l(b) {', '.join(f'{x:.2f}' for x in own)} ms at b = {', '.join(map(str, SIZES))} "
              f"({min(own / shipped):.2g}–{max(own / shipped):.2g} × the shipped profile)")
        yield here


def served_speed(m, profile_ms) -> tuple[float, float] | None:
    """The least and greatest l̂(b) ÷ l(b) of the profile ``profile_ms`` over the sizes that ran ≥ 5 batches: how fast
    the model ran while served (``m``: the Autopilot's metrics, a dict or ``AutopilotMetrics``); None if none ran."""
    get = m.get if isinstance(m, dict) else (lambda k: getattr(m, k, None))
    ratio = [e / p for e, p, c in zip(get("latency_hat_ms") or (), profile_ms, get("batches") or ()) if c >= 5]
    return (min(ratio), max(ratio)) if ratio else None


def why_missed(m, lam: float, slo_ms: float, overhead_ms: float, mean_batch: float, repeat: int = 1,
               profile: str | None = None) -> str:
    """One plain line on why a phase put more than 1 % of its requests over the SLO, from what the run measured:
    ``m`` the Autopilot's metrics (a dict, as the servers hand them back, or ``AutopilotMetrics``), ``mean_batch``
    the phase's mean executed batch (NaN: not known), ``profile`` the profile CSV measured on this host that the
    first table was planned on (None: the shipped one)."""
    import math

    get = m.get if isinstance(m, dict) else (lambda k: getattr(m, k, None))
    why = []
    speed = served_speed(m, problem(lam, repeat, profile).latency_ms())
    if speed is not None and speed[1] > 1.2:
        x = lambda v: f"{v:.2g}" if v < 100 else f"{v:.0f}"  # noqa: E731  (120, not 1.2e+02)
        where = (f"{os.path.relpath(PROFILES.get(repeat, PROFILE), ROOT)}, measured on another machine" if profile is None
                 else "measured on this host alone: the client, the server and the model share its cores")
        why.append(f"the model ran at {x(speed[0])}–{x(speed[1])} × the profile its first table was planned on "
                   f"({where})")
    if get("infeasible"):
        why.append(f"{get('infeasible')} solve(s) found no table that meets the SLO at the rate and batch times "
                   "measured")
    if mean_batch >= 0.8 * max(SIZES):
        why.append(f"batches ran nearly full (mean {mean_batch:.1f} of {max(SIZES)}): the host did not keep up")
    inside = get("observed_p99_ms")
    if get("responses_from") != "served" and isinstance(inside, (int, float)) and math.isfinite(inside) \
            and inside > slo_ms - overhead_ms:  # (told the end-to-end times, its p99 is not the batcher's alone)
        why.append(f"the server's batcher alone took p99 {inside:.0f} ms, beyond the SLO less the {overhead_ms:g} ms "
                   f"left to the rest (the client, the server and the model share this host's {os.cpu_count()} "
                   "cores)")
    return "; ".join(why) or (f"the time outside the server's batcher took more than the {overhead_ms:g} ms left to "
                              "it (OVERHEAD_MS)")

