"""The SLO optimiser: the least power that meets latency SLOs at every load the server sees.

The question a serving engineer brings is "my p99 must stay under X ms at the loads my server sees:
which setting draws the least power?".  This module answers it, for every rule family, with one
search; ``compare``, ``pareto``'s SLO pick, ``export --slo…`` and the λ-bank all call :func:`optimise`,
so the same inputs give the same answer, to the digit, everywhere.

**Families** (semantics in :mod:`smdp_batch.baselines.servers`):

* ``smdp`` — an SMDP table (paper 004, eq. 14, solved at the top load; its largest batch capped where that
  saves power) with a timer τ on the oldest
  request's wait (:func:`~smdp_batch.baselines.servers.table_timer`: exactly how
  :class:`~smdp_batch.runtime.DynamicBatcher` runs it with ``max_wait_ms`` = τ).  τ = ∞ is the pure table;
  a count-only table cannot bound the oldest request's wait when traffic is light, a timer can.
* ``triton`` (``max_queue_delay`` D, max = Bmax), ``triton-preferred`` (``preferred_batch_size`` [Q..Bmax]
  and D), ``tfserving`` (``batch_timeout_micros``), ``ray`` (``batch_wait_timeout_s``), ``torchserve``
  (``max_batch_delay``): each server's own rule, its knobs searched.
* ``table+timer`` — the best of the whole table + timer family: the SMDP tables and the Triton forms,
  which are members of it (Triton's rule *is* a table + timer; ``tests/test_slo.py`` checks the two
  simulations agree request by request).  So its power is never above Triton's or TF-Serving's best, by
  construction; Ray Serve's and TorchServe's timers are not members, and are searched beside it.

**Search.**  Every knob is searched continuously on its monotone direction: more waiting (a larger
delay τ or D, a larger w2) gives larger batches, less power and more latency.  For one table and one
server rule, the largest feasible delay is bracketed by doubling from a start (a neighbour's answer where
there is one) and bisected to 1 %; the SMDP tables are the distinct policies of the w2 front
(:func:`~smdp_batch.analysis.pareto.sweep_w2`: every vertex policy up to its ftol, with its exact w2
range), each one tried; Triton's Q over every allowed size.  Power over these is not unimodal once
simulated percentiles and their intervals decide (measured: hyperexponential service), so none is skipped
by a golden section.  There is no fixed grid: the answer's w2 range, τ and D are those of the optimum up to
the tolerances.

**Feasibility.**  A setting meets the SLO when, at every load asked about, each bounded metric (mean,
p50, p90, p95, p99 latency) plus its 95 % batch-means half-width is at most its bound: a setting chosen
at the boundary would otherwise break the SLO on a fresh seed half of the time.  Every candidate runs on
the same arrivals (common random numbers: one seeded stream of unit-rate gaps scaled to each load, or a
given trace or MAP sample scaled the same way), so settings are compared on equal terms.  Power is the
mean of P̄ over the loads (equal time at each); the *worst load* is the one with the least margin.

**Screen.**  Most candidates of a search miss the SLO plainly, so each is first simulated on the first
1/:data:`SCREEN` of each load's stream (where that is ≥ :data:`SCREEN_MIN` requests): where a bounded metric less
its half-width there is already beyond its limit, the setting fails at that load; otherwise the whole stream
decides.  A setting is never *accepted* on a screen: with heavy-tailed batch times a screen's interval can look
comfortable where the whole stream's is not (measured: hyperexponential times, a setting 0.26 W worse picked),
so every setting that meets the SLO, and every figure printed, is a whole stream's.

**Reach.**  First the settings that wait least are simulated at every load: serving what is waiting at once in
batches of at most Bmax, Bmax/2, … (Triton with no delay), and the SMDP table of least mean latency.  Where even
their best misses a bound by more than :data:`REACH_MARGIN` of it at some load, the SLO is out of reach and
nothing else is searched: the answer comes in a second.  Whenever no setting meets the SLO, the answer names the
least each bounded metric reached (plus its half-width: the bound that setting would meet) at the load where it
is hardest, and by which setting (``SLOAnswer.reach``).

**Fresh check.**  The recommendation is simulated again at every load on a stream it was not chosen on (the next
seed, :data:`FRESH` times as many requests, at most 10⁶): ``SLOAnswer.fresh``; it holds where every bounded
metric's estimate there is within its limit (``SLOAnswer.fresh_holds``).  Choosing the largest delay that
meets the SLO on one stream favours a setting that stream flatters, and with heavy-tailed batch times (lognormal
σ = 1) the p99's batch-means interval at 2·10⁵ requests is too narrow: the check is how the answer says so
instead of a user's server.

**Threads.**  The rule families' searches are independent, and so are the defaults' runs and the fresh check's
loads: they run on threads (:data:`MAX_WORKERS` at most, one per CPU this process may use), the simulator's
event loops releasing the GIL; each capped table front is solved on a thread of its own while the tables
before it are simulated, the first capped front (always searched) is searched beside the full one, and the full
front's sweep runs its rounds of solves on threads (the solver's kernels release the GIL too).  Every search
sees the same streams and the same draws whatever runs beside it, so the answer is the same to the digit with
one thread or several (``tests/test_slo_speed.py``).  BLAS runs on one thread for the whole search: its threads
are the search's parallelism, and OpenBLAS's own threads, woken by each small call outside a solve, spun on the
cores the simulations needed (lognormal:1 at one load on 2 cores: 17.2 s of CPU for 9.2 s, against 12.3 s for
7.2 s).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar, cast

import numpy as np

from ..baselines.servers import (ServerRule, ray_serve, server_padding, table_timer, tf_serving, torchserve, triton,
                                 triton_table)
from ..errors import InputError
from ..limits import usable_cpus
from ..model.problem import BatchingProblem
from ..model.served import floor_ms
from .delay_search import largest_delay as _largest_delay
from .loads import load_grid
from .power_floor import poisson_stream
from .slo_answer import (_CI, DEFAULT_SETTINGS, FAMILIES, METRICS, RULE_FAMILIES, SLO, LoadResult, Setting, SLOAnswer,
                         _better)

__all__ = ["METRICS", "SLO", "LoadResult", "Setting", "SLOAnswer", "optimise", "load_grid", "RULE_FAMILIES",
           "FAMILIES", "DEFAULT_SETTINGS"]

#: The screen: a candidate is first simulated on the first 1/SCREEN of each load's stream (module doc) …
SCREEN = 8
#: … where that is at least this many requests (a shorter screen's intervals decide too little).
SCREEN_MIN = 20_000
#: The answer is simulated again on a fresh stream (the next seed) FRESH times as long (at most
#: REQUESTS_LIMIT_FRESH requests a load): an independent check of the interval it was chosen on, which heavy-tailed
#: batch times can make too narrow (module doc, *Fresh check*).
FRESH, REQUESTS_LIMIT_FRESH = 5, 1_000_000
#: An SLO is out of reach, and answered without the search, when even the settings that wait least miss a bound
#: by more than this share of it (module doc, *Reach*).  Tables with a short timer and a capped largest batch
#: beat them on p99 by up to 15 % (measured: exponential, gamma 0.5 and hyperexponential times at ρ 0.5 and 0.8;
#: tests/test_slo_speed.py checks that the search finds nothing just inside this margin).
REACH_MARGIN = 0.25
#: The most threads the rule families are searched on (module doc, *Threads*).
MAX_WORKERS = 4
#: The SMDP tables of a front are searched this many at a time (each from the τ the tables before them found):
#: a constant, so that the answer is the same on any number of threads.
WAVE = 2


def default_workers() -> int:
    """The threads a search runs on by default: the CPUs this process may use, at most :data:`MAX_WORKERS`."""
    return min(MAX_WORKERS, usable_cpus())


def _in_parallel(thunks: list, workers: int | None) -> list:
    """Each thunk's result, in order; on up to ``workers`` threads (None or 0: :func:`default_workers`), taken in
    the order given (the longest first).  The simulator's event loops release the GIL, so the families'
    simulations run at once; each search is the same whatever runs beside it."""
    workers = max(1, min(int(workers or default_workers()), len(thunks)))
    if workers == 1:
        return [f() for f in thunks]
    with ThreadPoolExecutor(workers, thread_name_prefix="slo-search") as pool:
        return [f.result() for f in [pool.submit(t) for t in thunks]]

# ------------------------------------------------------------------------------------------ the search
class _Checker:
    """Simulates settings at every load on common random numbers, and counts the work."""

    def __init__(self, problem: BatchingProblem, slo: SLO, lams: list[float], requests: int, seed: int,
                 unit_arrivals: np.ndarray | None, progress=None, idle_power_w: float = 0.0, served=None):
        from ..limits import check_requests

        self.problem, self.slo, self.lams, self.seed, self.idle_w = problem, slo, lams, int(seed), idle_power_w
        self._lock = threading.Lock()  # rule families are searched on threads (module doc, *Threads*)
        self.workers: int | None = None  # threads for the searches that run inside one family (the SMDP tables)
        self.served = served
        self.requests = check_requests(requests, "requests")
        if self.requests < 1000:
            raise InputError(f"requests per load must be ≥ 1000 for percentile intervals, got {requests!r}")
        if unit_arrivals is None:  # one seeded stream of unit-rate gaps, scaled to each load
            unit = poisson_stream(self.requests, self.seed)
        else:
            unit = np.asarray(unit_arrivals, dtype=np.float64)
        self.unit = unit  # the unit-rate stream, scaled to each load (the power floor reads it too)
        self.problems = [problem.replace(lam=lam) for lam in lams]
        self.arrivals = [unit / lam for lam in lams]
        # the loads most likely to fail first: both ends, then the rest
        self.order = sorted(range(len(lams)), key=lambda i: (i not in (0, len(lams) - 1), i))
        self.count = 0
        self.progress = progress
        self.reach: list[dict] = [{} for _ in lams]  # per load: metric → (least value, its half-width, setting)
        self.scale = 4.0 * min(b for _, b in slo.bounds)  # where the delay searches start (see _largest_delay)
        # the percentiles the bounds need (the others would cost a partition of every batch-means group)
        self.levels = tuple(float(m[1:]) for m, _ in slo.bounds if m != "mean") or (50.0,)
        # the screen (module doc): the first 1/SCREEN of each load's stream, where that is ≥ SCREEN_MIN requests
        n = self.requests // SCREEN
        self.screens = [np.ascontiguousarray(a[:n]) for a in self.arrivals] if n >= SCREEN_MIN else None

    def run(self, family: str, rule: ServerRule, knobs: dict, full: bool = False, policy=None,
            workers: int = 1) -> Setting:
        """``rule`` at every load (the loads likeliest to fail first); ``full``: every load even after one fails,
        and no screen (the figures are reported whatever they are), on up to ``workers`` threads.  Otherwise a
        load whose screen shows a plain miss fails the setting there (module doc); every figure of a setting that
        meets the SLO is a whole stream's."""
        if full:
            loads = _in_parallel([lambda i=i: self._load(i, rule, self.arrivals[i]) for i in self.order], workers)
            loads.sort(key=lambda x: x.lam)
            return Setting(family, rule.spec, knobs, loads, all(x.meets for x in loads), rule, policy)
        loads = []
        meets = True
        for i in self.order:
            got = None
            if self.screens is not None:
                got = self._load(i, rule, self.screens[i])
                if not any(got.metrics[m] - got.ci[m] > self.slo.limit(m) for m, _ in self.slo.bounds):
                    screen, got = got, self._load(i, rule, self.arrivals[i])  # no plain miss: the whole stream decides
                    fired = (None if screen.timer_batches is None or got.timer_batches is None
                             else screen.timer_batches + got.timer_batches)
                    got = dataclasses.replace(got, timer_batches=fired)
            if got is None:
                got = self._load(i, rule, self.arrivals[i])
            loads.append(got)
            if not got.meets:
                meets = False
                break
        loads.sort(key=lambda x: x.lam)
        return Setting(family, rule.spec, knobs, loads, meets, rule, policy)

    def _load(self, i: int, rule: ServerRule, arrivals: np.ndarray) -> LoadResult:
        """``rule`` at load i on ``arrivals`` (that load's stream or its screen)."""
        from .simulate import simulate

        with self._lock:
            self.count += 1
            if self.progress is not None:
                self.progress(1)
        try:
            res = simulate(self.problems[i], rule, arrivals=arrivals, seed=self.seed, idle_power_w=self.idle_w,
                           tail="continue",  # the stream is a sample: it goes on
                           served=self.served, percentiles=self.levels)
        except InputError as e:  # cannot carry this load: never meets the SLO
            if not str(e).startswith(("unstable", rule.spec, "only ")):
                raise
            inf = {m: math.inf for m, _ in self.slo.bounds}
            return LoadResult(self.lams[i], inf, dict.fromkeys(inf, 0.0), math.inf, 0.0, math.nan, False, None)
        d = res.as_dict()
        vals = {m: float(d[METRICS[m]]) for m, _ in self.slo.bounds}
        cis = {m: float(d[_CI[m]]) for m, _ in self.slo.bounds}
        ok = all(vals[m] + cis[m] <= self.slo.limit(m) for m, _ in self.slo.bounds)
        if arrivals is self.arrivals[i]:  # the least each metric reached here (with its half-width), and by what
            with self._lock:  # ties go to the first spec in sort order, whichever thread came first
                for m, _ in self.slo.bounds:
                    old = self.reach[i].get(m)
                    if old is None or (vals[m] + cis[m], rule.spec) < (old[0] + old[1], old[2]):
                        self.reach[i][m] = (vals[m], cis[m], rule.spec)
        return LoadResult(self.lams[i], vals, cis, res.mean_power_w, res.mean_power_ci, res.mean_batch_size, ok,
                          res.timer_batches)


