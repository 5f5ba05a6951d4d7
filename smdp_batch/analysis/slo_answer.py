"""The question and the answer of the SLO optimiser (:mod:`smdp_batch.analysis.slo`): an :class:`SLO` (latency bounds,
and the headroom kept below them), a setting's metrics at each load (:class:`LoadResult`, :class:`Setting`) and
the answer (:class:`SLOAnswer`): per family the least-power setting meeting the SLO, the defaults people run,
the recommendation and what it saves.  The search that fills them is :func:`~smdp_batch.analysis.slo.optimise`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..baselines.servers import ServerRule
from ..errors import InputError
from ..limits import SLO_MAX_MS
from ..model.problem import BatchingProblem

__all__ = ["METRICS", "SLO", "LoadResult", "Setting", "SLOAnswer", "RULE_FAMILIES", "FAMILIES", "DEFAULT_SETTINGS"]

#: SLO metric → the simulator's key.
METRICS = {"mean": "mean_latency_ms", "p50": "p50_ms", "p90": "p90_ms", "p95": "p95_ms", "p99": "p99_ms"}
_CI = {"mean": "mean_latency_ci_ms", "p50": "p50_ci_ms", "p90": "p90_ci_ms", "p95": "p95_ci_ms", "p99": "p99_ci_ms"}

#: The server rules searched beside the SMDP table (max batch = Bmax).
RULE_FAMILIES = ("triton", "triton-preferred", "tfserving", "ray", "torchserve")
#: Every family :func:`optimise` can report, in output order.
FAMILIES = ("table+timer", "smdp") + RULE_FAMILIES

#: What most servers run: each rule's default setting (Triton: max_queue_delay_microseconds 0, or the
#: 100 µs people often set; TF-Serving's batch_timeout_micros 0; Ray Serve's @serve.batch defaults
#: max_batch_size 10, batch_wait_timeout_s 0.01; TorchServe's max_batch_delay 100 ms).
DEFAULT_SETTINGS = ("triton:max={B},delay_us=0", "triton:max={B},delay_us=100", "tfserving:max={B},timeout_us=0",
                    "ray:max=10,timeout_s=0.01", "torchserve:batch={B},delay_ms=100")


# ------------------------------------------------------------------------------------------ the SLO
@dataclass(frozen=True)
class SLO:
    """Latency bounds (ms), one per metric; all must hold at once.  ``headroom``: slack kept below every bound
    for what the plan does not model (the server's own time): ``("ms", x)`` or ``("pct", x)`` of each bound; a
    setting then meets the SLO when each metric plus its half-width is at most :meth:`limit`."""

    bounds: tuple[tuple[str, float], ...]
    headroom: tuple[str, float] | None = None

    @classmethod
    def of(cls, items, headroom: tuple[str, float] | None = None) -> "SLO":
        """From ``{metric: ms}`` or ``[(metric, ms), …]``; unknown metrics and a metric bounded twice with
        different values are refused.  ``headroom``: ``("ms", x)`` or ``("pct", x)`` (x in [0, 90] %)."""
        pairs = list(items.items()) if isinstance(items, dict) else list(items)
        out: dict[str, float] = {}
        for metric, bound in pairs:
            m = str(metric).strip().lower()
            if m not in METRICS:
                raise InputError(f"unknown SLO metric {metric!r}; valid: {', '.join(METRICS)}")
            try:
                b = float(bound)
            except (TypeError, ValueError):
                raise InputError(f"the {m} SLO must be a positive number of ms, got {bound!r}") from None
            if not (math.isfinite(b) and b > 0):
                raise InputError(f"the {m} SLO must be a positive number of ms, got {bound!r}")
            if b > SLO_MAX_MS:
                raise InputError(f"the {m} SLO must be at most {SLO_MAX_MS:g} ms (about 17 minutes), got {bound!r}")
            if m in out and out[m] != b:
                raise InputError(f"conflicting SLOs: {m} ≤ {out[m]:g} ms and {m} ≤ {b:g} ms; give each metric once")
            out[m] = b
        if not out:
            raise InputError(f"give at least one SLO ({', '.join(METRICS)} latency bound in ms)")
        order = list(METRICS)
        room = None
        if headroom is not None:
            kind, x = headroom
            if kind not in ("ms", "pct") or not (math.isfinite(float(x)) and float(x) >= 0) \
                    or (kind == "pct" and float(x) > 90):
                raise InputError(f"the headroom must be ms ≥ 0 or a share of 0..90 %, got {headroom!r}")
            room = (str(kind), float(x))
            for m, b in out.items():
                if room[0] == "ms" and room[1] >= b:
                    raise InputError(f"a headroom of {room[1]:g} ms leaves nothing of the {m} bound {b:g} ms: keep "
                                     "less than the bound")
        return cls(tuple(sorted(out.items(), key=lambda kv: order.index(kv[0]))), room)

    def limit(self, metric: str) -> float:
        """What a setting's ``metric`` (plus its half-width) must stay within (ms): the bound less the headroom."""
        b = dict(self.bounds)[metric]
        if self.headroom is None:
            return b
        kind, x = self.headroom
        return b - x if kind == "ms" else b * (1.0 - x / 100.0)

    def text(self) -> str:
        return " and ".join(f"{'W̄' if m == 'mean' else m} ≤ {b:g} ms" for m, b in self.bounds)

    def headroom_text(self) -> str:
        """"3 ms below each bound" / "10 % of each bound", or "none"."""
        if self.headroom is None or self.headroom[1] == 0:
            return "none"
        kind, x = self.headroom
        return f"{x:g} ms below each bound" if kind == "ms" else f"{x:g} % of each bound"

    def as_dict(self) -> dict:
        return {m: b for m, b in self.bounds}

    def check_reachable(self, problem: BatchingProblem, seed: int = 0) -> None:
        """Refuse bounds no setting can meet: below the latency of a lone request served at once in a
        batch of the smallest size (its mean l(b_min), or the percentile of its service law)."""
        b = problem.bmin
        l1 = float(problem.latency_ms()[0])
        draws = None
        for m, bound in self.bounds:
            if m == "mean":
                floor = l1
            else:
                if draws is None:
                    draws = problem.service.sample(np.random.default_rng(seed), l1, 20_000, b)
                floor = float(np.percentile(draws, float(m[1:])))
            if self.limit(m) <= floor < bound:
                raise InputError(
                    f"the SLO {m} ≤ {bound:g} ms less the headroom ({self.headroom_text()}) is {self.limit(m):.4g} ms, "
                    f"below the fastest possible: a request served alone at once in a batch of {b} already takes "
                    f"{floor:.4g} ms; keep less headroom")
            if bound <= floor:
                raise InputError(
                    f"the SLO {m} ≤ {bound:g} ms is below the fastest possible: a request served alone at once in a "
                    f"batch of {b} already takes {floor:.4g} ms ({'l(b)' if m == 'mean' else m + ' of its service time'}); "
                    f"use a bound above {floor:.4g} ms"
                )


# ------------------------------------------------------------------------------------------ results
@dataclass
class LoadResult:
    """One setting simulated at one load."""

    lam: float  # requests/ms
    metrics: dict  # metric → ms
    ci: dict  # metric → 95 % half-width (ms)
    power_w: float
    power_ci: float
    mean_batch: float
    meets: bool
    #: batches the setting's timer closed in the runs made at this load (its screen's too); None where not
    #: counted.  0: any longer delay runs the same batches, so it decides the same here (the delay search stops)
    timer_batches: int | None = field(default=None, compare=False)

    def tightest(self, slo: SLO) -> tuple[str, float]:
        """(metric, bound) of the SLO's metric with the least relative margin here."""
        return min(slo.bounds, key=lambda mb: (mb[1] - self.metrics[mb[0]] - self.ci[mb[0]]) / mb[1])

    def margin(self, slo: SLO) -> float:
        """The least relative margin (bound − value − half-width) / bound over the SLO's metrics."""
        m, b = self.tightest(slo)
        return (b - self.metrics[m] - self.ci[m]) / b

    def margin_ms(self, slo: SLO) -> float:
        """(bound − value − half-width) in ms, of the metric with the least relative margin."""
        m, b = self.tightest(slo)
        return b - self.metrics[m] - self.ci[m]

    def as_dict(self) -> dict:
        return {"lam": self.lam, "load_per_s": self.lam * 1e3, "metrics_ms": self.metrics, "ci_ms": self.ci,
                "mean_power_w": self.power_w, "mean_power_ci_w": self.power_ci, "mean_batch": self.mean_batch,
                "meets_slo": self.meets}


@dataclass
class Setting:
    """One setting of a family, simulated at the loads (all of them once it meets the SLO)."""

    family: str
    spec: str  # the rule's spelling (simulate --policy …; a table + timer names its table)
    knobs: dict  # the searched values: w2 range, tau_ms, delay_us, Q, …
    loads: list[LoadResult]
    meets: bool
    rule: ServerRule | None = field(repr=False, default=None)
    policy: list | None = field(repr=False, default=None)  # the SMDP table (queue lengths 0..s_max)

    @property
    def power_w(self) -> float:
        """Mean of P̄ over the loads (equal time at each); inf where it does not meet the SLO."""
        return float(np.mean([x.power_w for x in self.loads])) if self.meets else math.inf

    @property
    def power_ci(self) -> float:
        return float(math.sqrt(sum(x.power_ci ** 2 for x in self.loads)) / len(self.loads)) if self.loads else math.nan

    def worst(self, slo: SLO) -> LoadResult:
        return min(self.loads, key=lambda x: x.margin(slo))

    def as_dict(self, slo: SLO) -> dict:
        w = self.worst(slo)
        return {"family": self.family, "setting": self.spec, "knobs": self.knobs, "meets_slo": self.meets,
                "mean_power_w": self.power_w if self.meets else float(np.mean([x.power_w for x in self.loads])),
                "mean_power_ci_w": self.power_ci,
                "worst_load": {**w.as_dict(), "margin": w.margin(slo), "margin_ms": w.margin_ms(slo)},
                "loads": [x.as_dict() for x in self.loads]}


@dataclass
class SLOAnswer:
    """What :func:`optimise` found: per family the least-power setting meeting the SLO (None if none does),
    the rules' default settings, and how it was searched."""

    slo: SLO
    lams: list[float]
    solve_lam: float
    best: dict  # family → Setting | None
    defaults: list[Setting]
    requests: int
    seed: int
    evaluations: int
    seconds: float
    current: Setting | None = None  # the user's own rule (``compare --current``), simulated at every load
    problem: BatchingProblem | None = field(repr=False, default=None)  # at the top load: the floor's l(b), ζ(b)
    idle_power_w: float = 0.0  # W per instance running no batch, in every P̄
    idle_power_given: bool = False  # False: 0 W assumed (the answer says so)
    served: object = None  # the served-delay model in every setting's metrics (a ServedDelay), or None
    reach: dict | None = None  # the least value (and half-width) of the hardest metric at the hardest load, by what
    out_of_reach: bool = False  # refused before the search: even the settings that wait least miss it (no family ran)
    fresh: Setting | None = None  # the recommendation on a fresh stream (the next seed, longer), or None
    fresh_requests: int | None = None  # requests per load of that stream
    unit_arrivals: np.ndarray | None = field(repr=False, default=None)  # the unit-rate stream every setting ran on
    _floors: list | None = field(init=False, repr=False, default=None, compare=False)  # floors(), once computed

    def floors(self) -> list[tuple[float, float, int | None]]:
        """(λ, P_floor W, the median size of the batches it prices) at each load, on the stream every setting ran on
        (:mod:`~smdp_batch.analysis.power_floor`; computed once, the loads on threads)."""
        from concurrent.futures import ThreadPoolExecutor

        from .power_floor import power_floor

        if self.problem is None:
            return []
        if self._floors is None:
            bounds = [(m, self.slo.limit(m)) for m, _ in self.slo.bounds]
            one = lambda lam: (lam, *power_floor(self.problem, lam, bounds, self.idle_power_w,  # noqa: E731
                                                 self.unit_arrivals))
            with ThreadPoolExecutor(max(1, min(len(self.lams), os.cpu_count() or 1))) as pool:  # kernels drop the GIL
                self._floors = list(pool.map(one, self.lams))
        return self._floors

    def floor_w(self, floors: list | None = None) -> float:
        """The floor's mean over the loads (W; equal time at each, as every P̄ here), NaN where none qualifies;
        ``floors``: :meth:`floors` when already computed."""
        f = [x[1] for x in (self.floors() if floors is None else floors)]
        return float(np.mean(f)) if f else math.nan

    def captured(self, floor_w: float | None = None) -> tuple[float | None, str | None]:
        """(share of the achievable saving the recommendation takes against Triton's default, that default's
        spelling), or (None, None) without a recommendation or that default; ``floor_w``: :meth:`floor_w` when
        already computed."""
        from .power_floor import captured_share

        rec = self.recommended
        ref = next((d for d in self.defaults if d.spec.startswith("triton:") and "delay_us=0" in d.spec), None)
        if rec is None or ref is None:
            return None, None
        floor = self.floor_w() if floor_w is None else floor_w
        return captured_share(float(np.mean([x.power_w for x in ref.loads])), rec.power_w, floor), ref.spec

    @property
    def fresh_holds(self) -> bool | None:
        """Whether the recommendation's every bounded metric, on the fresh stream, is within its limit at every load
        (its point estimate: that stream is the check, not a second search); None without a fresh check."""
        if self.fresh is None:
            return None
        return all(x.metrics[m] <= self.slo.limit(m) for x in self.fresh.loads for m, _ in self.slo.bounds)

    @property
    def recommended(self) -> Setting | None:
        """What smdp-batch recommends: the least-power setting of every family searched — the table + timer
        family's best, unless a server rule outside it (Ray Serve's, TorchServe's) draws less power."""
        pick = None
        for fam in ("table+timer",) + RULE_FAMILIES:
            pick = _better(pick, self.best.get(fam))
        return pick

    def best_rule(self) -> Setting | None:
        """The least-power server rule (Triton, TF-Serving, Ray Serve, TorchServe) that meets the SLO."""
        ok = [s for f, s in self.best.items() if f in RULE_FAMILIES and s is not None]
        return min(ok, key=lambda s: s.power_w) if ok else None

    def savings(self) -> list[dict]:
        """The recommendation against the table + timer family's best (when a rule beat it), the best tuned
        rule, and each default setting (W; positive = the recommendation saves)."""
        rec = self.recommended
        out: list[dict] = []
        if rec is None:
            return out
        tt = self.best.get("table+timer")
        others = ([("table+timer", tt)] if tt is not None and tt is not rec else [])
        others += [("best tuned rule", self.best_rule())] + [("default", d) for d in self.defaults]
        for what, s in others:
            if s is None or s is rec:
                continue
            out.append({"against": what, **self.versus(s)})
        return out

    def versus(self, s: Setting) -> dict:
        """``s`` against the recommendation: its power and what the recommendation saves (W, %)."""
        rec = self.recommended
        p = float(np.mean([x.power_w for x in s.loads]))
        d = {"setting": s.spec, "family": s.family, "meets_slo": s.meets, "power_w": p}
        if rec is None:
            return {**d, "saved_w": None, "saved_pct": None, "ci_w": None}
        return {**d, "saved_w": p - rec.power_w, "saved_pct": 100.0 * (p - rec.power_w) / p,
                "ci_w": math.hypot(s.power_ci, rec.power_ci)}

    def as_dict(self) -> dict:
        rec = self.recommended
        floors = self.floors()
        floor = self.floor_w(floors)
        share, against = self.captured(floor)
        return {"slo": self.slo.as_dict(), "loads_per_ms": self.lams, "solve_lam": self.solve_lam,
                "requests_per_load": self.requests, "seed": self.seed,
                "recommended": rec.as_dict(self.slo) if rec else None,
                "best": {f: (s.as_dict(self.slo) if s else None) for f, s in self.best.items()},
                "defaults": [s.as_dict(self.slo) for s in self.defaults],
                "savings": self.savings(), "evaluations": self.evaluations, "optimise_seconds": self.seconds,
                "headroom": None if self.slo.headroom is None else
                {"kind": self.slo.headroom[0], "value": self.slo.headroom[1],
                 "limits_ms": {m: self.slo.limit(m) for m, _ in self.slo.bounds}},
                "server_time_in_plan": self.served is not None,
                "served_delay": None if self.served is None else _served_dict(self.served),
                "metric_method": f"simulated: {self.requests} requests per load, 95 % batch-means half-widths",
                "idle_power_w": self.idle_power_w, "idle_power_assumed": not self.idle_power_given,
                "power_floor_w": floor,
                "power_floor": [{"lam": lam, "floor_w": f, "size": b} for lam, f, b in floors],
                "captured_share": share, "captured_against": against,
                "reach": self.reach, "out_of_reach": self.out_of_reach,
                "fresh_check": None if self.fresh is None else
                {"seed": self.seed + 1, "requests_per_load": self.fresh_requests, "holds": self.fresh_holds,
                 "loads": [x.as_dict() for x in self.fresh.loads]},
                **({} if self.current is None else
                   {"current": {**self.current.as_dict(self.slo), "versus": self.versus(self.current)}})}


def _served_dict(sd) -> dict:
    """The served-delay model an answer rests on, for the JSON: its parts, and per calibrated load what was
    measured (the outside delays themselves are in the calibration file)."""
    return {"a_ms": sd.a_ms, "c_ms": sd.c_ms, "return_ms": sd.return_ms, "loads_per_s": list(sd.loads_per_s),
            "carried_per_s": sd.carried_per_s, "grows_with_load": sd.grows_with_load(),
            "outside_p50_ms": [float(np.percentile(o, 50)) for o in sd.outside_ms],
            "outside_p99_ms": [float(np.percentile(o, 99)) for o in sd.outside_ms],
            "source": dict(sd.source)}


def _better(a: Setting | None, b: Setting | None) -> Setting | None:
    """The one of less power among those that meet the SLO (a on ties)."""
    if b is None or not b.meets:
        return a if a is not None and a.meets else None
    if a is None or not a.meets:
        return b
    return b if b.power_w < a.power_w else a
