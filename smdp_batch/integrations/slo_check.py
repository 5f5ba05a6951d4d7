"""Settings exported with an SLO and a load range, run on the real servers (Triton, Ray Serve) on 127.0.0.1.

:func:`check_exports` plans a Triton config (preferred sizes + max_queue_delay) and a Ray Serve
``@serve.batch`` setting with :func:`smdp_batch.analysis.slo.optimise` — what ``export --to triton|ray
--slo-p99-ms X --load-range LO:HI`` writes — then replays a bounded Poisson stream at the low, middle and
high load of the range through each real server (stub model sleeping l(b)·scale, as
:mod:`.triton` and :mod:`.ray_serve` run it) and reports the measured p99 and P̄ beside the simulated ones.

The plan keeps ``headroom`` (default 10 %) of the bound for the server's own time: its gRPC legs and
batch hand-offs add a few percent to every response (docs: how-to/triton.md and how-to/ray-serve.md), which the model
only knows when l(b) is profiled as the server serves it.
"""

from __future__ import annotations

import numpy as np

from ..analysis.simulate import poisson_arrivals
from ..analysis.slo import optimise
from ..model.problem import BatchingProblem
from .loadgen import compare

__all__ = ["check_exports"]


def check_exports(problem: BatchingProblem, slo_p99_ms: float, lams: list[float], *, targets=("triton", "ray"),
                  headroom: float = 0.1, scale: float = 50.0, requests: int = 400, seed: int = 1,
                  plan_requests: int = 100_000) -> list[dict]:
    """One row per target × load (low, middle, high of ``lams``): the exported setting, the measured and the
    simulated (same stream) p99 and P̄, and whether the measured p99 meets the SLO."""
    family = {"triton": "triton-preferred", "ray": "ray"}
    plan = optimise(problem.replace(lam=lams[-1]), {"p99": slo_p99_ms * (1.0 - headroom)}, lams,
                    families=tuple(family[t] for t in targets), requests=plan_requests, seed=seed, defaults=False)
    lat = dict(zip(problem.batch_sizes, problem.latency_ms()))
    picks = [lams[0], lams[len(lams) // 2], lams[-1]]
    rows = []
    for target in targets:
        s = plan.best[family[target]]
        if s is None:
            rows.append({"target": target, "setting": None})
            continue
        rule = s.rule
        planned = {x.lam: x for x in s.loads}
        for lam, run in _runs(target, rule, lat, scale, picks, requests, seed):
            c = compare(problem.replace(lam=lam), rule, run)  # measured beside simulated on the same stream
            rows.append({
                "target": target, "setting": s.spec, "lam": lam, "load_per_s": lam * 1e3,
                "answered": int(np.isfinite(run.latency_ms).sum()), "requests": int(run.latency_ms.size),
                "errors": run.errors, "p99_ms": c["measured"]["p99_ms"], "p99_model_ms": c["model"]["p99_ms"],
                "p99_planned_ms": planned[lam].metrics["p99"], "mean_power_w": c["measured"]["mean_power_w"],
                "mean_power_model_w": c["model"]["mean_power_w"], "mean_power_planned_w": planned[lam].power_w,
                "latency_ratio": c["latency_ratio"], "meets_slo": c["measured"]["p99_ms"] <= slo_p99_ms,
            })
    return rows


def _runs(target: str, rule, lat: dict, scale: float, lams, requests: int, seed: int):
    """(λ, measured Run) for each load, on one server started for the rule."""
    streams = [(lam, poisson_arrivals(lam, requests, np.random.default_rng(seed + i))) for i, lam in enumerate(lams)]
    limit = max(60.0, 2.0 * max(a[-1] for _, a in streams) * scale / 1000.0)
    if target == "triton":
        from .triton import ModelSpec, TritonServer, run_load

        spec = ModelSpec(rule.maxb, rule.delay * 1000.0, tuple(int(x) for x in rule.pref), lat)
        with TritonServer({"slo": spec}, scale) as srv:
            for lam, arr in streams:
                yield lam, run_load(srv, "slo", arr, max_seconds=limit)
        return
    from .ray_serve import RayServe, stub_deployment
    from .ray_serve import run_load as ray_run_load

    with RayServe() as rs:
        h = rs.deploy(stub_deployment("slo", lat, scale, serve_batch=(rule.maxb, rule.delay / 1000.0)), "slo")
        for lam, arr in streams:
            yield lam, ray_run_load(h, arr, scale, max_seconds=limit)