def not_simulated(problem: BatchingProblem) -> set[str]:
    """The rule families the simulator does not run on this problem's instances: TorchServe's workers on c > 1
    (each with its own queue)."""
    return {"torchserve"} if problem.instances > 1 else set()


_F = TypeVar("_F", bound=Callable[..., Any])


def _one_blas_thread(search: _F) -> _F:
    """``search`` with BLAS on one thread while it runs (module doc, *Threads*)."""
    @functools.wraps(search)
    def run(*args, **kwargs):
        from ..solvers.threads import single_blas

        with single_blas():
            return search(*args, **kwargs)
    return cast(_F, run)


@_one_blas_thread
def optimise(problem: BatchingProblem, slo: SLO | dict, lams: list[float] | None = None, *,
             families=FAMILIES, requests: int = 200_000, seed: int = 0, arrivals: np.ndarray | None = None,
             solve_lam: float | None = None, defaults: bool = True, progress=None, current=None,
             idle_power_w: float = 0.0, idle_power_given: bool | None = None, served=None,
             workers: int | None = None) -> SLOAnswer:
    """Per family, the least-power setting that meets ``slo`` at every load in ``lams`` (module doc).

    ``lams``: loads in requests/ms (default: ``problem.lam``; :func:`load_grid` makes a range).
    ``arrivals``: a trace or MAP sample (ms) to use instead of Poisson arrivals; it is scaled to each load.
    ``solve_lam``: the load the SMDP tables are solved at (default: the top load).  ``families``: which to
    search (``table+timer`` needs ``smdp`` and the Triton forms, and searches them).  ``requests``: per load.
    ``current``: the user's own rule (a ServerRule), simulated at every load on the same arrivals.
    ``idle_power_w``: power of an idle instance (W), added to every setting's P̄ (see ``simulate``);
    ``idle_power_given``: whether it was measured or given (default: when it is not 0), else the answer says
    that 0 W was assumed.  ``served``: a :class:`~smdp_batch.model.served.ServedDelay` measured on the server
    (``smdp-batch calibrate``): every setting's metrics are then the served response times (``simulate``), and a
    load beyond what the server's own path carried is refused with the figure measured there.  ``workers``:
    threads the rule families are searched on (default: the CPUs this process may use, at most
    :data:`MAX_WORKERS`; 1 searches them one after another) — the answer is the same either way.
    """
    t0 = time.perf_counter()
    slo = slo if isinstance(slo, SLO) else SLO.of(slo)
    slo.check_reachable(problem, seed)
    lams = [float(problem.lam)] if lams is None else [float(x) for x in lams]  # validated by _Checker's problems
    for lam in lams if served is not None else ():
        why = served.beyond(lam)
        if why:
            raise InputError(f"{why}: check loads up to that, or calibrate on a host that carries more")
    if served is not None:  # l(b) as the server ran it
        problem = served.apply(problem)
        _check_served_reachable(problem, slo, lams, served)
    unit = None
    if arrivals is not None:
        arr = np.asarray(arrivals, dtype=np.float64)
        if arr.ndim != 1 or arr.size < 1000 or not np.all(np.diff(arr) >= 0) or not arr[-1] > arr[0]:
            raise InputError("arrivals for the SLO search must be ≥ 1000 sorted times in ms")
        unit = (arr - arr[0]) * ((arr.size - 1) / (arr[-1] - arr[0]))  # mean rate 1/ms, then scaled per load
    chk = _Checker(problem, slo, lams, requests if unit is None else unit.size, seed, unit, progress, idle_power_w,
                   served)
    chk.workers = workers
    sizes = problem.batch_sizes
    B = problem.bmax
    cap = 4.0 * max(b for _, b in slo.bounds)  # waiting longer than this can only break the SLO
    fams = set(families) - not_simulated(problem)
    unknown = fams - set(FAMILIES)
    if unknown:
        raise InputError(f"unknown family {sorted(unknown)[0]!r}; valid: {', '.join(FAMILIES)}")
    if "table+timer" in fams:
        fams |= {"smdp", "triton", "triton-preferred"}
    best: dict[str, Setting | None] = {}
    out_of_reach = _out_of_reach(problem, chk, max(lams) if solve_lam is None else float(solve_lam))
    searched = set() if out_of_reach else fams  # out of reach: nothing is searched, the answer says what is reachable

    def delay_family(name: str, make, knob: str, value, guess=None) -> Setting | None:
        return _largest_delay(lambda d: chk.run(name, make(d), {knob: value(d)}), cap, guess, scale=chk.scale)

    # the knobs are rounded as the servers' configs write them (whole µs, 6 digits of s, whole ms), so a
    # setting found here is exactly the one exported
    us = lambda d: float(round(d * 1000.0))
    # the servers form any batch ≤ their maximum: with other allowed sizes (TensorRT profiles 1,2,4,…) the
    # model pads each batch up to the next allowed size, and its time and energy are paid
    pad = server_padding(sizes)
    full = not pad
    jobs: dict[str, Callable[[], Setting | None]] = {}  # the searches, longest first (they run on threads)
    if "triton-preferred" in searched:
        def preferred() -> Setting | None:
            found: dict[int, Setting | None] = {}

            def by_q(q: int) -> None:
                pref = [s for s in sizes if s >= q]
                near = [found[k] for k in sorted(found, key=lambda k: abs(k - q)) if found[k] is not None]
                # near holds no None (filtered above)
                guess = near[0].knobs["delay_us"] / 1000.0 if near and near[0].knobs["delay_us"] > 0 else None  # type: ignore[union-attr]
                found[q] = _largest_delay(
                    lambda d: chk.run("triton-preferred", triton(B, us(d), pref, pad), {"Q": q, "delay_us": us(d),
                                                                                   "preferred": pref}), cap, guess,
                    scale=chk.scale)

            for q in reversed(sizes):  # every Q: the power over Q need not be unimodal once percentiles decide
                by_q(q)
            pick = None
            for s in found.values():
                pick = _better(pick, s)
            return pick

        jobs["triton-preferred"] = preferred
    if "smdp" in searched:
        jobs["smdp"] = lambda: _smdp_family(problem, chk, cap, max(lams) if solve_lam is None else float(solve_lam))
    if "triton" in searched:
        jobs["triton"] = lambda: delay_family("triton", lambda d: triton(B, us(d), (), pad), "delay_us", us)
    if "tfserving" in searched:
        jobs["tfserving"] = lambda: delay_family("tfserving", lambda d: tf_serving(B, us(d), pad), "timeout_us", us)
    if "ray" in searched:
        secs = lambda d: float(f"{d / 1000.0:.6g}")
        jobs["ray"] = lambda: delay_family("ray", lambda d: ray_serve(B, secs(d), pad), "timeout_s", secs)
    if "torchserve" in searched:  # TorchServe's maxBatchDelay is a whole number of ms
        jobs["torchserve"] = lambda: delay_family("torchserve", lambda d: torchserve(B, math.floor(d), pad),
                                                  "delay_ms", lambda d: float(math.floor(d)))
    best.update(zip(jobs, _in_parallel(list(jobs.values()), workers)))
    if "table+timer" in searched:
        members = [best.get("smdp")]
        # Triton's rule is a table + timer when every size 1..B is allowed (no padding): then it is a member
        # Triton's rule is a table + timer (with padded profiles, its forced batch is the "pad" form)
        form, suffix = ("pad", ":pad") if pad else ("largest", "")
        triton_forms = (("triton", lambda s: triton_table(B)),
                        ("triton-preferred", lambda s: triton_table(B, s.knobs["preferred"])))
        for fam, to_table in triton_forms:
            s = best.get(fam)
            if s is not None:
                tau = s.knobs["delay_us"] / 1000.0
                pol = to_table(s)
                spec = (f"static:{B}" if fam == "triton" else f"control:{s.knobs['Q']}") + f"+timer:{tau:g}{suffix}"
                members.append(Setting("table+timer", spec, {"table": spec.partition("+")[0], "tau_ms": tau,
                                                             "forced": form, "same_as": s.spec}, s.loads, s.meets,
                                       table_timer(pol, sizes, tau, spec=spec, forced=form), pol.tolist()))
        pick = None
        for m in members:
            pick = _better(pick, m)
        if pick is not None and pick.family != "table+timer":
            pick = Setting("table+timer", pick.spec, pick.knobs, pick.loads, pick.meets, pick.rule, pick.policy)
        best["table+timer"] = pick
    wanted = [f for f in FAMILIES if f in fams and (f in set(families) or "table+timer" in set(families))]
    best = {f: best.get(f) for f in wanted}
    runs: list[Callable[[], Setting]] = []  # the defaults, then the user's own rule: every load, on threads
    if defaults:
        from ..baselines.servers import parse_rule

        for spec in DEFAULT_SETTINGS:
            if spec.partition(":")[0] in not_simulated(problem):
                continue
            try:
                text = spec.format(B=B) + ("" if full else (",allowed=" if spec.startswith("tf") else ",pad=")
                                           + "/".join(map(str, sizes)))
                rule = parse_rule(text, problem)
                rule.check(sizes)
            except InputError:  # e.g. Ray's max_batch_size 10 is not an allowed size here
                continue
            runs.append(functools.partial(chk.run, spec.split(":")[0], rule, {"default": True}, full=True))
    if current is not None:
        runs.append(functools.partial(chk.run, current.spec.partition(":")[0].partition("+")[0], current,
                                      {"current": True}, full=True))
    done = _in_parallel(runs, workers)
    dflt: list[Setting] = done[: len(done) - (current is not None)]
    cur = done[-1] if current is not None else None
    ans = SLOAnswer(slo, lams, max(lams) if solve_lam is None else float(solve_lam), best, dflt, chk.requests,
                    int(seed), chk.count, math.nan, cur, problem, float(idle_power_w),
                    bool(idle_power_w) if idle_power_given is None else bool(idle_power_given), served,
                    _reach(chk), out_of_reach, unit_arrivals=chk.unit)
    rec = ans.recommended
    if rec is not None and rec.rule is not None and unit is None:  # a trace or MAP sample has no second stream
        again = _Checker(problem, slo, lams, min(FRESH * chk.requests, REQUESTS_LIMIT_FRESH), int(seed) + 1, None,
                         None, idle_power_w, served)
        ans.fresh = again.run(rec.family, rec.rule, rec.knobs, full=True, policy=rec.policy, workers=workers or 0)
        ans.fresh_requests = again.requests
    ans.seconds = time.perf_counter() - t0
    return ans


