"""Run the example server under Poisson load and compare with the model (bounded; 127.0.0.1 only).

For each load ρ: solve the table (paper 004 basic scenario, w2 = 1.6), start the HTTP server with the
DynamicBatcher, send Poisson traffic, and compare the measured mean latency and power with the exact
W̄ and P̄ of the same table.  Then the same traffic goes to a Ray-Serve-style timeout batcher whose
batch_wait_timeout_s is the `smdp-batch export --to ray` setting for that table; its model figures come
from smdp-batch's simulator.

    python examples/run_demo.py                 # ρ = 0.5 and 0.7, 2000 requests each, scale 50
    python examples/run_demo.py --requests 400 --rhos 0.5 --no-ray
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loadgen import run_load  # noqa: E402

from smdp_batch import BatchingProblem, solve  # noqa: E402
from smdp_batch.baselines.servers import ray_serve  # noqa: E402
from smdp_batch.export.configs import export_policy  # noqa: E402
from smdp_batch.export.hdf5 import write_policy  # noqa: E402
from smdp_batch.analysis.simulate import simulate  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "model_server.py"), "--port", str(port), *args])
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the example server did not start")


def run(rhos, requests: int, scale: float, seed: int, with_ray: bool, w2: float = 1.6) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rho in rhos:
            problem = BatchingProblem.basic(rho=rho, w2=w2)
            sol = solve(problem)
            path = os.path.join(tmp, f"rho{rho}.h5")
            write_policy(sol, path)
            configs = [("smdp-table", [], sol.deployed.mean_latency_ms, sol.deployed.mean_power_w)]
            if with_ray:
                t = export_policy(problem, sol, "ray", requests=100_000).settings["batch_wait_timeout_s"]
                sim = simulate(problem, ray_serve(problem.bmax, t), requests=1_000_000, seed=seed)
                configs.append((f"ray-style timeout_s={t:g}", ["--ray-max", str(problem.bmax), "--ray-timeout-s", str(t)],
                                sim.mean_latency_ms, sim.mean_power_w))
            for name, extra, model_w, model_p in configs:
                proc, url = _serve(["--policy", path, "--scale", str(scale), "--seed", str(seed), *extra])
                try:
                    m = asyncio.run(run_load(url, problem.lam, requests, scale, seed))
                finally:
                    proc.terminate()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                rows.append({"rho": rho, "batcher": name, "requests": m["requests"], "errors": m["errors"],
                             "measured_latency_ms": m["mean_latency_ms"], "model_latency_ms": model_w,
                             "latency_ratio": m["mean_latency_ms"] / model_w, "latency_se_ms": m["latency_se_ms"],
                             "measured_power_w": m["mean_power_w"], "model_power_w": model_p,
                             "power_ratio": m["mean_power_w"] / model_p, "power_se_w": m["power_se_w"], "client_latency_ms": m["mean_client_latency_ms"],
                             "p95_latency_ms": m["p95_latency_ms"], "mean_batch_size": m["mean_batch_size"],
                             "overrun_ms": m["server"].get("mean_overrun_ms", 0.0) / scale,
                             "max_overrun_ms": m["server"].get("max_overrun_ms", 0.0) / scale,
                             "send_late_max_ms": m["send_late_max_ms"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rhos", default="0.5,0.7")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--scale", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = run([float(x) for x in a.rhos.split(",")], a.requests, a.scale, a.seed, not a.no_ray)
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'ρ':>4} {'batcher':<28}{'W̄ meas':>9}{'W̄ model':>10}{'ratio':>7}{'P̄ meas':>9}{'P̄ model':>10}{'ratio':>7}"
          f"{'p95':>8}{'mean b':>8}")
    for r in rows:
        print(f"{r['rho']:>4} {r['batcher']:<28}{r['measured_latency_ms']:>9.3f}{r['model_latency_ms']:>10.3f}"
              f"{r['latency_ratio']:>7.3f}{r['measured_power_w']:>9.2f}{r['model_power_w']:>10.2f}{r['power_ratio']:>7.3f}"
              f"{r['p95_latency_ms']:>8.2f}{r['mean_batch_size']:>8.2f}")
    print("times in model ms (measured ÷ scale), power in model W; latency measured in the server, per request")


if __name__ == "__main__":
    main()
