"""Calibration on a real server at real speed: what the server adds to the batch model, measured.

:func:`calibrate` runs your own deployed endpoint over HTTP (``server="http"``: POSTs at each load, its
batching described by the rule), or starts a server on 127.0.0.1 with the setting to check (Triton's dynamic batcher with
the exported ``max_queue_delay_microseconds`` and preferred sizes, or Ray Serve's ``@serve.batch`` with the
exported ``max_batch_size`` and ``batch_wait_timeout_s``), runs the model (a GPU-like stand-in whose batch
sleeps l(b), which does not compete for the CPU as a GPU would not, or an ONNX model on the CPU), sends a
bounded Poisson stream at each load **at real speed** (time scale 1), and fits the served-delay model
(:func:`smdp_batch.analysis.served.fit_served`).  It also reads the device's idle power where an energy
counter is present (NVML or zeus; :mod:`smdp_batch.measure.energy`).

**Repeats.**  With ``repeats`` > 1 each repeat runs on a fresh deployment of the server (started, warmed, run at
every load, stopped), as a user's next deployment would be: how far a run's p99 lands from its plan differs more
between deployments than within one.  Measured on Ray Serve (stand-in, 173–300 req/s, 2 cores): within one
deployment the runs' p99 agreed to 5 %, while the next deployment of the same setting answered 40 % slower at
p99, its handle path to the replica taking p99 25–32 ms against 10–15 ms; a spread measured on one deployment
would have promised the tighter figure.

Every run is bounded: ``requests`` per load and ``max_seconds`` of sending per load; the servers are stopped
on the way out, whatever happens.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from ..analysis.served import CalibrationRun, fit_served
from ..analysis.simulate import poisson_arrivals
from ..errors import InputError
from ..extras import require
from ..model.served import ServedDelay

__all__ = ["calibrate", "calibration_runs", "SERVERS", "server_setting", "burst_arrivals", "PROBE_BURSTS"]

SERVERS = ("triton", "ray", "http")
#: bursts of 3·Bmax requests sent at once after each deployment's loads, one after the other has drained: full
#: batches back to back, whose gaps are the instance's own time per batch (a setting that waits long at light loads
#: rarely leaves a batch waiting when the one before ends, and a + c·b would go unmeasured)
PROBE_BURSTS = 6


def burst_arrivals(maxb: int, delay_ms: float, l_max_ms: float, bursts: int = PROBE_BURSTS) -> np.ndarray:
    """Send times (ms) of ``bursts`` bursts of 3·``maxb`` requests at once, each 2 × (three batches of l(Bmax) =
    ``l_max_ms`` + the delay) + 50 ms after the one before, so that it has drained on a host twice as slow as the
    profile."""
    gap = 2.0 * (3.0 * l_max_ms + delay_ms) + 50.0
    return np.repeat(np.arange(bursts) * gap, 3 * int(maxb)).astype(np.float64)


def server_setting(rule, server: str) -> tuple[int, float, tuple[int, ...]]:
    """(max batch size, delay in ms, preferred sizes) of a Triton or Ray Serve rule; one line for anything else.
    An HTTP endpoint batches as its own server does: any rule the simulator runs describes it."""
    mode = getattr(rule, "mode", None)
    if server == "http":
        return int(rule.maxb), float(rule.delay), tuple(int(x) for x in rule.pref)
    if server == "triton" and mode == "triton":
        return int(rule.maxb), float(rule.delay), tuple(int(x) for x in rule.pref)
    if server == "ray" and mode == "ray":
        return int(rule.maxb), float(rule.delay), ()
    want = "triton:max=B,delay_us=D[,preferred=…]" if server == "triton" else "ray:max=B,timeout_s=T"
    raise InputError(f"calibration on {server} runs its own batcher: give its setting as {want} (what export "
                     f"--to {server} writes), not {getattr(rule, 'spec', rule)!r}")


def _to_run(lam_per_s: float, run, server: str, probe: bool = False) -> CalibrationRun:
    n = run.latency_ms.size
    if server == "triton":  # the run's clock is the client's: arrival = sent, latency = sent → answered
        sent, lat, entered = run.arrival_ms, run.latency_ms, None
    else:  # Ray's run is on the replica's clock (arrival = replica entry); the client's view is in its notes
        sent, lat, entered = run.notes["sent_ms"], run.notes["client_ms"], run.arrival_ms
    sent = np.asarray(sent, dtype=np.float64)
    zero = float(np.nanmin(sent))  # the first send is time 0 (Ray's clock starts at the first replica entry)
    times = {k: (a - zero, b - zero) for k, (a, b) in run.batch_times.items()}
    return CalibrationRun(lam_per_s, sent - zero, np.asarray(lat, dtype=np.float64), run.batch_of,
                          run.notes.get("position", np.full(n, -1)), run.batches, times, run.notes.get("lag_ms"),
                          run.errors, run.wall_s, None if entered is None else np.asarray(entered) - zero,
                          probe=probe)


def _idle_power() -> float | None:
    from ..measure.energy import energy_source, idle_power_w

    counter = energy_source("auto", None, 0)
    return None if isinstance(counter, str) else idle_power_w(counter, lambda: False)


def _http_runs(url: str, body: bytes, streams, max_seconds: float, say) -> list[CalibrationRun]:
    """POST ``body`` to ``url`` on each stream's schedule (httpx, one connection pool, open loop); a run per load
    with the client's times only (an endpoint reports no batches)."""
    import asyncio

    httpx = require("httpx", "calibrate --server http")
    from .loadgen import replay, send_lag_ms

    async def one(arr):
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits) as client:
            async def send(i: int):
                r = await client.post(url, content=body, headers={"content-type": "application/json"})
                r.raise_for_status()

            t0 = time.perf_counter()
            out = await replay(send, arr, 1.0, max_seconds)
            return out + (time.perf_counter() - t0,)

    asyncio.run(one(streams[0][1][:20]))  # warm the path: connections, the server's first batch
    runs = []
    for x, arr in streams:
        say(f"calibrating {url} at {x:g} req/s: {arr.size} requests, about {arr[-1] / 1000.0:.3g} s")
        sent, done, _, errors, wall = asyncio.run(one(arr))
        if errors == arr.size:
            raise InputError(f"calibration: every request to {url} failed (is the server up, and does it take "
                             "the --body given?)")
        zero = float(np.nanmin(sent))
        runs.append(CalibrationRun(x, (sent - zero) * 1000.0, (done - sent) * 1000.0,
                                   lag_ms=send_lag_ms(sent, arr, 1.0), errors=errors, wall_s=wall))
    return runs