def _carries(problem: BatchingProblem, c: int, lam: float) -> bool:
    """Whether c is an allowed size and batches of c on the problem's instances serve more than ``lam`` req/ms."""
    return c in problem.batch_sizes and problem.instances * c / float(problem.latency(np.float64(c))) > lam


def _out_of_reach(problem: BatchingProblem, chk: _Checker, solve_lam: float) -> bool:
    """Whether the SLO is out of reach at some load (module doc, *Reach*): even the settings that wait least miss
    a bound there by more than :data:`REACH_MARGIN` of it, each metric with its half-width.  They are simulated
    at every load (what they reach is reported either way)."""
    from ..solvers import solve

    sizes, B = problem.batch_sizes, problem.bmax
    full = not server_padding(sizes)
    rules = []
    c = B
    while c >= problem.bmin:  # serve what is waiting at once, in batches of at most c (Triton with no delay)
        if _carries(problem, c, max(chk.lams)):
            rules.append(triton(c, 0.0, (), () if full else tuple(b for b in sizes if b <= c)))
        c //= 2
    if problem.instances == 1 and problem.contention is None:  # the SMDP table of least mean latency
        try:
            sol = solve(problem.replace(lam=solve_lam, w2=0.0))
            rules.append(table_timer(np.asarray(sol.policy)[: sol.s_max + 1], sizes, math.inf,
                                     spec="smdp:w2=0+timer:inf"))
        except InputError:
            pass
    for rule in rules:
        chk.run("reach", rule, {}, full=True)
    for i in range(len(chk.lams)):
        for m, _ in chk.slo.bounds:
            got = chk.reach[i].get(m)
            if got is not None and got[0] + got[1] > (1.0 + REACH_MARGIN) * chk.slo.limit(m):
                return True
    return False


