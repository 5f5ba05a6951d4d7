"""Event simulation of the batch server of paper 004 §III under any batching rule.

One server, FIFO, one batch at a time (or c model instances sharing the FIFO queue, ``problem.instances``: the
rule forms the batches one after the other, each when an instance is free; Ray Serve's rule runs on c
replicas with their own queues behind its power-of-two-choices router).  A batch of b requests takes
a time drawn from G_b (the problem's service law with mean l(b)) and costs ζ(b) mJ; every request of the
batch completes when the batch does.  The rule deciding when to start a batch and how large is either

* a **table** n ↦ b (an SMDP solution, static, greedy, control-limit), applied at the model's
  decision epochs: a batch completion, or an arrival to an idle server (paper 004 §IV; eq. 30
  for n > s_max); on c instances also a busy-aware table (k busy, n) ↦ b (a 2-D array, row k), or
* a **timeout rule** of a real server (:mod:`smdp_batch.baselines.servers`).

Arrivals are Poisson, a replayed trace, or a two-phase MMPP, generated up front with a seeded
numpy Generator, so a run is a pure function of its seed.  The event loop is one numba kernel:
queued requests are a contiguous index range [head, next), so the state is a few integers.

Statistics use batch means: after the warm-up (the first ``warmup`` share of requests), the rest
is cut into ``batches`` consecutive groups; mean response time and power per group give 95 %
Student-t intervals.  Power counts each request's share ζ(b)/b of its batch's energy over the span of
the group's arrivals.  Percentiles are taken over all measured requests.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.special import stdtrit  # the t quantile (scipy.stats costs half a second to import)

from ..errors import InputError
from ..limits import IDLE_POWER_MAX_W, check_rate, check_requests, read_csv_rows
from ..model.laws import Deterministic
from ..model.problem import BatchingProblem

__all__ = ["SimulationResult", "simulate", "response_times", "poisson_arrivals", "mmpp_arrivals", "read_trace", "MODES"]

from .quantiles import group_percentiles
from .sim_draws import unit_draws
from .sim_kernels import MODES, _advance, _context_kernel, _kernel
from .sim_replicas import _replicas_contention_kernel, _replicas_kernel


@dataclass
class SimulationResult:
    """Metrics of one simulation run; intervals are 95 % batch-means Student-t half-widths."""

    requests: int
    measured: int
    mean_latency_ms: float
    mean_latency_ci: float
    mean_power_w: float
    mean_power_ci: float
    throughput: float  # requests/ms
    mean_batch_size: float
    percentiles: dict  # "p50_ms" … → value
    percentile_ci: dict
    batch_size_counts: dict  # executed size → number of batches
    queue_at_start: np.ndarray  # histogram of the queue length when a batch starts
    seconds: float
    seed: int | None
    response_ms: np.ndarray | None = field(repr=False, default=None)
    within: dict = field(default_factory=dict)  # bound (ms) → share of requests served within it
    within_ci: dict = field(default_factory=dict)
    #: batches holding requests of the stream that the rule's timer or delay closed (not a full or preferred batch,
    #: nor a table's own decision); None where the rule's loop does not count them (λ-bank and phase tables, Ray's
    #: replicas on several instances).  0 means any longer delay would serve the stream in the same batches.
    timer_batches: int | None = None
    # the groups are always given (by simulate): their None defaults only follow the fields above
    group_latency: np.ndarray = field(repr=False, default=None)  # type: ignore[arg-type]  # W̄ of each batch-means group (ms)
    group_power: np.ndarray = field(repr=False, default=None)  # type: ignore[arg-type]  # P̄ of each group (W)

    def objective_ci(self, w1: float, w2: float, other: "SimulationResult | None" = None) -> float:
        """95 % half-width of w1·W̄ + w2·P̄ from the groups; with ``other`` (a run on the same stream and
        groups), of the paired difference self − other."""
        x = w1 * self.group_latency + w2 * self.group_power
        if other is not None:
            x = x - (w1 * other.group_latency + w2 * other.group_power)
        return float(stdtrit(x.size - 1, 0.975)) * float(np.std(x, ddof=1)) / math.sqrt(x.size)

    def as_dict(self) -> dict:
        d = {
            "requests": self.requests, "measured_requests": self.measured,
            "mean_latency_ms": self.mean_latency_ms, "mean_latency_ci_ms": self.mean_latency_ci,
            "mean_power_w": self.mean_power_w, "mean_power_ci_w": self.mean_power_ci,
            "throughput": self.throughput, "throughput_per_s": self.throughput * 1e3,
            "mean_batch_size": self.mean_batch_size,
            **self.percentiles, **{k.replace("_ms", "_ci_ms"): v for k, v in self.percentile_ci.items()},
            "batch_size_counts": {str(k): int(v) for k, v in self.batch_size_counts.items()},
            "queue_at_batch_start": [int(x) for x in self.queue_at_start],
            "simulate_seconds": self.seconds, "seed": self.seed,
        }
        if self.timer_batches is not None:
            d["timer_batches"] = self.timer_batches
        if self.within:
            d["within"] = [{"bound_ms": b, "share": v, "share_ci": self.within_ci[b]} for b, v in self.within.items()]
        return d


# ----------------------------------------------------------------------------------------- arrivals
def poisson_arrivals(lam: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n Poisson arrival times (ms) at rate λ (1/ms), starting after 0."""
    if not (math.isfinite(lam) and lam > 0):
        raise InputError(f"arrival rate λ must be finite and > 0 /ms, got {lam!r}")
    check_rate("arrival rate λ", lam)
    n = check_requests(n, "requests")
    x = rng.exponential(1.0 / lam, int(n))
    return np.cumsum(x, out=x)


