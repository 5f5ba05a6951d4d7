"""Bounded Poisson load generator for the example server (127.0.0.1 only; count- and time-limited).

    python examples/loadgen.py --url http://127.0.0.1:8000 --lam 1.4793 --requests 2000 --scale 50

``--lam`` is in requests per model-ms (as in the policy file); with ``--scale k`` requests are sent at
λ/k per ms of wall time and measured times are divided by k, i.e. reported in model ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from urllib.parse import urlparse

import httpx
import numpy as np


def batch_means_se(x: np.ndarray, batches: int = 10) -> float:
    """Standard error of the mean of ``x`` (in arrival order) by batch means: consecutive requests share a
    queue, so their latencies are correlated and the naive σ/√n understates the run's own noise."""
    x = x[~np.isnan(x)]
    if x.size < 2 * batches:
        return float("inf")
    means = np.array([part.mean() for part in np.array_split(x, batches)])
    return float(means.std(ddof=1) / np.sqrt(batches))


async def run_load(url: str, lam: float, requests: int, scale: float, seed: int = 0, warmup: float = 0.1,
                   cooldown: float = 0.05, max_seconds: float = 300.0) -> dict:
    """Send ``requests`` requests with Poisson arrivals; return latencies and energy in model units.

    The first ``warmup`` and last ``cooldown`` shares of requests are left out of the latency figures
    (the queue starts empty, and the last ones wait for arrivals that never come).
    """
    if urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError("the load generator only targets this machine (127.0.0.1 / localhost)")
    gaps_s = np.random.default_rng(seed).exponential(1.0 / lam, requests) * scale / 1000.0
    send_at = np.cumsum(gaps_s)
    server_ms = np.full(requests, np.nan)
    client_ms = np.full(requests, np.nan)
    energy_mj = np.full(requests, np.nan)
    late_ms = np.full(requests, np.nan)  # how late each request left the client, in model ms
    errors = 0
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        t0 = time.perf_counter()

        async def one(i: int):
            nonlocal errors
            start = time.perf_counter()
            late_ms[i] = (start - t0 - send_at[i]) * 1e3 / scale
            try:
                r = await client.post("/infer", json={"x": float(i)})
                r.raise_for_status()
                body = r.json()
                server_ms[i] = body["server_ms"] / scale
                energy_mj[i] = body.get("energy_mj", np.nan)
                client_ms[i] = (time.perf_counter() - start) * 1e3 / scale
            except httpx.HTTPError:
                errors += 1

        tasks = []
        for i, t in enumerate(send_at):
            if t > max_seconds:
                break
            delay = t - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=max_seconds + 60)
        span_model_ms = (send_at[len(tasks) - 1] - send_at[0]) * 1000.0 / scale
        metrics = (await client.get("/metrics")).json()
    w, e = int(warmup * len(tasks)), len(tasks) - int(cooldown * len(tasks))
    s, c = server_ms[w:e], client_ms[w:e]
    power = float(metrics["energy_mj"] / span_model_ms)
    # the run's own noise in P̄ = (N / span)·(mean energy share): the shares' batch means, and the span of N
    # Poisson arrivals (relative σ 1/√N)
    shares = energy_mj[: len(tasks)]
    rel = np.hypot(batch_means_se(shares) / np.nanmean(shares), 1.0 / np.sqrt(max(len(tasks) - 1, 1)))
    return {
        "latency_se_ms": batch_means_se(s), "power_se_w": float(power * rel),
        "requests": len(tasks), "errors": errors, "measured": int(np.sum(~np.isnan(s))),
        "mean_latency_ms": float(np.nanmean(s)), "p95_latency_ms": float(np.nanpercentile(s, 95)),
        "mean_client_latency_ms": float(np.nanmean(c)),
        "mean_power_w": power, "send_late_p99_ms": float(np.nanpercentile(late_ms, 99)),
        "send_late_max_ms": float(np.nanmax(late_ms)), "mean_batch_size": metrics["served"] / max(metrics["batches"], 1),
        "server": metrics,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--lam", type=float, required=True, help="arrival rate in requests per model-ms")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--scale", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    a = ap.parse_args()
    out = asyncio.run(run_load(a.url, a.lam, a.requests, a.scale, a.seed, max_seconds=a.max_seconds))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
