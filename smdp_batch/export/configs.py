"""Exports of a policy table to servers that cannot load one: Triton, TF-Serving, Ray Serve, TorchServe.

No major server takes an n ↦ b table, so each export is the closest setting of the target's own
batching rule (semantics in :mod:`smdp_batch.baselines.servers`).  Each export comes with a plain
statement of what the target cannot express, and the simulated cost of that gap: the exported rule
and the table run on the same arrivals, compared on W̄, P̄ and the table's objective w1·W̄ + w2·P̄.

* **Triton** expresses a control-limit table exactly: ``preferred_batch_size = [Q, …, B]`` sends
  min(n, B) as soon as n ≥ Q (at an arrival or when the instance frees), and below Q it waits. The
  only difference is ``max_queue_delay_microseconds``, a safety timeout that the table does not have:
  we export the smallest delay whose simulated objective is within 0.1 % of the table's.  Other tables
  become "preferred = the sizes the table serves" with the delay that minimises the objective.
* **TF-Serving, Ray Serve, TorchServe** cannot wait for a queue length, only for a time; the timeout
  that minimises the simulated objective is exported (TorchServe's ``max_batch_delay`` is in whole ms).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from ..baselines.servers import ServerRule, ray_serve, table_rule, tf_serving, torchserve, triton
from ..errors import InputError
from ..model.problem import BatchingProblem
from ..runtime.table import control_limit

__all__ = ["Export", "export_policy", "rule_config", "TARGETS", "SLO_FAMILY"]

TARGETS = ("triton", "tfserving", "ray", "torchserve")
#: The rule family of :mod:`smdp_batch.analysis.slo` each target exports with an SLO (Triton: with preferred
#: sizes, the form measured to follow the model on a real Triton)
SLO_FAMILY = {"triton": "triton-preferred", "tfserving": "tfserving", "ray": "ray", "torchserve": "torchserve"}

#: What the real servers did with these exports (``benchmarks/bench_servers.py``, basic scenario at ρ = 0.5
#: and 0.7, time scale 50, 400 requests per run; docs: how-to/triton.md, "What the real Triton showed").  TF-Serving and TorchServe
#: were not run: their statements rest on the simulator alone.
MEASURED = {
    "triton": "measured on a real Triton 2.51 (benchmarks/bench_servers.py): configs exported this way ran within "
              "5 % of the simulated W̄, 1.1 % of the mean batch and 2 % of P̄ on the same streams; Triton's delay "
              "timer without preferred sizes departs from the simulated rule near saturation (W̄ +39 % at 2 ms, "
              "ρ = 0.7), a form these exports do not use",
    "ray": "measured on Ray Serve 2.60 (benchmarks/bench_servers.py): the exported @serve.batch setting ran within "
           "1.1 % of the simulated W̄ and 2 % of the mean batch and P̄; the table itself runs in Ray Serve through "
           "smdp_batch.integrations.ray_serve.table_batch (within 1 % of the model)",
}


@dataclass
class Export:
    """A target's settings, their config text, what they cannot express, and the simulated gap."""

    target: str
    settings: dict
    text: str
    limitations: list[str]
    rule: ServerRule
    gap: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"target": self.target, "settings": self.settings, "config": self.text,
                "limitations": self.limitations, "rule": self.rule.spec, "gap": self.gap}