def mmpp_arrivals(rates: tuple[float, float], switch: tuple[float, float], n: int, rng: np.random.Generator) -> np.ndarray:
    """Two-phase MMPP: rate rates[i] (1/ms) in phase i, leaving phase i at rate switch[i] (1/ms)
    (:meth:`smdp_batch.model.arrivals.MAP.sample`, which also returns the phase path)."""
    r = [float(x) for x in rates]
    q = [float(x) for x in switch]
    if not all(math.isfinite(x) and x >= 0 for x in r) or max(r) <= 0:
        raise InputError(f"MMPP rates must be finite, ≥ 0 and not both 0, got {tuple(rates)}")
    if not all(math.isfinite(x) and x > 0 for x in q):
        raise InputError(f"MMPP switching rates must be finite and > 0, got {tuple(switch)}")
    r = [check_rate("MMPP rate", x, zero_ok=True) for x in r]
    q = [check_rate("MMPP switching rate", x) for x in q]
    from ..model.arrivals import MAP

    return MAP.mmpp(r, q).sample(n, rng)[0]


def read_trace(path: str, time_unit: str | None = None) -> np.ndarray:
    """Arrival timestamps in ms from a CSV: one column, or a column named arrival_ms (arrival_s, arrival_us,
    arrival_ns); sorted, ≥ 0.  ``time_unit`` (s, ms, us, ns) is the unit of the times; None: the header's,
    else ms, refusing a trace whose gaps look like another unit (:func:`smdp_batch.model.units.check_trace_unit`)."""
    from ..model.units import TIME_UNITS, check_trace_unit, to_ms

    if time_unit is not None and time_unit not in TIME_UNITS:
        raise InputError(f"unknown time unit {time_unit!r}; valid: s, ms, us, ns")
    rows = [r for r in read_csv_rows(path, "trace") if r and any(c.strip() for c in r)]
    col, start, unit = 0, 0, time_unit
    if rows and not _is_number(rows[0][0]):
        header = [c.strip().lower() for c in rows[0]]
        named = [u for u in ("ms", "s", "us", "ns") if f"arrival_{u}" in header]
        if not named:
            raise InputError(f"trace {path}: expected a column arrival_ms, arrival_s, arrival_us or arrival_ns "
                             f"(or one unnamed column of times), found {header}")
        col, start = header.index(f"arrival_{named[0]}"), 1
        if time_unit is not None and TIME_UNITS[time_unit] != TIME_UNITS[named[0]]:
            raise InputError(f"trace {path}: its column arrival_{named[0]} says {named[0]}, but --time-unit {time_unit} "
                             "was given; drop one")
        unit = named[0]
    cells = []
    for i in range(start, len(rows)):
        cell = rows[i][col].strip() if col < len(rows[i]) else ""
        if not _is_number(cell) or not math.isfinite(float(cell)) or float(cell) < 0:
            raise InputError(f"trace {path} line {i + 1}: {cell!r} is not a time ≥ 0 in {unit or 'ms'}")
        cells.append(cell)
    if not cells:
        raise InputError(f"trace {path} holds no arrival times")
    t = to_ms(cells, unit or "ms")
    bad = np.nonzero(np.diff(t) < 0)[0]
    if bad.size:
        i = int(bad[0])
        raise InputError(f"trace {path}: timestamps must be sorted; {t[i]:g} is followed by {t[i + 1]:g}")
    check_trace_unit(path, t, unit)
    return t


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


