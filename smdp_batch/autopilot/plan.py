"""The Autopilot's plans: a table and its timer with the metrics planned for them (:class:`Plan`), the
default solver that makes one (:func:`slo_plan`, the SLO optimiser's least-power SMDP table + timer; when no
table meets the target at the estimated load, the best effort there), the plans rolled back that may not return
(:class:`Blocked`), and a solve in flight (:class:`Job`).

Importing this module needs numpy only; :func:`slo_plan` imports the analysis (numba, scipy) when it runs.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import InputError
from ..limits import RATE_MAX, RATE_MIN
from ..runtime.table import PolicyTable
from .estimators import _num as num  # a real number as a float, NaN for anything else

__all__ = ["PLAN_FAMILIES", "Blocked", "Plan", "server_rule", "server_table", "slo_plan"]


@dataclass(frozen=True)
class Plan:
    """A table and its timer, with the metrics planned for it at ``lam`` (1/ms): W̄ and p99 in ms, P̄ in W."""

    table: PolicyTable
    lam: float
    timer_ms: float | None = None
    mean_ms: float = math.nan
    p99_ms: float = math.nan
    power_w: float = math.nan
    meets: bool = True
    spec: str = ""
    id: int = 0
    target_ms: float = math.nan  # the p99 it was solved for: the SLO less the overhead budget and the excess
    incumbent_p99_ms: float = math.nan  # the plan it is to replace, simulated at ``lam`` on the same arrivals

    def fault(self, planned: bool = True) -> str | None:
        """What is out of range, or None: λ within the rate limits, the timer None or ≥ 0, the planned times and
        power finite and ≥ 0 (``planned=False``: or NaN, for a table given without its metrics)."""
        if not RATE_MIN <= num(self.lam) <= RATE_MAX:
            return f"lam = {self.lam!r} (λ must lie in [{RATE_MIN:g}, {RATE_MAX:g}] per ms)"
        if self.timer_ms is not None and not num(self.timer_ms) >= 0:
            return f"timer_ms = {self.timer_ms!r} (a timer is None or ≥ 0 ms)"
        for name in ("mean_ms", "p99_ms", "power_w"):
            v = num(getattr(self, name))
            if not (0 <= v < math.inf or (not planned and math.isnan(v))):
                return f"{name} = {getattr(self, name)!r} (planned times and power are finite and ≥ 0)"
        return None

    @staticmethod
    def usable(plan: Any, sizes: tuple, target: float | None = None) -> bool:
        """Whether ``plan`` is a Plan of batch sizes among ``sizes`` with planned metrics in range (:meth:`fault`)
        and, given a ``target`` (ms), meets it."""
        if not isinstance(plan, Plan) or not isinstance(plan.table, PolicyTable) or plan.fault(planned=True) or \
                not set(plan.table.batch_sizes) <= set(sizes):
            return False
        return target is None or (plan.meets and plan.p99_ms <= target * (1 + 1e-9))

    @classmethod
    def given(cls, table: Any, lam: float) -> "Plan":
        """The plan of a table given as is (a :class:`Plan`, or a PolicyTable serving at its own λ or else ``lam``,
        its timer ``meta["max_wait_ms"]``), its metrics unknown; ValueError when out of range, TypeError for others."""
        if isinstance(table, Plan):
            fault = table.fault(planned=False)
            if fault:
                raise ValueError(f"the initial plan is out of range: {fault}")
            return table
        if isinstance(table, PolicyTable):
            t = table.meta.get("max_wait_ms")
            return cls(table, float(table.lam or lam), t if isinstance(t, (int, float)) else None)
        raise TypeError("table must be a PolicyTable, a Plan or None")


#: The families a plan may come from: the SMDP table + timer the batcher runs, or the rule of a server's own batcher
#: whose delay is set live: Ray Serve's ``serve.batch`` (``batch_wait_timeout_s``, max batch = Bmax) or Triton's
#: dynamic batcher (``max_queue_delay_microseconds``, max batch = Bmax, no preferred sizes), each run at the delay of
#: the plan (Triton takes a delay only from a model load: :mod:`smdp_batch.integrations.triton_bank` routes each
#: request to one of several loaded models, each at its own delay).
PLAN_FAMILIES = ("smdp", "ray", "triton")
_SERVER_FAMILIES = ("ray", "triton")


def _rule(problem: Any, family: str, delay_ms: float) -> Any:
    """The server's batcher at max batch Bmax and this delay, rounded as the export writes it (Ray: 6 digits of s;
    Triton: whole µs)."""
    from ..baselines.servers import ray_serve, server_padding, triton

    pad = server_padding(problem.batch_sizes)
    if family == "triton":
        return triton(int(problem.bmax), float(round(delay_ms * 1000.0)), (), pad)
    return ray_serve(int(problem.bmax), float(f"{delay_ms / 1000.0:.6g}"), pad)


def server_rule(plan: Plan, problem: Any) -> Any:
    """The plan as the simulator's rule (a ServerRule): its table + timer, or the server's batcher at its delay."""
    from ..baselines.servers import table_timer

    t = plan.table
    tau = plan.timer_ms if plan.timer_ms is not None else math.inf
    if t.meta.get("family") in _SERVER_FAMILIES:
        return _rule(problem, t.meta["family"], tau)
    forced = "pad" if t.meta.get("short_batch") == "pad-up" else "largest"
    return table_timer(np.asarray(t.policy), list(t.batch_sizes), tau, spec="live", forced=forced)


def server_table(problem: Any, family: str, delay_ms: float, lam: float, spec: str) -> PolicyTable:
    """A server's batcher (``family`` "ray" or "triton", max batch Bmax) as a table + timer: serve Bmax at once when
    Bmax wait, else everything waiting (≤ Bmax, padded up to the next allowed size where sizes are missing) once the
    timer ``delay_ms`` fires; ``meta["family"]`` names the server, whose own batcher runs it where it is deployed."""
    from ..baselines.servers import server_padding

    bmax = int(problem.bmax)
    n = np.arange(bmax + 1)
    return PolicyTable(np.where(n >= bmax, bmax, 0).astype(np.int64), list(problem.batch_sizes),
                       {"inputs": {"lam": float(lam)}, "max_wait_ms": float(delay_ms), "setting": spec,
                        "family": family, "short_batch": "pad-up" if server_padding(problem.batch_sizes) else "serve"})


def slo_plan(problem: Any, slo_ms: float, lams: list[float], *, requests: int = 20_000, seed: int = 0,
             incumbent: Plan | None = None, margin: float = 0.02, family: str = "smdp", served: Any = None
             ) -> Plan | None:
    """The SLO optimiser's least-power setting meeting p99 ≤ ``slo_ms`` at every load in ``lams`` (1/ms; planned
    metrics at ``lams[0]``): of ``family`` "smdp" (a table + timer), "ray" (Ray Serve's batcher at max batch Bmax, its
    ``batch_wait_timeout_s`` the plan's timer) or "triton" (Triton's batcher at max batch Bmax, its
    ``max_queue_delay_microseconds`` the plan's timer): :func:`server_table`.

    When no setting meets it: the best effort at ``lams[0]``, a plan with ``meets=False`` — the setting that waits
    least (:func:`_best_effort`), when its simulated p99 there is below the incumbent's on the same arrivals — else
    None (the live plan is already the better effort).

    ``incumbent``: the live plan, simulated on the same arrivals; it is returned (with its metrics at
    ``lams``) when it meets the SLO there and the new table would save less than ``margin`` of its power: a
    swap that saves nothing only costs a rollback watch.  Otherwise its simulated p99 at ``lams[0]`` goes with
    the new plan (``incumbent_p99_ms``): the rollback watch compares the new plan's responses with it.

    ``served``: a :class:`~smdp_batch.model.served.ServedDelay` (``smdp-batch calibrate``'s file): every setting's
    p99 is then the served one, what the server adds beyond the batch drawn into each response, as ``compare
    --served`` plans; its l(b) as served is left out, since ``problem`` carries the Autopilot's own l̂(b).  A load
    of ``lams`` after the first that the server's own path did not carry (``served.beyond``) is left out: no setting
    of the batcher changes what the path carries, and refusing there would refuse the plan at ``lams[0]`` too (at a
    step to near the carried load, the edge of λ̂'s band lies beyond it, and the best effort that took its place
    served batches of one)."""
    from ..analysis.slo import optimise
    from ..limits import SLO_MAX_MS

    if family not in PLAN_FAMILIES:
        raise InputError(f"family must be one of {', '.join(PLAN_FAMILIES)}, got {family!r}")
    if served is not None:
        served = replace(served, served_latency_ms={})
        lams = [lams[0]] + [x for x in lams[1:] if not served.beyond(x)]  # (docstring)
    current = None if incumbent is None else server_rule(incumbent, problem)
    try:
        ans = optimise(problem.replace(lam=max(lams)), {"p99": slo_ms, "mean": SLO_MAX_MS}, list(lams),
                       families=(family,), requests=requests, seed=seed, defaults=False, current=current,
                       served=served)
    except InputError:  # the target is below what any rule can reach (l(1) alone, or with the server's own time)
        return _best_effort(problem.replace(lam=float(lams[0])), current, requests, seed, family, served)
    s = ans.best.get(family)
    cur = ans.current
    if incumbent is not None and cur is not None and cur.meets and \
            (s is None or not s.meets or cur.power_w <= (1.0 + margin) * s.power_w):
        at = min(cur.loads, key=lambda x: abs(x.lam - lams[0]))
        return replace(incumbent, lam=float(lams[0]), mean_ms=at.metrics["mean"], p99_ms=at.metrics["p99"],
                       power_w=at.power_w, meets=True)
    if s is None or not s.meets or (family == "smdp" and s.policy is None):
        return _best_effort(problem.replace(lam=float(lams[0])), current, requests, seed, family, served)
    at = min(s.loads, key=lambda x: abs(x.lam - lams[0]))
    old = min(cur.loads, key=lambda x: abs(x.lam - lams[0])).metrics["p99"] if cur is not None and cur.loads else math.nan
    timer: float | None
    if family in _SERVER_FAMILIES:
        timer = float(s.knobs["timeout_s"]) * 1000.0 if family == "ray" else float(s.knobs["delay_us"]) / 1000.0
        table = server_table(problem, family, timer, lams[0], s.spec)
    else:
        tau = s.knobs.get("tau_ms")
        timer = float(tau) if tau is not None and math.isfinite(tau) else None
        sizes = s.knobs.get("batch_sizes") or list(problem.batch_sizes)
        meta = {"inputs": {"lam": float(lams[0])}, "max_wait_ms": timer, "setting": s.spec,
                "short_batch": "pad-up" if s.knobs.get("forced") == "pad" else "serve"}
        table = PolicyTable(np.asarray(s.policy, dtype=np.int64), sizes, meta)
    return Plan(table, float(lams[0]), timer, at.metrics["mean"], at.metrics["p99"], at.power_w, True, s.spec,
                incumbent_p99_ms=float(old))


def _best_effort(problem: Any, current: Any, requests: int, seed: int, family: str = "smdp",
                 served: Any = None) -> Plan | None:
    """The setting that waits least at ``problem.lam``, as a plan that does not meet its target, if its simulated
    p99 (served, with ``served``) is below the live rule's (``current``, None: none) on the same arrivals — a live rule
    whose queue grows at this load has none, and any effort that keeps up beats it; else None.
    For "smdp" the greedy table (serve the largest allowed size ≤ n at once, no timer); for a server's batcher the
    delay of least simulated p99 among l(Bmax) × (0, 1/8, 1/4, 1/2, 1, 2): Ray's window does not close on a free
    model, so at timeout 0 every request is a batch of one, which a load above 1/l(1) cannot be served with (Triton's
    batcher at delay 0 serves everything waiting as soon as the model is free; the same grid is searched for it)."""
    from ..analysis.simulate import simulate
    from ..baselines import parse_policy

    sizes = list(problem.batch_sizes)
    if family in _SERVER_FAMILIES:
        found = []
        for f in (0.0, 0.125, 0.25, 0.5, 1.0, 2.0):
            rule = _rule(problem, family, f * float(problem.latency_ms()[-1]))
            try:
                found.append((simulate(problem, rule, requests=requests, seed=seed, served=served), rule))
            except InputError:  # unstable at this timeout
                continue
        if not found:
            return None
        best, rule = min(found, key=lambda x: x[0].percentiles["p99_ms"])
        spec, timer = f"{rule.spec} (best effort)", rule.delay
        table = server_table(problem, family, timer, problem.lam, spec)
    else:
        rule = np.asarray(parse_policy("greedy", problem.batch_sizes, problem.bmax), dtype=np.int64)
        try:
            best, spec = simulate(problem, rule, requests=requests, seed=seed, served=served), "greedy (best effort)"
        except InputError:  # not even serving the most at once carries this load: no effort helps
            return None
        table, timer = PolicyTable(rule, sizes, {"inputs": {"lam": problem.lam}, "max_wait_ms": None, "setting": spec,
                                                 "short_batch": "serve"}), None
    if current is not None:
        try:
            live = simulate(problem, current, requests=requests, seed=seed, served=served).percentiles["p99_ms"]
        except InputError:  # the live rule cannot carry this load (its queue grows): any stable effort is better
            live = math.inf
        if not best.percentiles["p99_ms"] < live:
            return None
    return Plan(table, problem.lam, timer, best.mean_latency_ms, best.percentiles["p99_ms"], best.mean_power_w,
                False, spec)


def _same(a: Plan, b: Plan) -> bool:
    """Whether two plans serve alike: the same decisions on the same sizes, and the same timer."""
    ta, tb = a.table, b.table
    return (ta.batch_sizes == tb.batch_sizes and a.timer_ms == b.timer_ms and ta.policy.shape == tb.policy.shape
            and bool(np.array_equal(ta.policy, tb.policy)))


def shorter_timer(a: Plan, b: Plan, or_equal: bool = False) -> bool:
    """Whether ``a`` batches on the same sizes as ``b`` with a shorter timer (smaller batches; ``or_equal``: or as
    short)."""
    if a.timer_ms is None or b.timer_ms is None or a.table.batch_sizes != b.table.batch_sizes:
        return False
    return a.timer_ms <= b.timer_ms if or_equal else a.timer_ms < b.timer_ms


class Blocked:
    """Plans rolled back, each barred within ``band`` (25 %) of the load it failed at; the latest ``most`` (8).

    A plan whose timer was shorter than the plan put back (:func:`shorter_timer`) bars more: every plan on the same
    sizes with a timer as short or shorter, at those loads (a floor on the timer).  It did worse with smaller
    batches, so what no plan models grew as they shrank (a host short of CPU, where each batch's work competes with
    the server's own path), and a plan shorter still would do worse again: on real Ray Serve with a CPU-bound model a
    plan at a 3× step learned a large outside delay, planned 2.9 ms and then 7.5 ms where 27 ms ran, was rolled back,
    and the plans after it went on down to timeout 0 with a client p99 of 100 ms."""

    def __init__(self, band: float = 0.25, most: int = 8):
        self.band, self.most = float(band), int(most)
        self._items: list[tuple[Plan, float, float, bool]] = []  # (plan, lowest, highest load, a floor)

    def add(self, plan: Plan, floor: bool = False) -> tuple[float, float]:
        """Bar ``plan`` (and, with ``floor``, every plan as short: class doc) near its load; the band (1/ms)."""
        lo, hi = plan.lam / (1.0 + self.band), plan.lam * (1.0 + self.band)
        self._items = [x for x in self._items if not _same(x[0], plan)][-(self.most - 1):] + [(plan, lo, hi, floor)]
        return lo, hi

    def __contains__(self, out: Plan) -> bool:
        return any(lo <= out.lam <= hi and (_same(out, b) or floor and shorter_timer(out, b, or_equal=True))
                   for b, lo, hi, floor in self._items)


RUNNING = object()  # a job's result while its solve runs


class Job:
    """A solve in flight: when and why it started, its inputs (l̂(b), the loads, the target, ζ̂(b)) and its result."""

    __slots__ = ("thread", "start", "reason", "latency", "lams", "target", "energy", "out")

    def __init__(self, start: float, reason: str, latency: np.ndarray, lams: list[float], target: float,
                 energy: np.ndarray | None = None):
        self.thread: threading.Thread | None = None
        self.start, self.reason, self.latency, self.lams, self.target = start, reason, latency, lams, target
        self.energy = energy  # ζ̂(b) for this solve (None: the model's)
        self.out: Any = RUNNING  # solve_in="clock": the result, handed over solve_seconds after the start

    def problem(self, base: Any) -> Any:
        """``base`` (the Autopilot's problem) at this solve's λ̂, with its l̂(b) and ζ̂(b) (where measured)."""
        from ..model.curves import Table

        sizes = tuple(base.batch_sizes)
        changes: dict[str, Any] = {"lam": self.lams[0], "latency": Table(sizes, tuple(map(float, self.latency)))}
        if self.energy is not None:
            changes["energy"] = Table(sizes, tuple(map(float, self.energy)))
        return base.replace(**changes)