def rule_config(target: str, rule: ServerRule, instances: int = 1) -> tuple[dict, str]:
    """(settings, config text) of a server rule in its target's own format on ``instances`` model instances
    (Triton ``instance_group``, TF-Serving ``num_batch_threads``, Ray Serve ``num_replicas``; TorchServe: 1)."""
    c = int(instances)
    if c > 1 and target == "torchserve":
        raise InputError(f"torchserve with {c} workers has no export: its workers are not simulated yet")
    b = rule.maxb
    pad = tuple(rule.allowed)
    if not (math.isfinite(rule.delay) and 0.0 <= rule.delay * 1000.0 < 2.0 ** 63):
        raise InputError(f"{rule.spec}: a waiting time of {rule.delay:g} ms has no {target} setting (its timers are "
                         "whole µs or ms below 2⁶³); give a finite, smaller bound")
    head = f"# the model pads each batch up to the next of {list(pad)}\n" if pad and target == "triton" else ""
    if target == "triton":
        us = int(round(rule.delay * 1000.0))
        pref = [int(x) for x in rule.pref]
        settings = {"max_batch_size": b, "preferred_batch_size": pref, "max_queue_delay_microseconds": us}
        text = (head + f"max_batch_size: {b}\ndynamic_batching {{\n"
                + (f"  preferred_batch_size: [ {', '.join(map(str, pref))} ]\n" if pref else "")
                + f"  max_queue_delay_microseconds: {us}\n}}\n")
        if c > 1:
            settings["instance_group_count"] = c
            text += f"instance_group [ {{ count: {c} }} ]\n"
    elif target == "tfserving":
        us = int(round(rule.delay * 1000.0))
        allowed = list(pad)
        settings = {"max_batch_size": b, "batch_timeout_micros": us, "num_batch_threads": c,
                    "max_enqueued_batches": 1_000_000, "allowed_batch_sizes": allowed}
        text = (f"max_batch_size {{ value: {b} }}\nbatch_timeout_micros {{ value: {us} }}\n"
                f"max_enqueued_batches {{ value: 1000000 }}\nnum_batch_threads {{ value: {c} }}\n"
                + "".join(f"allowed_batch_sizes: {s}\n" for s in allowed))
    elif target == "ray":
        secs = float(f"{rule.delay / 1000.0:.6g}")
        settings = {"max_batch_size": b, "batch_wait_timeout_s": secs}
        if c > 1:
            settings["num_replicas"] = c
        text = ray_module(b, secs, c)
    elif target == "torchserve":
        ms = int(round(rule.delay))
        settings = {"batch_size": b, "max_batch_delay": ms}
        text = json.dumps({"models": {"model": {"1.0": {"batchSize": b, "maxBatchDelay": ms}}}}, indent=2) + "\n"
    else:
        raise InputError(f"unknown export target {target!r}; valid: {', '.join(TARGETS)}")
    if pad and target != "tfserving":
        settings["model_pads_to"] = list(pad)
    return settings, text


def ray_module(max_batch_size: int, wait_s: float, replicas: int = 1) -> str:
    """The Ray Serve export as a Python module that imports and deploys as written: the ``@serve.batch``
    setting on a deployment whose ``infer`` is yours to fill (it returns each request as its answer until then).
    ``max_ongoing_requests`` is raised from Ray's default (5), which would cap every batch at 5 requests."""
    replicas_arg = f"num_replicas={int(replicas)}, " if int(replicas) > 1 else ""
    return f'''"""Ray Serve batching exported by smdp-batch (its output says what the setting was tuned for and meets).

Deploy with ``serve.run(BatchedModel.bind())``; put your model in ``infer`` (one answer per request, in order).
"""

from ray import serve


@serve.deployment({replicas_arg}max_ongoing_requests=10000)
class BatchedModel:
    def infer(self, batch: list) -> list:
        """Your model on one batch: one answer per request, in order."""
        return batch

    @serve.batch(max_batch_size={int(max_batch_size)}, batch_wait_timeout_s={float(wait_s)!r})
    async def __call__(self, requests: list) -> list:
        return self.infer(requests)
'''


def _objective(problem: BatchingProblem, res) -> float:
    return problem.w1 * res.mean_latency_ms + problem.w2 * res.mean_power_w