# ----------------------------------------------------------------------------------------- driver
def _check_arrivals(arrivals) -> np.ndarray:
    arr = np.asarray(arrivals, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise InputError("arrivals must be a non-empty 1-D array of times in ms")
    if not np.all(np.isfinite(arr)) or arr[0] < 0 or np.any(arr[1:] < arr[:-1]):
        raise InputError("arrival times must be finite, ≥ 0 and sorted")
    return arr


def _as_rule(rule, problem: BatchingProblem):
    from ..baselines.servers import ServerRule, busy_table_rule, is_busy_table, table_rule

    if hasattr(rule, "policy") and hasattr(rule, "s_max"):  # a Solution: states 0..s_max (S_o dropped, eq. 30)
        rule = np.asarray(rule.policy)[: rule.s_max + 1]
    if not isinstance(rule, ServerRule) and is_busy_table(rule):  # a busy-aware table of c instances
        rule = busy_table_rule(rule, problem.batch_sizes)
    rule = rule if isinstance(rule, ServerRule) else table_rule(rule, problem.batch_sizes)
    rule.check(problem.batch_sizes)
    return rule


def _instances(problem: BatchingProblem, rule) -> int:
    """The problem's instance count, for a rule the simulator runs on c instances sharing one queue (batches
    formed one at a time from it)."""
    c = problem.instances
    rows = rule.table.size // (rule.top + 1)
    if rule.mode in ("busy", "timer", "timer-pad") and rows > 1 and rows != c:
        raise InputError(f"{rule.spec} has a row for each of 0..{rows - 1} instances busy, so it runs on {rows} "
                         f"instances, not {c}: simulate it with --instances {rows}")
    if c > 1 and rule.mode not in ("table", "busy", "triton", "timer", "timer-pad", "ray"):
        raise InputError(
            f"{rule.spec} on {c} instances is not simulated: c instances sharing one queue are simulated for "
            "tables, tables with a timer and Triton's (TF-Serving's) rule, and Ray Serve's replicas behind its "
            "router; TorchServe's workers and phase or λ-bank tables are not modelled on several instances yet")
    return c


def _router_picks(rng: np.random.Generator, n: int, c: int) -> np.ndarray:
    """The ordered pair of distinct replicas Ray's power-of-two-choices router draws for each of n requests."""
    if c == 2:
        a = rng.integers(0, 2, n)
        return np.stack([a, 1 - a], axis=1)
    i = rng.integers(0, c, n)
    j = rng.integers(0, c - 1, n)
    return np.stack([i, j + (j >= i)], axis=1)


def _run(problem, rule, arr, rng, bounds, progress=None, n_base: int | None = None, per_batch=None):
    """Draw service times and run the kernel over ``arr`` on the problem's instances (sharing the queue; Ray:
    replicas behind its router); returns resp, group energy, histograms, state.  ``n_base``: the stream's own
    requests when ``arr`` continues it: the service times for those are drawn first, exactly as for the stream
    alone, and the continuation's after them.  ``per_batch(s)``: ms an executed size s holds its instance
    beyond its draw (a served-delay model's a + c·s): a batch takes l(s)·U + per_batch(s), U drawn as without it."""
    instances = _instances(problem, rule)
    n_req = arr.size
    n_base = n_req if n_base is None else int(n_base)
    smax_exec = max(rule.max_executed(), problem.bmax)
    lat_of = np.full(smax_exec + 1, np.nan)
    en_of = np.full(smax_exec + 1, np.nan)
    lat_of[list(problem.batch_sizes)] = problem.latency_ms()
    en_of[list(problem.batch_sizes)] = problem.energy_mj()
    law = problem.service
    det = isinstance(law, Deterministic)
    # one shape for every b (per-size pools when a per-batch time is added, so that each pool's draws shift exactly)
    shared = law.natural_latency() is None and not hasattr(law, "law_for") and per_batch is None
    unit, pool_of = unit_draws(law, rng, rule, n_base, n_req, smax_exec, shared, det)
    drawn = unit
    if per_batch is not None:  # l(s)·U + extra = (l(s) + extra)·U', U' = (l(s)·U + extra) / (l(s) + extra)
        for s in (list(rule.executed_sizes()) if not det else range(1, smax_exec + 1)):
            if not math.isfinite(lat_of[s]):
                continue
            extra_ms = float(per_batch(s))
            if not det:
                i = pool_of[s]
                unit = unit.copy() if unit is drawn else unit  # the drawn pools may be another run's too
                unit[i] = (lat_of[s] * unit[i] + extra_ms) / (lat_of[s] + extra_ms)
            lat_of[s] += extra_ms
    ptr = np.zeros(unit.shape[0], dtype=np.int64)
    resp = np.empty(n_req)
    genergy = np.zeros(bounds.size - 1)
    sizes_hist = np.zeros(smax_exec + 1, dtype=np.int64)
    qhist = np.zeros(4 * smax_exec + 2, dtype=np.int64)
    # head, next, latest start, group, phase pointer; contention: clock, busy instance-ms; batches the timer closed
    state = np.zeros(8)
    free = np.zeros(instances)  # when each instance is free (ms)
    cont = problem.contention is not None and instances > 1
    levels, executed = np.arange(instances + 1)[:, None], np.arange(smax_exec + 1)[None, :]
    # s_k(b) and e_k(b) by busy count k and executed size b (the same for every b unless given per size)
    slow = problem.contention.slow(levels, executed) if cont else np.ones((instances + 1, smax_exec + 1))
    efac = problem.contention.energy_factor(levels, executed) if cont else np.ones((instances + 1, smax_exec + 1))
    run = np.zeros((instances, 3), dtype=np.int64)  # contention: each instance's batch (first, size, executed)
    rem = np.zeros(instances)
    extra = np.zeros(instances)
    pad = rule.pad_map(smax_exec)
    chunk = 1_000_000
    ctx = rule.context(arr) if rule.mode == "context" else None
    if rule.mode == "ray" and instances > 1 and cont:  # replicas on one device that slow each other
        acc = np.zeros(1)
        _replicas_contention_kernel(arr, rule.maxb, rule.delay, pad, lat_of, en_of, det, pool_of, unit, ptr, resp,
                                    bounds, genergy, sizes_hist, qhist, _router_picks(rng, n_req, instances), instances,
                                    slow, efac, acc)
        state[0] = n_req
        state[6] = acc[0]
        cont = False  # every batch has ended
        if progress is not None:
            progress(n_req)
    elif rule.mode == "ray" and instances > 1:  # c replicas, each with its own queue, behind Ray's router
        _replicas_kernel(arr, rule.maxb, rule.delay, pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds, genergy,
                         sizes_hist, qhist, _router_picks(rng, n_req, instances), instances)
        state[0] = n_req
        if progress is not None:
            progress(n_req)
    while state[0] < n_req:
        before = int(state[0])
        if ctx is not None:
            got = _context_kernel(arr, *ctx, pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds, genergy,
                                  sizes_hist, qhist, state, min(before + chunk, n_req))
        else:
            got = _kernel(arr, MODES[rule.mode], rule.table, rule.top, rule.maxb, rule.pref, rule.delay, pad, lat_of,
                          en_of, det, pool_of, unit, ptr, resp, bounds, genergy, sizes_hist, qhist, state,
                          min(before + chunk, n_req), free, cont, slow, efac, run, rem, extra)
        if progress is not None:
            progress(int(state[0]) - before)
        if got < 0:
            break
    if cont:  # the batches still running end
        _advance(np.inf, run, rem, extra, slow, efac, lat_of, en_of, arr, resp, bounds, genergy, state)
    if ctx is not None or (rule.mode == "ray" and instances > 1):
        state[7] = np.nan  # only _kernel counts the batches a timer closed (not the context or replicas' loops)
    return resp, genergy, sizes_hist, qhist, state


def response_times(problem: BatchingProblem, rule, arrivals: np.ndarray, seed: int = 0, per_batch=None) -> np.ndarray:
    """Response time (ms) of every request of ``arrivals`` under ``rule`` (on the problem's instances sharing
    the queue); NaN for requests never served.  ``per_batch(s)``: ms a batch of executed size s holds its instance
    beyond its draw (a served-delay model's a + c·s).

    The bare simulation, without statistics (what :func:`simulate` summarises).
    """
    arr = _check_arrivals(arrivals)
    rule = _as_rule(rule, problem)
    resp, _, _, _, state = _run(problem, rule, arr, np.random.default_rng(seed), np.array([arr.size, arr.size]),
                                None, None, per_batch)
    resp[int(state[0]):] = np.nan
    return resp


def simulate(
    problem: BatchingProblem,
    rule,
    requests: int = 1_000_000,
    seed: int = 0,
    arrivals: np.ndarray | str | None = None,
    warmup: float = 0.05,
    batches: int = 20,
    percentiles=(50, 90, 95, 99),
    keep_responses: bool = False,
    progress: Callable[[int], None] | None = None,
    within_ms=(),
    idle_power_w: float = 0.0,
    tail: str = "auto",
    served=None,
) -> SimulationResult:
    """Simulate ``requests`` requests of ``problem`` under ``rule`` (a policy array or a server rule).

    With ``problem.instances`` = c > 1, c model instances share the one FIFO queue (Triton's
    ``instance_group { count: c }``): the rule forms batches one after the other, each when an instance is
    free, and a batch runs on the instance free earliest; a Ray Serve rule runs on c replicas, each with its
    own queue, behind Ray's power-of-two-choices router.  A table solved for one server runs as it is: the
    figures are those of that table on c instances, not of a table optimal for c.  With ``problem.contention``
    the instances (or Ray's replicas) slow each other down: while k are busy each batch of b progresses at
    1/s_k(b) and draws e_k(b)·ζ(b)/(s_k(b)·l(b)) W (:mod:`smdp_batch.specs.contention`), so its end is known
    only as it runs.

    ``arrivals``: None (Poisson at problem.lam), an array of sorted arrival times in ms, or a path to
    a trace CSV.  ``rule``: a policy table (array, policy[s] for s ≤ s_max, eq. 30 beyond) or a
    :class:`~smdp_batch.baselines.servers.ServerRule`.  ``within_ms``: latency bounds (ms) whose
    satisfaction share P(W ≤ bound) is reported (paper 004 Fig. 6(c)), with batch-means intervals.
    ``idle_power_w``: power (W) of an instance while it runs no batch, added to P̄ as idle_power_w × (c − the mean
    busy instances), the busy ones from the batches run and their mean times l(b), exact for fixed batch times
    (with contention, from the times the batches ran); its own sampling noise is left out of the interval.

    ``tail``: what arrives after the stream's last request.  ``"continue"``: the stream is a sample of a stationary
    process, so arrivals go on (Poisson at its mean rate, seeded apart from the service times, never counted)
    until every request of the stream is served as the rule serves it in steady state; without it the last
    requests would wait out a long timer, or for ever under a count-only table.  ``"end"``: nothing more arrives
    (a trace that ended): a timer fires on its own; requests a count-only rule never serves are left out of
    the figures.  ``"auto"`` (default): ``continue`` for the generated Poisson stream, ``end`` for given arrivals.

    ``served``: a :class:`~smdp_batch.model.served.ServedDelay`, what the real server adds: each batch of b holds
    its instance a + c·b ms beyond its draw, the k-th response of a batch (k = 0, 1, …) leaves k·r ms after the
    first, and every response gets an independent draw of the outside delay measured at the calibrated load
    nearest at or above the stream's rate (given arrivals with ``tail="continue"`` within 5 % of the problem's rate:
    the problem's) (:meth:`~smdp_batch.model.served.ServedDelay.add_to`); the figures are then
    the served response times, their intervals widened by the calibration sample's own (``halfwidth``).
    """
    t0 = time.perf_counter()
    if not (isinstance(idle_power_w, (int, float)) and not isinstance(idle_power_w, bool)
            and math.isfinite(idle_power_w) and 0 <= idle_power_w <= IDLE_POWER_MAX_W):
        raise InputError(f"idle power must be a number of W ≥ 0 and ≤ {IDLE_POWER_MAX_W:g}, got {idle_power_w!r}")
    if tail not in ("auto", "continue", "end"):
        raise InputError(f"tail must be 'auto', 'continue' or 'end', got {tail!r}")
    go_on = arrivals is None if tail == "auto" else tail == "continue"
    rng = np.random.default_rng(seed)
    if isinstance(arrivals, str):
        arr = read_trace(arrivals)
    elif arrivals is not None:
        arr = _check_arrivals(arrivals)
    else:
        try:
            n = int(requests)
        except (TypeError, ValueError):
            raise InputError(f"requests must be a positive integer, got {requests!r}") from None
        if n < 100:
            raise InputError(f"requests must be ≥ 100 for meaningful statistics, got {requests!r}")
        arr = poisson_arrivals(problem.lam, n, rng)
    if not (0 <= warmup < 0.9):
        raise InputError(f"warmup must be a fraction in [0, 0.9), got {warmup!r}")
    if int(batches) < 2:
        raise InputError(f"batches (for the confidence intervals) must be ≥ 2, got {batches!r}")
    bounds_ms = [float(b) for b in within_ms]
    if any(not (math.isfinite(b) and b > 0) for b in bounds_ms):
        raise InputError(f"latency bounds for satisfaction shares must be positive ms, got {list(within_ms)!r}")
    rule = _as_rule(rule, problem)
    _instances(problem, rule)  # refused before any work
    per_batch = None
    if served is not None:
        if problem.contention is not None and problem.instances > 1:
            raise InputError("a served-delay model with contention between instances is not simulated yet")
        per_batch = served.per_batch_ms
    n_req = arr.size
    check_capacity(problem, rule, None if arrivals is None else arr)
    w = int(warmup * n_req)
    if n_req - w < 2 * int(batches):  # every batch-means group needs requests (a one-line trace had none)
        raise InputError(
            f"the arrival stream holds {n_req} request(s), {n_req - w} after the warm-up; {int(batches)} batch-means "
            f"groups need at least {2 * int(batches)}: use a longer stream or fewer --batches"
        )
    bounds = np.linspace(w, n_req, int(batches) + 1).astype(np.int64)  # the last end may move to the served count
    if not go_on:
        run_arr = arr
        resp, genergy, sizes_hist, qhist, state = _run(problem, rule, arr, rng, bounds, progress, None, per_batch)
    else:  # the stream goes on past its end: one run, again with a longer continuation only if it ran out
        drawn, extra = rng.bit_generator.state, CONTINUATION
        while True:
            run_arr = _continued(arr, problem.lam if arrivals is None else None, extra, seed)
            resp, genergy, sizes_hist, qhist, state = _run(problem, rule, run_arr, rng, bounds, progress, n_req,
                                                           per_batch)
            if int(state[0]) >= n_req and arr[-1] + resp[n_req - 1] <= run_arr[-1] or extra > 4 * n_req + 65536:
                break  # the stream's last request was served before the continuation ran out
            rng.bit_generator.state, extra, progress = drawn, extra * 4, None  # the same service times again
    n_served = int(state[0])  # requests 0..n_served−1 of run_arr were served (FIFO)
    last = min(n_served, n_req)  # those of the stream
    if last < n_req:  # the rule left requests waiting for ever (e.g. static b with fewer than b left)
        if n_req - last > max(rule.maxb, 1) * 4 or last - w < 10 * int(batches):
            raise InputError(
                f"only {last} of {n_req} requests were served; the rule never serves the rest "
                "(static b above what arrives?) or the run is too short"
            )
        if last - bounds[-2] < 2:
            raise InputError(f"the run is too short for {int(batches)} batch-means groups: use more requests or fewer batches")
        bounds[-1] = last  # unserved requests carried no energy: only the last group's end moves
    if served is not None:
        lam_run = problem.lam if arrivals is None else (n_req - 1) / max(float(arr[-1] - arr[0]), 1e-300)
        if arrivals is not None and go_on and abs(lam_run / problem.lam - 1.0) < _SAMPLE_RATE_TOL:
            lam_run = problem.lam  # a sample drawn at the problem's rate (the SLO search's streams): the load it is
        served.add_to(arr[:last], resp[:last], lam_run, seed)  # for, not its own rate a little above or below
    r = resp[w:last]
    a = arr[w:last]
    _check_stable(rule, r, a)
    gap = (a[-1] - a[0]) / max(a.size - 1, 1)
    rel = bounds - w
    slices = [slice(int(rel[g]), int(rel[g + 1])) for g in range(int(batches))]
    mean_g = np.array([r[sl].mean() for sl in slices])
    power_g = np.array([genergy[g] / (a[sl.stop - 1] - a[sl.start] + gap) for g, sl in enumerate(slices)])
    tq = float(stdtrit(len(slices) - 1, 0.975))
    ci = lambda x: tq * float(np.std(x, ddof=1)) / math.sqrt(len(x))
    duration = a[-1] - a[0] + gap
    mean_latency = float(r.mean())
    kept = r.copy() if keep_responses else None
    within = {b: float(np.count_nonzero(r <= b) / r.size) for b in bounds_ms}
    within_ci = {b: ci(np.array([np.count_nonzero(r[sl] <= b) / (sl.stop - sl.start) for sl in slices]))
                 for b in bounds_ms}
    names = [f"p{int(q) if float(q).is_integer() else q}_ms" for q in percentiles]
    pct_g, pct_all = group_percentiles(r, rel, percentiles)
    pct = dict(zip(names, pct_all.tolist()))
    pct_ci = {k: ci(pct_g[:, i]) for i, k in enumerate(names)}
    if served is not None:  # the calibration sample is finite too
        pct_ci = {k: math.hypot(v, served.halfwidth(lam_run, q, pct[k]))
                  for (k, v), q in zip(pct_ci.items(), percentiles)}
    counts = {int(s): int(c) for s, c in enumerate(sizes_hist) if c}
    n_batches = int(sizes_hist.sum())
    idle = 0.0
    if idle_power_w:  # every batch run (from the first request on) over the time they were run in
        run_ms = state[6] if problem.contention is not None and problem.instances > 1 else \
            sum(c * float(problem.latency(np.float64(s))) for s, c in counts.items())
        busy = run_ms / (run_arr[n_served - 1] - run_arr[0] + gap)
        idle = float(idle_power_w) * max(problem.instances - busy, 0.0)
    return SimulationResult(
        requests=n_req, measured=int(r.size),
        mean_latency_ms=mean_latency,
        mean_latency_ci=ci(mean_g) if served is None else math.hypot(ci(mean_g), served.halfwidth(lam_run, None)),
        mean_power_w=float(genergy.sum() / duration) + idle, mean_power_ci=ci(power_g),
        throughput=float(r.size / duration), mean_batch_size=float(n_served / n_batches) if n_batches else 0.0,
        percentiles=pct, percentile_ci=pct_ci, batch_size_counts=counts,
        queue_at_start=qhist[: int(np.nonzero(qhist)[0][-1]) + 1] if qhist.any() else qhist[:1],
        seconds=time.perf_counter() - t0, seed=seed, response_ms=kept, within=within, within_ci=within_ci,
        group_latency=mean_g, group_power=power_g + idle,
        timer_batches=int(state[7]) if math.isfinite(state[7]) else None,
    )


#: A stream given with ``tail="continue"`` whose own rate is within this share of the problem's is a sample drawn at the
#: problem's rate: the served delay is drawn at that load (a calibrated load it is planned at, not the next one up).
_SAMPLE_RATE_TOL = 0.05

#: Arrivals the continuation of a stream starts with (``tail="continue"``); four times more while they run out.
CONTINUATION = 1024


#: The continued streams of the streams still alive, by the id of the stream they continue (a weak reference
#: checks it is the same array, and drops the entry when the stream goes): the SLO search simulates hundreds of
#: settings on each of a few streams, and a continued copy of a 2·10⁵-request stream built for each (a fresh
#: array, cold in the cache) cost a quarter of the search.
_CONTINUED: dict[int, tuple] = {}
_CONTINUED_LOCK = threading.Lock()  # the SLO search simulates on threads (the weak reference's drop is one atomic pop)


def _continued(arr: np.ndarray, lam: float | None, extra: int, seed) -> np.ndarray:
    """``arr`` and ``extra`` more Poisson arrivals after it, at ``lam`` (default: the stream's mean rate), from a
    generator of their own (the service times drawn for the stream stay as they are).  Read-only; the same
    array for the same stream and arguments."""
    key = (lam, int(extra), seed)
    with _CONTINUED_LOCK:
        hit = _CONTINUED.get(id(arr))
    if hit is not None and hit[0]() is arr and hit[1] == key:
        return hit[2]
    rate = lam if lam is not None else (arr.size - 1) / float(arr[-1] - arr[0])
    more = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0]).exponential(1.0 / rate, int(extra))
    out = np.concatenate([arr, arr[-1] + np.cumsum(more)])
    out.setflags(write=False)
    i = id(arr)
    with _CONTINUED_LOCK:
        while len(_CONTINUED) >= 16:  # a few streams at a time: drop the oldest
            _CONTINUED.pop(next(iter(_CONTINUED)), None)
        _CONTINUED[i] = (weakref.ref(arr, lambda _: _CONTINUED.pop(i, None)), key, out)
    return out


