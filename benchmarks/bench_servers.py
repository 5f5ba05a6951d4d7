"""Model vs real server: Triton (PyTriton's binary) and Ray Serve under the same time-scaled Poisson streams.

For each setting the simulator runs the same rule on the same arrival times (what the client sent for
Triton; what entered the replica for Ray), so the ratios measure the batcher's rule plus the server's own
overhead, not sampling noise.  Then the users' comparison at one load: the table (Ray: our batcher inside
Serve; Triton: the exported config) against hand-picked settings, Triton's documented tuning recipe
(`triton_recipe`: raise the delay until the latency budget is exceeded) and `compare`'s best-tuned ones.

    python benchmarks/bench_servers.py [--scale 50] [--requests 400] [--only triton|ray]

Needs `pip install -e ".[triton,ray]"`; 127.0.0.1 only; about 3–4 minutes on 2 cores
(the Triton part alone, with the recipe, 160 s).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from smdp_batch import BatchingProblem, solve
from smdp_batch.analysis.slo import optimise
from smdp_batch.analysis.simulate import poisson_arrivals
from smdp_batch.baselines.servers import ray_serve, triton
from smdp_batch.export.configs import export_policy
from smdp_batch.integrations.loadgen import compare
from smdp_batch.runtime import PolicyTable


def _table(problem):
    sol = solve(problem)
    return sol, np.asarray(sol.policy)[: sol.s_max + 1]


RECIPE_RHO, RECIPE_BUDGET_P95_MS = 0.7, 10.0
RECIPE_DELAYS_MS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # model ms, doubling


def recipe_models(p, delays_ms=RECIPE_DELAYS_MS, max_batch_size: int = 32) -> dict:
    """One Triton model per step of the recipe: max_batch_size, no preferred sizes, the step's delay."""
    from smdp_batch.integrations.triton import ModelSpec

    lat = dict(zip(p.batch_sizes, p.latency_ms()))
    return {f"recipe{i}": ModelSpec(max_batch_size, d * 1000.0, (), lat) for i, d in enumerate(delays_ms)}


def triton_recipe(srv, p, rho: float, names: list, n: int, seed: int, budget_p95_ms: float = RECIPE_BUDGET_P95_MS,
                  delays_ms=RECIPE_DELAYS_MS, max_batch_size: int = 32) -> tuple[list[dict], dict]:
    """Triton's documented tuning recipe (user guide, "Dynamic Batcher: Recommended Configuration Process"),
    run on the real server: the default dynamic batcher (max batch size, no delay, no preferred sizes) first;
    then delays on a doubling grid, each on the same seeded stream, stopping at the first whose measured p95
    exceeds the budget.  The pick is the last delay within budget (delay 0 if even that is over budget, the
    row then says so).  Open loop at a fixed load, throughput is the arrival rate whatever the delay, so the
    budget is the only stopping rule.  Returns (steps, the pick's row with measured and modelled figures).
    """
    from smdp_batch.integrations.triton import run_load

    steps, pick = [], None
    for i, d in enumerate(delays_ms):
        rule = triton(max_batch_size, d * 1000.0)
        run = run_load(srv, names[i], poisson_arrivals(p.lam, n, np.random.default_rng(seed)))
        c = compare(p, rule, run)
        m, s = c["measured"], c["model"]
        ok = run.errors == 0 and m["answered"] == m["requests"] and m["p95_ms"] <= budget_p95_ms
        steps.append({"delay_ms": d, "within_budget": ok, "p95_meas": m["p95_ms"], "p95_model": s["p95_ms"],
                      "w_meas": m["mean_latency_ms"], "w_model": s["mean_latency_ms"],
                      "power_meas": m["mean_power_w"], "power_model": s["mean_power_w"],
                      "batch_meas": m["mean_batch_size"], "batch_model": s["mean_batch_size"]})
        if not ok:
            break
        pick = (d, rule, run, c)
    over = pick is None  # the default batcher is already over budget: the recipe adds no delay
    d, rule, run, c = (delays_ms[0], rule, run, c) if over else pick
    label = f"hand-tuned (Triton recipe): delay {d:g} ms" + (", over budget" if over else "")
    row = _row("triton", rho, label, rule.spec, run, c)
    row["recipe_steps"] = steps
    return steps, row


def triton_rows(scale: float, n: int, seed: int) -> list[dict]:
    from smdp_batch.integrations.triton import ModelSpec, TritonServer, run_load

    rows, models, plan = [], {}, []
    for rho in (0.5, 0.7):
        p = BatchingProblem.basic(rho=rho, w2=1.6)
        lat = dict(zip(p.batch_sizes, p.latency_ms()))
        sol, pol = _table(p)
        ex = export_policy(p, sol, "triton", requests=100_000)
        s = ex.settings
        best = optimise(p, {"p95": 10.0}, families=("triton",), requests=100_000,
                        defaults=False).best if rho == 0.7 else {}
        rules = [("export (table)", ex.rule), ("delay 0", triton(32, 0)), ("delay 2 ms", triton(32, 2000)),
                 ("delay 5 ms, preferred 8/16/32", triton(32, 5000, (8, 16, 32)))]
        if best.get("triton"):
            d = best["triton"].knobs["delay_us"]
            rules.append(("best-tuned at p95 ≤ 10 ms", triton(32, d)))
        for label, rule in rules:
            name = f"m{len(models)}"
            models[name] = ModelSpec(rule.maxb, rule.delay * 1000.0, tuple(int(x) for x in rule.pref), lat)
            plan.append((rho, p, sol, label, rule, name))
        del s
    p_recipe = BatchingProblem.basic(rho=RECIPE_RHO, w2=1.6)
    recipe = recipe_models(p_recipe)
    models.update(recipe)
    with TritonServer(models, scale) as srv:
        for rho, p, sol, label, rule, name in plan:
            run = run_load(srv, name, poisson_arrivals(p.lam, n, np.random.default_rng(seed)))
            c = compare(p, rule, run)
            rows.append(_row("triton", rho, label, rule.spec, run, c))
            if label.startswith("export"):  # the table itself on the same stream, as the export's target
                t = compare(p, np.asarray(sol.policy)[: sol.s_max + 1], run)
                rows[-1]["table_model"] = {k: t["model"][k] for k in ("mean_latency_ms", "p95_ms", "mean_batch_size", "mean_power_w")}
        rows.append(triton_recipe(srv, p_recipe, RECIPE_RHO, list(recipe), n, seed)[1])
    return rows