def export_policy(problem: BatchingProblem, policy, target: str, requests: int = 200_000, seed: int = 0, *,
                  reference: ServerRule | None = None, arrivals: np.ndarray | None = None) -> Export:
    """Export ``policy`` (states 0..s_max, or a Solution) for ``target``; settings tuned by simulation.

    ``reference``: the rule the table runs as, instead of ``policy`` as a pure table (a phase table passes
    its filter rule, :func:`smdp_batch.analysis.phased.phase_rule`, with ``policy`` None); ``arrivals``: the
    stream (ms) both run on, instead of Poisson at ``problem.lam`` (a phase table: a sample of its MAP)."""
    from ..analysis.simulate import poisson_arrivals, simulate

    if target not in TARGETS:
        raise InputError(f"unknown export target {target!r}; valid: {', '.join(TARGETS)}")
    sizes = problem.batch_sizes
    if reference is None:
        if hasattr(policy, "policy") and hasattr(policy, "s_max"):
            policy = np.asarray(policy.policy)[: policy.s_max + 1]
        table = table_rule(policy, sizes, spec="table")
        p = table.table
        b = int(p.max())
        q = control_limit(p, sizes)
        served = sorted({int(a) for a in p if a > 0})
    else:  # a rule that looks at more than the queue length: no single control limit
        table = reference
        served = [int(x) for x in reference.executed_sizes()]
        b, q = max(served), None
    arr = poisson_arrivals(problem.lam, int(requests), np.random.default_rng(seed)) if arrivals is None else arrivals
    run = lambda rule: simulate(problem, rule, arrivals=arr, seed=seed)
    base = run(table)
    base_obj = _objective(problem, base)
    lmax = float(problem.latency_ms()[-1])
    limits: list[str] = []
    contiguous = list(sizes) == list(range(sizes[0], sizes[-1] + 1))
    # Triton, Ray Serve and TorchServe form any batch size ≤ their maximum; with a set of sizes (TensorRT
    # profiles 1,2,4,…) the model must pad up to the next one, and the rule is simulated with that padding
    pad = () if contiguous else tuple(s for s in sizes if s < b) + (b,)
    pad_note = (f"the server forms any batch size ≤ {b}; your model must pad each batch up to the next of "
                f"{list(pad)} (as a TensorRT profile set does): the padded size's time and energy are paid (simulated)")

    def tune(make, delays, accept=None):
        """The delay minimising the objective (or, with ``accept``, the smallest delay it accepts)."""
        best = None
        for d in delays:
            rule = make(d)
            try:
                res = run(rule)
            except InputError:  # this setting cannot carry the load (e.g. Ray Serve with a short timeout)
                continue
            obj = _objective(problem, res)
            if accept is not None and accept(obj):
                return d, rule, res
            if best is None or obj < best[3]:
                best = (d, rule, res, obj)
        if best is None:
            raise InputError(f"no {target} setting tried can carry this load (every candidate's queue grows)")
        return best[:3]

    delays_ms = [0.0] + list(np.geomspace(0.05, 8.0, 14) * lmax)
    if target == "triton":
        if q is not None:
            pref = [s for s in sizes if q <= s <= b]
            d, rule, res = tune(lambda d: triton(b, d * 1000.0, pref, pad), sorted(np.geomspace(1.0, 1000.0, 13) * lmax),
                                accept=lambda obj: obj <= base_obj * 1.001)
            limits.append(
                f"control-limit table (Q = {q}) expressed exactly by preferred_batch_size [{q}..{b}]; the only "
                f"difference is the safety timeout max_queue_delay ({d:.4g} ms), which the table does not have"
            )
        else:
            pref = served
            d, rule, res = tune(lambda d: triton(b, d * 1000.0, pref, pad), delays_ms)
            limits.append("the table is not of control-limit form: Triton sends the largest preferred size it can form "
                          "and cannot wait at queue lengths where a preferred size is formable")
        rule = triton(b, int(round(d * 1000.0)), pref, pad)
        if pad:
            limits.append(pad_note)
    elif target == "tfserving":
        allowed = [] if contiguous else [s for s in sizes if s <= b]
        if allowed and allowed[-1] != b:
            allowed.append(b)
        d, rule, res = tune(lambda d: tf_serving(b, d * 1000.0, allowed), delays_ms)
        rule = tf_serving(b, int(round(d * 1000.0)), allowed)
        limits.append("TF-Serving cannot wait for a queue length: it waits batch_timeout_micros after the oldest request")
        if allowed:
            limits.append(f"batches are padded up to allowed_batch_sizes {allowed}; padding costs the padded size's time and energy")
    elif target == "ray":
        d, rule, res = tune(lambda d: ray_serve(b, d / 1000.0, pad), delays_ms)
        rule = ray_serve(b, float(f"{d / 1000.0:.6g}"), pad)
        limits.append("Ray Serve cannot wait for a queue length: a batch opens at its first request and closes "
                      "batch_wait_timeout_s later (or at max_batch_size), whether or not the model is free")
        if pad:
            limits.append(pad_note)
    else:  # torchserve
        d, rule, res = tune(lambda d: torchserve(b, d, pad), sorted({float(round(x)) for x in delays_ms}))
        rule = torchserve(b, int(round(d)), pad)
        limits.append("TorchServe cannot wait for a queue length: it waits max_batch_delay (whole ms) after the first "
                      "request")
        if pad:
            limits.append(pad_note)
    settings, text = rule_config(target, rule)
    if reference is not None:
        limits.insert(0, f"the table's decision changes with the arrival phase its filter estimates; {target}'s rule "
                         "sees only the queue and the time, so this is its best single setting for the table's bursty "
                         "traffic (both simulated on the same sample of it)")
    if target in MEASURED:
        limits.append(MEASURED[target])
    rule.check(sizes)
    res = run(rule)
    obj = _objective(problem, res)
    gap = {
        "table": {"mean_latency_ms": base.mean_latency_ms, "mean_power_w": base.mean_power_w, "objective": base_obj,
                  "p95_ms": base.percentiles.get("p95_ms"), "p99_ms": base.percentiles.get("p99_ms")},
        "export": {"mean_latency_ms": res.mean_latency_ms, "mean_power_w": res.mean_power_w, "objective": obj,
                   "p95_ms": res.percentiles.get("p95_ms"), "p99_ms": res.percentiles.get("p99_ms")},
        "objective_increase_pct": 100.0 * (obj - base_obj) / base_obj if base_obj else math.nan,
        "requests": int(requests), "seed": int(seed),
    }
    return Export(target, settings, text, limits, rule, gap)