def _reach(chk: _Checker) -> dict | None:
    """Where the SLO is hardest to reach: the load and metric whose least value plus half-width, over every
    setting simulated on the whole stream, is largest against its limit; None when nothing was simulated."""
    worst = None
    for i, lam in enumerate(chk.lams):
        for m, (v, h, spec) in chk.reach[i].items():
            r = (v + h) / chk.slo.limit(m)
            if worst is None or r > worst[0]:
                worst = (r, {"lam": lam, "metric": m, "value_ms": v, "ci_ms": h, "setting": spec})
    return None if worst is None else worst[1]


def served_floor_ms(problem: BatchingProblem, metric: str, lam: float, served) -> float:
    """The least ``metric`` ("mean" or "p<q>") any setting reaches at λ (req/ms) on the calibrated server, ms
    (:func:`~smdp_batch.model.served.floor_ms` with the outside delay measured at the load)."""
    return floor_ms(problem, metric, served.outside_at(lam))


def _check_served_reachable(problem: BatchingProblem, slo: SLO, lams: list[float], served) -> None:
    """Refuse, before any search, a bound below what the server alone adds to the fastest response
    (:func:`served_floor_ms`), naming the loads of the range where it can be met."""
    floors = {(m, lam): served_floor_ms(problem, m, lam, served) for m, _ in slo.bounds for lam in lams}
    ok = [lam for lam in lams if all(slo.limit(m) > floors[m, lam] for m, _ in slo.bounds)]
    for m, _ in slo.bounds:
        for lam in lams:
            floor = floors[m, lam]
            if slo.limit(m) <= floor:
                name = "W̄" if m == "mean" else m
                where = (f"; at {_loads_text(ok)} of the range it can" if ok else "")
                raise InputError(
                    f"no setting can meet {m} ≤ {slo.limit(m):g} ms at {lam * 1e3:.5g} req/s on this server: a request "
                    f"served at once, alone, takes l({problem.bmin}) = {float(problem.latency_ms()[0]):.4g} ms as "
                    f"served plus the outside delay the calibration measured there, {name} {floor:.4g} ms in all; use "
                    f"a bound above that{where}")


