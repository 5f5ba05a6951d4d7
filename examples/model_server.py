"""An HTTP model server that batches with smdp-batch's DynamicBatcher (or, for comparison, a
Ray-Serve-style timeout batcher).

The "model" is a stub that behaves like the one in the policy file: a batch of b takes l(b)·scale ms,
drawn from the file's service law, and books ζ(b) mJ of energy.  ``--scale`` slows time down (and the
load generator divides the rate by the same factor), so that the HTTP stack's own millisecond of
overhead does not swamp a model whose batches take ~1–10 ms; measured times are divided by the scale
when compared with the model.

    python examples/model_server.py --policy policy.h5 --port 8000 [--scale 50]
    python examples/model_server.py --policy policy.h5 --ray-max 32 --ray-timeout-s 0.002 --port 8001

Endpoints: POST /infer {"x": <anything>} → {"y": …, "server_ms": …, "energy_mj": the request's share of its batch's
energy}; GET /metrics; GET /health.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time

import numpy as np
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from smdp_batch.model.spec import parse_service
from smdp_batch.runtime import DynamicBatcher, PolicyTable


class RayStyleBatcher:
    """Ray Serve's ``@serve.batch`` queue (ray/serve/batching.py ``_BatchQueue``): after each batch, wait up
    to ``timeout_s`` for ``max_batch_size`` requests, then take up to that many; one batch at a time."""

    def __init__(self, infer, max_batch_size: int, timeout_s: float):
        self.infer, self.max, self.timeout = infer, int(max_batch_size), float(timeout_s)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.full = asyncio.Event()
        self.task = None

    async def submit(self, item):
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._loop())
        fut = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((item, fut))
        if self.queue.qsize() >= self.max:
            self.full.set()
        return await fut

    async def _loop(self):
        while True:
            batch, left = [], self.timeout
            while not batch:
                start = time.perf_counter()
                if left == 0:
                    batch.append(await self.queue.get())
                else:
                    try:
                        await asyncio.wait_for(self.full.wait(), left)
                    except asyncio.TimeoutError:
                        pass
                while len(batch) < self.max and not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                if self.queue.qsize() < self.max:
                    self.full.clear()
                left = max(0.0, left - (time.perf_counter() - start))
            try:
                out = await self.infer([x for x, _ in batch])
                for (_, f), y in zip(batch, out):
                    if not f.done():
                        f.set_result(y)
            except Exception as e:  # noqa: BLE001 - forwarded to the callers of this batch
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)


class Item(BaseModel):
    x: float = 0.0


def build_app(policy_path: str, scale: float, seed: int, ray: tuple[int, float] | None) -> FastAPI:
    table = PolicyTable.load(policy_path)
    inputs = table.meta["inputs"]
    sizes = [int(b) for b in inputs["batch_sizes"]]
    lat = dict(zip(sizes, inputs["latency_ms"]))
    energy = dict(zip(sizes, inputs["energy_mj"]))
    law = parse_service(inputs["service"])
    rng = np.random.default_rng(seed)
    stats = {"energy_mj": 0.0, "batches": 0, "served": 0, "started": None, "server_ms": [], "overrun_ms": 0.0,
             "max_overrun_ms": 0.0}

    async def infer(xs: list) -> list:
        b = len(xs)
        if b not in lat:
            raise ValueError(f"batch size {b} is not allowed by the policy file")
        if stats["started"] is None:
            stats["started"] = time.perf_counter()
        ms = float(law.sample(rng, lat[b], 1, b)[0]) * scale
        t_sleep = time.perf_counter()
        await asyncio.sleep(ms / 1000.0)
        late = (time.perf_counter() - t_sleep) * 1e3 - ms  # the event loop's lateness
        stats["overrun_ms"] += late
        stats["max_overrun_ms"] = max(stats["max_overrun_ms"], late)
        stats["energy_mj"] += energy[b]
        stats["batches"] += 1
        stats["served"] += b
        return [(2.0 * x, energy[b] / b) for x in xs]  # each request's result and its share of the batch's energy

    # safety bound for traffic that stops (the table alone would wait for the next arrival for ever)
    max_wait = 20.0 * float(max(lat.values())) * scale
    batcher = RayStyleBatcher(infer, *ray) if ray else DynamicBatcher(infer, table, max_wait_ms=max_wait)
    app = FastAPI(title="smdp-batch example model server")

    @app.post("/infer")
    async def do_infer(item: Item):
        t0 = time.perf_counter()
        y, energy_mj = await batcher.submit(item.x)
        ms = (time.perf_counter() - t0) * 1e3
        stats["server_ms"].append(ms)
        return {"y": y, "server_ms": ms, "energy_mj": energy_mj}

    @app.get("/metrics")
    async def metrics():
        elapsed = time.perf_counter() - stats["started"] if stats["started"] else 0.0
        s = np.asarray(stats["server_ms"])
        return {
            "batcher": "ray-style" if ray else "smdp-table", "scale": scale, "served": stats["served"],
            "batches": stats["batches"], "energy_mj": stats["energy_mj"], "elapsed_s": elapsed,
            "mean_overrun_ms": stats["overrun_ms"] / max(stats["batches"], 1), "max_overrun_ms": stats["max_overrun_ms"],
            "forced_batches": getattr(getattr(batcher, "metrics", None), "forced_batches", 0),
            "mean_server_ms": float(s.mean()) if s.size else None,
            "p95_server_ms": float(np.percentile(s, 95)) if s.size else None,
        }

    @app.get("/health")
    async def health():
        return {"ok": True}

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True, help="HDF5 policy table (its model: l(b), ζ(b), service law)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--scale", type=float, default=50.0, help="time slow-down factor of the model stub")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ray-max", type=int, default=None, help="use a Ray-style timeout batcher with this max size")
    ap.add_argument("--ray-timeout-s", type=float, default=0.0, help="its batch_wait_timeout_s (model time)")
    a = ap.parse_args()
    ray = (a.ray_max, a.ray_timeout_s * a.scale) if a.ray_max else None
    app = build_app(a.policy, a.scale, a.seed, ray)
    gc.collect()  # the app is built: freeze what is alive, so that a full garbage collection no longer walks it and
    gc.freeze()  # stops the event loop (docs/how-to/runtime.md)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