def calibrate(problem, rule, loads_per_s, *, slo_ms: float | None = None, seed: int = 0, earlier=(),
              **run_options) -> ServedDelay:
    """Run ``rule`` on the real ``server`` at each load (req/s) at real speed and fit what it adds (module doc):
    :func:`calibration_runs` (``run_options``: its keywords), then :func:`~smdp_batch.analysis.served.fit_served`
    with ``slo_ms`` (a load where the fastest response alone reaches it is not carried).  ``earlier``: runs of earlier
    calibrations on the same server and loads (of other settings, each run naming its own), pooled with these."""
    runs, source, idle = calibration_runs(problem, rule, loads_per_s, seed=seed, **run_options)
    return fit_served(problem, rule, [*earlier, *runs], slo_ms=slo_ms, seed=seed, idle_power_w=idle, source=source)


def calibration_runs(problem, rule, loads_per_s, *, server: str = "triton", onnx_path: str = "", requests: int = 2000,
                     seed: int = 0, max_seconds: float = 120.0, num_cpus: int = 2, repeats: int = 1, url: str = "",
                     body: bytes = b"{}", progress: Callable[[str], None] | None = None
                     ) -> tuple[list[CalibrationRun], dict, float | None]:
    """Run ``rule`` on the real ``server`` at each load (req/s) at real speed: (the runs, each naming ``rule``;
    where and how they were measured; the idle power read, W, or None).

    ``problem``: l(b) (what the stand-in sleeps, and what plans use) and ζ(b).  ``onnx_path``: run this ONNX
    model on the CPU instead of the stand-in (its input [N, D] float32).  ``requests``: per load and run (≥ 200).
    ``repeats``: runs per load, the loads taken in turn (low → high, then again) on fresh streams, each round on a
    fresh deployment of the server (module doc, *Repeats*): the fit pools them and measures how far a run's p99
    lands from its plan on this host between runs and deployments (one run shows only its own requests' spread).
    ``server="http"``: your own deployed endpoint at ``url`` (Triton's or Ray Serve's HTTP front end, or any
    other), POSTed ``body`` (JSON) at each load; ``rule`` is how it batches.  It reports no batches, so the fit
    takes the outside delay as the residual measured − simulated, request by request (wider than the other
    servers' split: the plan errs on the safe side).
    """
    if server not in SERVERS:
        raise InputError(f"server {server!r} is not calibrated here; valid: {', '.join(SERVERS)}")
    if server == "http" and not url.startswith(("http://", "https://")):
        raise InputError(f"calibration over HTTP needs the endpoint's URL (http://HOST:PORT/PATH), got {url!r}")
    maxb, delay_ms, pref = server_setting(rule, server)
    loads = sorted(float(x) for x in loads_per_s)
    if not loads or any(not (math.isfinite(x) and x > 0) for x in loads) or len(set(loads)) != len(loads):
        raise InputError(f"calibration loads must be distinct req/s > 0, got {list(loads_per_s)}")
    if not 200 <= int(requests) <= 200_000:
        raise InputError(f"calibration requests per load must be 200..200000, got {requests!r}")
    if not (math.isfinite(max_seconds) and 1 <= max_seconds <= 3600):
        raise InputError(f"max_seconds must be 1..3600 s, got {max_seconds!r}")
    say = progress or (lambda _: None)
    lat = dict(zip(problem.batch_sizes, (float(x) for x in problem.latency_ms())))
    pad = rule.pad_map(maxb)
    pad_to = {b: int(pad[b]) for b in range(1, maxb + 1) if int(pad[b]) != b}
    if not 1 <= int(repeats) <= 10:
        raise InputError(f"calibration repeats (runs per load) must be 1..10, got {repeats!r}")
    # run k of load i on stream seed + i + 1000·k: the first run's streams are those of a calibration without repeats
    streams = [(x, poisson_arrivals(x / 1000.0, int(requests), np.random.default_rng(seed + i + 1000 * k)))
               for k in range(int(repeats)) for i, x in enumerate(loads)]
    idle = _idle_power()
    runs: list[CalibrationRun] = []
    t0 = time.time()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    bursts = burst_arrivals(maxb, delay_ms, lat[max(b for b in lat if b <= maxb)])
    warm = poisson_arrivals(0.1 * loads[0] / 1000.0, 20, np.random.default_rng(seed))  # connections, a first batch

    def deployment(k: int, run_load: Callable, name: str) -> None:
        """Deployment k's runs: each load in turn (module doc, *Repeats*), then the bursts."""
        run_load(warm)
        for x, arr in streams[k * len(loads):(k + 1) * len(loads)]:
            say(f"calibrating {name} at {x:g} req/s: {arr.size} requests, about {arr[-1] / 1000.0:.3g} s")
            runs.append(_to_run(x, run_load(arr), server))
        say(f"calibrating {name}: {PROBE_BURSTS} bursts of {3 * maxb} requests at once (the time between batches)")
        runs.append(_to_run(0.0, run_load(bursts), server, probe=True))
        for run in runs[-len(loads) - 1:]:
            run.deployment = f"{server}@{date}#{k}"

    if server == "http":
        runs = _http_runs(url, body, streams, max_seconds, say)
        for run in runs:  # one deployment, yours
            run.deployment = f"{server}@{date}#0"
    elif server == "triton":
        from .triton import ModelSpec, TritonServer, run_load

        spec = ModelSpec(maxb, delay_ms * 1000.0, pref, lat, pad_to, problem.instances, onnx_path)
        for k in range(int(repeats)):  # a deployment per repeat (module doc, *Repeats*)
            with TritonServer({"calibrate": spec}, 1.0) as srv:
                deployment(k, lambda arr, srv=srv: run_load(srv, "calibrate", arr, max_seconds=max_seconds), "Triton")
    else:
        from .ray_serve import RayServe, stub_deployment
        from .ray_serve import run_load as ray_run_load

        for k in range(int(repeats)):
            with RayServe(num_cpus=num_cpus) as rs:
                h = rs.deploy(stub_deployment("calibrate", lat, 1.0, serve_batch=(maxb, delay_ms / 1000.0),
                                              pad_to=pad_to, onnx_path=onnx_path), "calibrate")
                deployment(k, lambda arr, h=h: ray_run_load(h, arr, 1.0, max_seconds=max_seconds), "Ray Serve")
    model = url if server == "http" else onnx_path or "stand-in sleeping l(b)"
    source = {"server": server, "model": model, "setting": rule.spec,
              "time_scale": 1.0, "requests_per_load": int(requests), "runs_per_load": int(repeats), "seed": int(seed),
              "date": date, "seconds": round(time.time() - t0, 2),
              "idle_power": "read from the energy counter" if idle is not None else "no energy counter here"}
    if server != "http":
        source["probe_bursts"] = PROBE_BURSTS * int(repeats)
    for run in runs:
        run.rule = rule
    return runs, source, idle