def rule_capacity(problem: BatchingProblem, rule) -> tuple[float, int]:
    """The most requests/ms a rule can serve: max over the batch sizes it executes of b/l(b) (and the b)."""
    sizes = list(problem.batch_sizes)
    lat = dict(zip(sizes, problem.latency_ms()))
    best, at = 0.0, 0
    for s in rule.executed_sizes():
        if s in lat and s / lat[s] > best:
            best, at = s / float(lat[s]), s
    return best, at


def check_capacity(problem: BatchingProblem, rule, arr: np.ndarray | None = None) -> None:
    """Refuse a rule that cannot carry the offered load: steady-state figures would be meaningless."""
    rate = problem.lam
    if arr is not None and arr.size > 1 and arr[-1] > arr[0]:
        rate = (arr.size - 1) / float(arr[-1] - arr[0])
    cap, at = rule_capacity(problem, rule)
    cap *= problem.instances
    if not rate < cap:
        on = f" on {problem.instances} instances" if problem.instances > 1 else ""
        raise InputError(
            f"{rule.spec} serves at most {cap:.6g} req/ms{on} (batches of {at} every l({at}) ms) < λ = {rate:.6g} "
            "req/ms: the queue grows without bound; use a lower load or a rule with larger batches"
        )


def _check_stable(rule, r: np.ndarray, a: np.ndarray) -> None:
    """Refuse to summarise a run whose queue kept growing (item 12b): the response times trend up
    (last third ≥ 2× the first and a clear regression slope), and departures lag arrivals."""
    n = r.size
    if n < 300:
        return
    third = n // 3
    first, last = float(r[:third].mean()), float(r[-third:].mean())
    if not last > 2.0 * first + 1e-9:
        return
    g = np.array([x.mean() for x in np.array_split(r, 30)])
    x = np.arange(g.size, dtype=np.float64)
    slope, icpt = np.polyfit(x, g, 1)
    resid = g - (slope * x + icpt)
    se = math.sqrt(float(resid @ resid) / (g.size - 2) / float(((x - x.mean()) ** 2).sum())) or 1e-300
    if slope / se < 6.0:
        return
    span_in = float(a[-1] - a[0])
    span_out = float((a + r).max() - a[0])
    growth = (n / span_in - n / span_out) if span_in > 0 and span_out > 0 else 0.0
    raise InputError(
        f"unstable: under {rule.spec} the queue grows at {max(growth, 0.0):.4g} req/ms (response times rise from "
        f"{first:.4g} ms to {last:.4g} ms over the run); no steady-state figures exist — use a lower load or another rule"
    )