def ray_rows(scale: float, n: int, seed: int) -> list[dict]:
    from smdp_batch.integrations.ray_serve import RayServe, run_load, stub_deployment

    rows = []
    with RayServe() as rs:
        for rho in (0.5, 0.7):
            p = BatchingProblem.basic(rho=rho, w2=1.6)
            lat = dict(zip(p.batch_sizes, p.latency_ms()))
            sol, pol = _table(p)
            t = export_policy(p, sol, "ray", requests=100_000).settings["batch_wait_timeout_s"]
            cases = [("table (table_batch)", dict(table=PolicyTable(pol, p.batch_sizes), max_wait_ms=30.0), pol),
                     (f"export timeout {t:g} s", dict(serve_batch=(32, t)), ray_serve(32, t)),
                     ("max 32, timeout 2 ms", dict(serve_batch=(32, 0.002)), ray_serve(32, 0.002)),
                     ("defaults max 10, timeout 0.01 s", dict(serve_batch=(10, 0.01)), ray_serve(10, 0.01))]
            for i, (label, kw, rule) in enumerate(cases):
                name = f"r{int(rho * 10)}{i}"
                h = rs.deploy(stub_deployment(name, lat, scale, **kw), name)
                run = run_load(h, poisson_arrivals(p.lam, n, np.random.default_rng(seed)), scale)
                rs.delete(name)
                spec = "table" if isinstance(rule, np.ndarray) else rule.spec
                rows.append(_row("ray", rho, label, spec, run, compare(p, rule, run)))
    return rows


def _row(server, rho, label, spec, run, c) -> dict:
    return {"server": server, "rho": rho, "setting": label, "rule": spec, "errors": run.errors,
            "answered": c["measured"]["answered"], "requests": c["measured"]["requests"], "wall_s": run.wall_s,
            "overhead_ms": run.notes.get("overhead_ms"),
            "measured": {k: v for k, v in c["measured"].items()}, "model": {k: v for k, v in c["model"].items()},
            "ratios": {k: v for k, v in c.items() if k.endswith("ratio")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=50.0)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=("triton", "ray"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    rows = []
    if a.only != "ray":
        rows += triton_rows(a.scale, a.requests, a.seed)
    if a.only != "triton":
        rows += ray_rows(a.scale, a.requests, a.seed)
    if a.json:
        print(json.dumps(rows, indent=1, default=str))
        return
    print(f"scale {a.scale:g}, {a.requests} requests per row (5 % warm-up and cool-down left out), seed {a.seed}; "
          "model = our simulator, same rule, same arrival times")
    print("| server | ρ | setting | W̄ meas / model [ms] | ratio | p95 meas / model | ratio | mean batch meas / model | "
          "ratio | P̄ meas / model [W] | ratio | answered |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m, s, q = r["measured"], r["model"], r["ratios"]
        print(f"| {r['server']} | {r['rho']} | {r['setting']} | {m['mean_latency_ms']:.3f} / {s['mean_latency_ms']:.3f} | "
              f"{q['latency_ratio']:.3f} | {m['p95_ms']:.2f} / {s['p95_ms']:.2f} | {q['p95_ratio']:.3f} | "
              f"{m['mean_batch_size']:.2f} / {s['mean_batch_size']:.2f} | {q['batch_size_ratio']:.3f} | "
              f"{m['mean_power_w']:.2f} / {s['mean_power_w']:.2f} | {q['power_w_ratio']:.3f} | "
              f"{r['answered']}/{r['requests']}, {r['errors']} errors |")
        if "table_model" in r:
            t = r["table_model"]
            print(f"|  |  | ↳ the table itself (model, same stream) | {t['mean_latency_ms']:.3f} | | {t['p95_ms']:.2f} | | "
                  f"{t['mean_batch_size']:.2f} | | {t['mean_power_w']:.2f} | | |")
    for r in rows:
        if "recipe_steps" in r:
            print(f"Triton recipe at ρ = {r['rho']} (max_batch_size 32, no preferred sizes, budget p95 ≤ "
                  f"{RECIPE_BUDGET_P95_MS:g} ms), delay → p95 meas / model [ms], W̄ meas, P̄ meas: " + "; ".join(
                      f"{st['delay_ms']:g} ms → {st['p95_meas']:.2f} / {st['p95_model']:.2f}, {st['w_meas']:.3f}, "
                      f"{st['power_meas']:.2f} W" + ("" if st["within_budget"] else " (over budget: stop)")
                      for st in r["recipe_steps"]) + f"; pick: {r['setting']}")
    print("overheads outside the batcher (model ms): " + ", ".join(
        f"{r['server']} {r['setting']}: {r['overhead_ms']:.3f}" for r in rows if r["overhead_ms"] is not None))
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