def _loads_text(lams: list[float]) -> str:
    per_s = [f"{x * 1e3:.5g}" for x in lams]
    return f"{per_s[0]} req/s" if len(per_s) == 1 else f"{', '.join(per_s[:-1])} and {per_s[-1]} req/s"


def _smdp_family(problem: BatchingProblem, chk: _Checker, cap: float, solve_lam: float) -> Setting | None:
    """SMDP tables at ``solve_lam`` (:mod:`~smdp_batch.analysis.table_candidates`: the w2 front; on c instances
    also the c-server front), each with its best timer (every table is tried: the power over the front need
    not be unimodal once simulated percentiles and their intervals decide).  A pure table that meets the SLO
    needs no timer; the others get the timer search, with each forced-batch form the runtime offers (largest
    allowed size ≤ n; with allowed sizes other than 1..Bmax also min(n, Bmax) padded up).  Then the one-server
    tables with the largest batch capped at Bmax/2, Bmax/4, … while that lowers the power, or until a capped
    table meets the SLO where none did: with heavy-tailed batch times one long batch of Bmax after a backlog costs
    more tail latency than it saves power (a p99 out of reach with Bmax may be met with Bmax/4), and a mean-cost
    table never caps itself."""
    from .table_candidates import instances_tables, one_server_tables

    multi = len(chk.lams) > 1
    sizes = problem.batch_sizes

    def capped(c: int) -> tuple[int, ...] | None:  # the sizes up to c, if batches of c carry the top load
        return tuple(b for b in sizes if b <= c) if c >= max(problem.bmin, 2) and _carries(problem, c, max(chk.lams)) \
            else None

    # each capped front is solved on a thread of its own while the tables before it are simulated, and on more than
    # one worker the first capped front (always searched) is searched on another beside the full one: a front and a
    # search are each a function of their arguments, so solving a front early, or in vain when the loop stops,
    # changes no answer
    ahead = ThreadPoolExecutor(1, thread_name_prefix="slo-front")
    beside = ThreadPoolExecutor(1, thread_name_prefix="slo-capped")
    fronts: dict[int, Future] = {}

    def front(c: int, sub: tuple[int, ...]) -> Future:  # the tables of the front capped at c, solved ahead
        if c not in fronts:
            fronts[c] = ahead.submit(one_server_tables, problem, solve_lam, sub, multi)
        return fronts[c]

    def ahead_of(c: int) -> None:  # the next capped front, solved while this one is searched
        sub_next = capped(c // 2)
        if sub_next:
            front(c // 2, sub_next)

    workers = int(chk.workers or default_workers())
    try:
        c = problem.bmax // 2
        sub = capped(c)
        first = None
        if sub:
            front(c, sub)
        if sub and workers > 1:

            def search_first(c: int = c, sub: tuple[int, ...] = sub) -> Setting | None:
                tables = front(c, sub).result()
                ahead_of(c)
                return _smdp_tables(chk, cap, tables, sub)

            first = beside.submit(search_first)
        cands = one_server_tables(problem, solve_lam, sizes, multi, workers=workers)
        if problem.instances > 1:
            cands += instances_tables(problem, solve_lam, multi)[0]
        best = _smdp_tables(chk, cap, cands, sizes)
        while sub is not None:  # while that lowers the power, or until a capped table meets it
            if first is not None:
                found, first = first.result(), None
            else:
                ahead_of(c)
                found = _smdp_tables(chk, cap, front(c, sub).result(), sub)
            if best is not None and (found is None or not found.power_w < best.power_w):
                break
            best, c = _better(best, found), c // 2
            sub = capped(c)
    finally:  # a front solved ahead in vain is not waited for; the search beside is always taken (or failed)
        ahead.shutdown(wait=False, cancel_futures=True)
        beside.shutdown(wait=True)
    return best


def _smdp_tables(chk: _Checker, cap: float, cands, sizes) -> Setting | None:
    """The least-power of ``cands`` (Candidate tables over ``sizes``), each pure or with its best timer.

    The candidates are searched in waves of :data:`WAVE` on threads; each timer search starts from the τ the
    waves before found (the last candidate's with a timer), so the answer does not depend on the threads."""
    forms = ("largest", "pad") if server_padding(sizes) else ("largest",)  # padded profiles also get the pad form
    guess: dict[str, float | None] = dict.fromkeys(forms)

    def search(cand, start: dict) -> list[Setting]:
        pol, name, knobs = cand.policy, cand.name, cand.knobs
        policy = pol.tolist()
        pure = chk.run("smdp", table_timer(pol, sizes, math.inf, spec=f"{name}+timer:inf"), {**knobs, "tau_ms": math.inf},
                       policy=policy)
        if pure.meets:
            return [pure]
        out = []
        for form in forms:
            suffix = ":pad" if form == "pad" else ""

            def check(t: float, form=form, suffix=suffix) -> Setting:  # searched within this iteration (B023)
                t = float(f"{t:.6g}")  # as the spelling writes it
                return chk.run("smdp", table_timer(pol, sizes, t, spec=f"{name}+timer:{t:g}{suffix}", forced=form),
                               {**knobs, "tau_ms": t, "forced": form}, policy=policy)

            s = _largest_delay(check, cap, start[form], scale=chk.scale)
            if s is not None:
                out.append(s)
        return out

    pick: Setting | None = None
    for w0 in range(0, len(cands), WAVE):
        start = dict(guess)
        for found in _in_parallel([lambda c=c, st=start: search(c, st) for c in cands[w0 : w0 + WAVE]], chk.workers):
            for s in found:
                pick = _better(pick, s)
                if math.isfinite(s.knobs["tau_ms"]):
                    guess[s.knobs["forced"]] = s.knobs["tau_ms"] or None
    return pick
