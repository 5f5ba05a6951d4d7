"""Fitting the served-delay model to calibration runs on a real server (:mod:`smdp_batch.model.served`).

A calibration run sends a Poisson stream at real speed to the deployed server with the setting to be
checked, and records for each request when the client sent it and when the answer came back; where the
server reports it (our Triton and Ray Serve stand-ins do, a plain HTTP endpoint may), also the batch that
served it, its position in that batch, and the batch's compute start and end.  :func:`fit_served` turns
the runs at several loads into a :class:`~smdp_batch.model.served.ServedDelay`:

1. **Per-batch time a + c·b.**  In runs that carried their load (every request answered, no growing queue),
   for consecutive batches k, k + 1 where batch k + 1 was due when batch k's
   compute ended (its first request had reached the batcher, or been sent where the server does not say when
   it reached it, more than the rule's delay + 1 ms before, or it was full with its last request in 1 ms before),
   the gap (start of k + 1 − end of k) is the instance's own time between batches: handing k's responses
   back, freeing the instance, forming and dispatching k + 1.  Least squares of the gap on k's size; a
   negative slope or intercept is taken as 0 (a + c·b ≥ 0); pairs at one size alone give a flat a, measured
   there.  A setting that waits long between light loads rarely leaves a batch waiting, so a calibration also
   sends bursts of requests at once (``probe`` runs: :func:`~smdp_batch.integrations.calibrate.calibration_runs`),
   whose full batches follow each other back to back.
2. **l(b) as served**: the mean compute time of each executed size that ran at least 5 batches.
3. **The outside delay.**  A request's time splits exactly into the leg to the batcher, the batcher's part
   (to the end of its batch's compute) and the return leg after it.  The return leg, less the position term,
   is measured request by request; so is the leg to the batcher where the server says when each request
   reached it (Ray Serve's replica does).  Where it does not (Triton's Python backend), the batcher's part is
   taken from the send.  Either way the mean by which that part exceeds the simulator's for the same times,
   rule, l(b) as served and a + c·b (≥ 0) is added: the leg to the batcher and the dispatch on Triton, the
   batcher's own hops on Ray Serve (its replica's queue and event loop: a mean of 0.4–0.7 ms on 2 cores, with
   a p99 of 6 ms).  Without batch times (an endpoint that reports none) the outside delay is the residual
   measured − simulated request by request, which the replay's batch mismatch widens: the plan then errs on
   the safe side.
4. **The return per position**, r: least squares of the return leg on the request's measured position in its
   batch (0 = answered first), where positions were reported.
5. **The tail the parts miss.**  The plan of each calibration run itself (its send times, its rule, the
   outside delay drawn independently) is compared with the run's measured p99; where the plan falls short
   (the parts are not independent: a congested host slows the batcher and the way back together), that
   load's outside sample moves up by the shortfall (``tail_gap_ms``; with several runs at a load, their
   samples pooled and their mean shortfall), so that the plan holds at the calibrated loads.
6. **How far a new run may land** (``new_run_share``): with several runs at a load (repetitions, or runs of
   several settings, each replayed with its own), log(each run's measured p99 ÷ its plan with the load's
   pooled sample); their deviations about their load's mean, pooled over the loads where every run kept up (7:
   answered, no growing queue, the batcher keeping its rule), give
   σ between runs (1.4826 × the median absolute deviation, so that one run a stall of the host caught does not
   set it), and exp(t·σ·√(1 + 1/R)) − 1 the 95 % prediction half-width for one new run (t: Student's 97.5 %
   quantile on the Σ(R − 1) degrees of freedom σ rests on, 3.18 for two runs at three loads, since σ from a
   few runs is itself uncertain), as a share of its p99 (a host slower for a
   while stretches responses in proportion, so the share carries to settings of other p99), never less than
   the calmest run's own p99 interval (a moving-block bootstrap over its sends, :func:`p99_halfwidth`), which
   alone is used with one run per load.  Every served percentile's interval adds that share of itself.
7. **What the path carried**, per load: every request answered, no errors, no growing queue (response
   times of the last third ≤ 2× the first third + 1 ms).  ``carried_per_s`` is the top of the run of
   calibrated loads, from the lowest, that carried.  A load where the measured batcher part's mean is above
   1.15× the simulated one (plus, where the leg to the batcher is inside it, the median excess) + 1 ms did not
   carry either: the host did not keep up with the rule.  A tail of that excess alone (a late timer, a stalled
   event loop) is not a refusal: the tail gap plans for it.  With several runs at a load, every one must have
   carried it.  The client's lag behind its send schedule is reported (p99): a client that does not keep up
   sends a thinner stream than asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import t as student_t

from ..errors import InputError
from ..model.served import PER_BATCH_MIN_PAIRS, ServedDelay, as_served, batch_positions, floor_ms

__all__ = ["CalibrationRun", "fit_served", "p99_halfwidth"]


@dataclass
class CalibrationRun:
    """One calibration run at one load, times in ms on one clock (the client's send of its first request = 0).

    ``latency_ms[i]``: the client's end-to-end time (NaN: unanswered).  Where the server reports batches:
    ``batch_of[i]`` (−1: unknown), ``position[i]`` (its place in the batch, −1: unknown), ``batches`` (id →
    (requests, executed size)) and ``batch_times`` (id → (compute start, compute end)).  ``lag_ms``: how late
    each request was sent against its schedule.  ``entered_ms``: when each request reached the batcher, where
    the server reports it (Ray Serve's replica does; Triton's Python backend does not).  ``rule``: the setting
    the run was served with, where runs of several settings are fitted together (a calibration, then the run of
    the setting planned from it).  ``probe``: bursts of requests sent at once, not a load: the fit reads only its
    back-to-back batches (a + c·b), and only its unanswered requests make it void (its queue grows by design).
    ``deployment``: which deployment of the server ran it (a fresh one per repeat of a calibration:
    :func:`~smdp_batch.integrations.calibrate.calibration_runs`); the fit counts them.
    """

    lam_per_s: float
    sent_ms: np.ndarray
    latency_ms: np.ndarray
    batch_of: np.ndarray | None = None
    position: np.ndarray | None = None
    batches: dict = field(default_factory=dict)
    batch_times: dict = field(default_factory=dict)
    lag_ms: np.ndarray | None = None
    errors: int = 0
    wall_s: float = 0.0
    entered_ms: np.ndarray | None = None  # when each request reached the server's batcher, where it says
    rule: object = None  # the setting this run was served with (None: the one given to fit_served)
    deployment: str = ""  # which deployment of the server ran it (runs of one deployment share its path's state)
    probe: bool = False  # bursts sent at once to keep batches back to back: read for a + c·b only (module doc, 1)


def _delay_ms(rule) -> float:
    return float(rule.delay) if math.isfinite(getattr(rule, "delay", math.inf)) else 0.0


def _per_batch(runs, rules) -> tuple[float, float, int, list[int]]:
    """(a, c, the number of back-to-back pairs, the sizes they were measured at) (module doc, 1)."""
    xs, ys = [], []
    for run, rule in zip(runs, rules):
        if run.batch_of is None or not run.batch_times or _fell_behind(run):
            continue  # a run the server did not keep up with: its gaps are its stalls, not the instance's own time
        delay_ms, maxb = _delay_ms(rule), int(rule.maxb)
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        reached = run.sent_ms if run.entered_ms is None else run.entered_ms
        for i, k in enumerate(run.batch_of):
            if k >= 0 and math.isfinite(reached[i]):
                first[int(k)] = min(first.get(int(k), math.inf), float(reached[i]))
                last[int(k)] = max(last.get(int(k), -math.inf), float(reached[i]))
        ks = sorted(run.batch_times, key=lambda k: run.batch_times[k][0])
        for k0, k1 in zip(ks, ks[1:]):
            e0, s1 = run.batch_times[k0][1], run.batch_times[k1][0]
            # due when k0 ended: full with its last request in 1 ms before (sent, where the server does not say), or
            # its first request's delay run out; a full batch whose requests came after k0 ended waited for them
            due = (run.batches[k1][0] >= maxb and last.get(k1, math.inf) + 1.0 < e0) \
                or first.get(k1, math.inf) + delay_ms + 1.0 < e0
            if due and s1 >= e0:
                xs.append(float(run.batches[k0][0]))
                ys.append(s1 - e0)
    at = sorted({int(x) for x in xs})
    if len(xs) < PER_BATCH_MIN_PAIRS:
        return 0.0, 0.0, len(xs), at
    x, y = np.asarray(xs), np.asarray(ys)
    if np.ptp(x) > 0:
        c, a = np.polyfit(x, y, 1)
    else:
        c, a = 0.0, float(np.mean(y))
    if c < 0:
        c, a = 0.0, float(np.mean(y))
    if a < 0:
        a, c = 0.0, float(max((x @ y) / (x @ x), 0.0))
    return float(a), float(c), len(xs), at


def _fell_behind(run: CalibrationRun) -> str:
    """Why a run plainly did not carry its load, or "": requests unanswered or failed, or its queue grew."""
    lat = run.latency_ms
    answered = int(np.isfinite(lat).sum())
    if answered < lat.size or run.errors:
        return f"{lat.size - answered} of {lat.size} requests were not answered"
    if not run.probe and _growing(lat[np.argsort(run.sent_ms, kind="stable")]):
        return f"its queue grew: response times rose to a p99 of {np.percentile(lat, 99):.4g} ms"
    return ""


def _growing(lat: np.ndarray) -> bool:
    ok = lat[np.isfinite(lat)]
    if ok.size < 30:
        return False
    t = ok.size // 3
    return float(ok[-t:].mean()) > 2.0 * float(ok[:t].mean()) + 1.0


def p99_halfwidth(lat_in_send_order: np.ndarray, seed: int = 0, resamples: int = 200) -> float:
    """95 % half-width (ms) of a run's measured p99 from its own requests: a moving-block bootstrap over the send
    order (blocks of √n requests, ``resamples`` seeded resamples), so that a stall of the host, which delays a run of
    consecutive requests together, is resampled whole.  It says how far another run of the same length could
    land from this one on the same host state; it cannot see a host that is slower for a whole run."""
    x = np.asarray(lat_in_send_order, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    if n < 20:
        return math.nan
    k = max(int(math.sqrt(n)), 1)
    starts = np.random.default_rng(seed).integers(0, n - k + 1, (resamples, -(-n // k)))
    idx = (starts[:, :, None] + np.arange(k)[None, None, :]).reshape(resamples, -1)[:, :n]
    return 1.96 * float(np.std(np.percentile(x[idx], 99, axis=1), ddof=1))


def fit_served(problem, rule, runs: list[CalibrationRun], *, slo_ms: float | None = None, warmup: float = 0.05,
               seed: int = 0, idle_power_w: float | None = None, source: dict | None = None) -> ServedDelay:
    """The served-delay model of ``runs`` (module doc), for plans with ``problem``'s l(b) and ζ(b).

    ``rule``: the server rule (or table) the runs were served with, where a run does not name its own.  Several
    runs at one load (repetitions, or runs of several settings) are pooled there: their outside samples, their
    shortfalls (the mean moves the sample up) and, from the runs' spread about their plans, how far the p99 of
    a new run may land from its plan on this host.  ``slo_ms``: a load where the fastest response alone (l(b_min)
    as served plus the outside delay: :func:`~smdp_batch.model.served.floor_ms`) reaches it at p99 is not carried.
    ``warmup``: the share of each run's first (and last) requests left out.  ``probe`` runs feed a + c·b only.
    """
    from ..baselines.servers import ServerRule, table_rule

    probes = [r for r in runs if r.probe]
    runs = sorted((r for r in runs if not r.probe), key=lambda r: r.lam_per_s)
    if not runs:
        raise InputError("calibration: no runs at a load to fit")
    as_rule = lambda x: x if isinstance(x, ServerRule) else table_rule(x, problem.batch_sizes)  # noqa: E731
    rule = as_rule(rule)
    rule_of = lambda run: rule if run.rule is None else as_rule(run.rule)  # noqa: E731
    rules = [rule_of(run) for run in runs]
    a, c, pairs, at = _per_batch([*runs, *probes], [*rules, *map(rule_of, probes)])
    per_batch = lambda s: a + c * s  # noqa: E731
    served_lat: dict[int, list[float]] = {}
    for run in runs:
        for k, (s0, s1) in run.batch_times.items():
            served_lat.setdefault(int(run.batches[k][1]), []).append(s1 - s0)
    lat_means = {b: float(np.mean(v)) for b, v in sorted(served_lat.items()) if len(v) >= 5}
    served_problem = as_served(problem, lat_means)
    # per run: the return legs, their positions, the batcher part measured and simulated (with l(b) as served)
    parts = [_split(served_problem, ru, run, per_batch, warmup, seed) for run, ru in zip(runs, rules)]
    ret_all = np.concatenate([x[0] for x in parts])  # the return legs (position regression on these alone)
    pos_all = np.concatenate([x[1] for x in parts])
    known = pos_all >= 0
    r = 0.0
    if known.sum() >= 30 and np.ptp(pos_all[known]) > 0:
        r = max(float(np.polyfit(pos_all[known], ret_all[known], 1)[0]), 0.0)
    each = [_one_run(run, part, r, seed) for run, part in zip(runs, parts)]
    groups: dict[float, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(round(run.lam_per_s, 6), []).append(i)
    outside, gaps, devs = [], [], []
    for g in groups.values():
        es = [each[i] for i in g]
        gaps.append(max(float(np.mean([e["shortfall"] for e in es])), 0.0))
        o = np.concatenate([e["outside"] for e in es]) + gaps[-1]
        outside.append(o)
        # each run against its plan with the load's pooled sample, as a log ratio: how far apart runs land on this
        # host (a stall in one run, other jobs), beyond what one run's own requests show.  A host that is slower
        # for a while stretches a response in proportion, so the spread carries to settings of other p99
        d = [math.log(each[i]["p99_ms_window"] / _plan_p99(parts[i], r, o, seed, runs[i].lam_per_s)) for i in g]
        # about the load's mean, whose deviations have variance σ²·(R − 1)/R
        devs.append([(x - float(np.mean(d))) / math.sqrt((len(g) - 1) / len(g)) for x in d] if len(g) > 1 else [])
    whys = []
    for g, o in zip(groups.values(), outside):
        es = [each[i] for i in g]
        why = next((e["why"] for e in es if e["why"]), None)
        if why and len(es) > 1:
            why = f"{why} (in {sum(bool(e['why']) for e in es)} of its {len(es)} runs)"
        elif why is None and slo_ms is not None and (floor := floor_ms(served_problem, "p99", o)) >= slo_ms:
            # what compare and export refuse: no setting can meet the SLO at this load (the fastest response alone)
            why = (f"the server's own path and the fastest batch alone (l({served_problem.bmin}) = "
                   f"{float(served_problem.latency_ms()[0]):.4g} ms as served) take p99 {floor:.4g} ms ≥ the SLO "
                   f"{slo_ms:g} ms")
        whys.append(why)
    # σ between runs (of the log p99), robust to one run that a stall of the host caught (its load is then one of
    # several): 1.4826 × the median absolute deviation, pooled over the loads where every run kept up (a run whose
    # queue grew, at its own pace in each, or whose batcher fell behind its rule says nothing of a plan's room; a
    # load refused only because the fastest response alone reaches the SLO still shows how runs differ)
    use = [d for d, g in zip(devs, groups.values()) if d and not any(each[i]["why"] for i in g)] or \
        [d for d in devs if d]
    dev = [x for d in use for x in d]
    between = 1.4826 * float(np.median(np.abs(dev))) if dev else math.nan
    # a new run's 95 % prediction interval, with σ estimated on df = Σ(R − 1) degrees of freedom: Student's t
    # quantile, not the normal's 1.96 (two runs at each of three loads give df = 3, t = 3.18)
    t95 = float(student_t.ppf(0.975, sum(len(d) - 1 for d in use))) if dev else math.nan
    stats, carried, still = [], None, True
    for g, o, gap, why in zip(groups.values(), outside, gaps, whys):
        rs, es = [runs[i] for i in g], [each[i] for i in g]
        still = still and why is None
        if still:
            carried = rs[0].lam_per_s
        # a new run's p99 against its plan (95 %, a share of it): the spread between runs where runs were repeated,
        # never less than the calmest run's own interval (its requests' moving-block bootstrap), alone without
        spread = min((e["p99_halfwidth_ms"] / e["p99_ms_window"] for e in es if math.isfinite(e["p99_halfwidth_ms"])),
                     default=math.nan)
        if dev:
            apart = math.expm1(t95 * between * math.sqrt(1.0 + 1.0 / len(es)))
            spread = apart if math.isnan(spread) else max(apart, spread)
        spread = min(spread, 10.0)  # 1000 %: beyond it a plan has no room anyway (the file's bound)
        stats.append(_load_stats(rs, es, parts, g, gap, o, why, spread))
    src = dict(source or {})
    src.update({"per_batch_pairs": pairs, "per_batch_sizes": at, "setting": rule.spec})
    if dev:
        src["runs_per_load"] = max(len(g) for g in groups.values())
    tags = {r.deployment for r in runs if r.deployment}
    if tags:
        src["deployments"] = len(tags)
    return ServedDelay(a, c, r, tuple(runs[g[0]].lam_per_s for g in groups.values()), tuple(outside), 0.0 if carried is None else float(carried), lat_means, idle_power_w,
                       tuple(stats), src)


def _one_run(run: CalibrationRun, part, r: float, seed: int) -> dict:
    """One run's outside sample (before the load's shortfall), its shortfall (its measured p99 − its own plan's,
    unclipped), its p99's own half-width, and why it did not carry (or "")."""
    ret, pos, meas, sim, inbound, sim_pos, lat_used = part
    # what the batcher part takes beyond the rule on the model, on average (≥ 0): without the server's arrival
    # times, reaching the batcher and the dispatch; with them (the leg to it measured request by request) the
    # batcher's own hops, e.g. Ray's replica queue and event loop
    shift = max(float(meas.mean() - sim.mean()), 0.0)
    o = ret - r * np.where(pos >= 0, pos, 0.0) + shift + (0.0 if inbound is None else inbound)
    # the plan of this very run (same stream, same rule, an independent outside draw) against what it measured:
    # where the parts are not independent (a congested host slows the batcher and the way back together) the
    # convolution's p99 falls short, and the load's sample moves up by the shortfall
    window99 = float(np.percentile(lat_used, 99))
    shortfall = window99 - _plan_p99(part, r, o, seed, run.lam_per_s)
    answered = int(np.isfinite(run.latency_ms).sum())
    lat = run.latency_ms[np.isfinite(run.latency_ms)]
    in_order = run.latency_ms[np.argsort(run.sent_ms, kind="stable")]  # in send order
    lag99 = float(np.percentile(run.lag_ms, 99)) if run.lag_ms is not None and run.lag_ms.size else math.nan
    m99, s99 = float(np.percentile(meas, 99)), float(np.percentile(sim, 99)) + shift
    # the host keeps up with the rule when the batcher part is the rule's on average (less the leg to the
    # batcher where it is inside: its constant part, the median excess); a rare late timer or stalled event
    # loop (p99 of the excess 6 ms against a mean of 0.4 on Ray Serve, 2 cores) is planned for by the tail gap
    leg = max(float(np.median(meas - sim)), 0.0) if inbound is None else 0.0
    slow = float(meas.mean()) > 1.15 * (float(sim.mean()) + leg) + 1.0
    why = _fell_behind(run)
    if not why and slow:
        why = (f"the server's batcher took {meas.mean():.4g} ms on average (p99 {m99:.4g} ms) where its rule on "
               f"the model takes {sim.mean() + shift:.4g} ms (p99 {s99:.4g} ms) "
               f"(end-to-end p99 {np.percentile(lat, 99):.4g} ms): the host does not keep up"
               + (f"; the client's sends lagged p99 {lag99:.3g} ms" if lag99 > 5.0 else ""))
    return {"outside": o, "shortfall": shortfall, "p99_ms_window": window99, "shift": shift, "why": why, "lag99": lag99, "answered": answered,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else math.nan,
            "p99_halfwidth_ms": p99_halfwidth(in_order, seed)}


def _plan_p99(part, r: float, o: np.ndarray, seed: int, lam_per_s: float) -> float:
    """The p99 a run's plan gives: its simulated batcher parts, k·r for its simulated positions, and 20
    independent draws of the outside sample ``o`` for each request (seeded by the load)."""
    sim, sim_pos = part[3], part[5]
    rng = np.random.default_rng(np.random.SeedSequence([seed, int(lam_per_s * 1000)]))
    return float(np.percentile((sim + r * sim_pos)[None, :] + o[rng.integers(0, o.size, (20, sim.size))], 99))


def _load_stats(rs, es, parts, g, gap, o, why, spread) -> dict:
    """One calibrated load's figures (docs/json.md, ``stats[]``), its runs pooled."""
    meas = np.concatenate([parts[i][2] for i in g])
    sim = np.concatenate([parts[i][3] for i in g])
    lat = np.concatenate([run.latency_ms[np.isfinite(run.latency_ms)] for run in rs])
    shift = float(np.mean([e["shift"] for e in es]))
    model = [e - s for run in rs for s, e in run.batch_times.values()]
    lag99 = max(e["lag99"] for e in es)
    p99 = float(np.percentile(lat, 99)) if lat.size else math.nan
    return {"load_per_s": rs[0].lam_per_s, "runs": len(rs), "requests": int(sum(run.latency_ms.size for run in rs)),
            "answered": int(sum(e["answered"] for e in es)), "errors": int(sum(run.errors for run in rs)),
            "p99_ms": p99, "p99_runs_ms": [e["p99_ms"] for e in es],
            "p99_halfwidth_ms": max(e["p99_halfwidth_ms"] for e in es),
            "batcher_p99_ms": float(np.percentile(meas, 99)),
            "batcher_model_p99_ms": float(np.percentile(sim, 99)) + shift, "to_batcher_ms": shift,
            "tail_gap_ms": gap, "new_run_share": spread, "new_run_halfwidth_ms": spread * p99,
            "model_p99_ms": float(np.percentile(model, 99)) if model else math.nan,
            "outside_p50_ms": float(np.percentile(o, 50)), "outside_p99_ms": float(np.percentile(o, 99)),
            "client_lag_p99_ms": lag99, "client_kept_up": not lag99 > 5.0, "carried": why is None,
            "why": why or "", "wall_s": float(sum(run.wall_s for run in rs))}


def _split(problem, rule, run: CalibrationRun, per_batch, warmup: float, seed: int):
    """A run's answered requests inside the window: (return leg, position, batcher part measured, batcher part
    simulated, the leg to the batcher or None, the position in its simulated batch, the measured latency).  The batcher part runs from when the request reached the batcher
    (``entered_ms``; else its send) to the end of its batch's compute; the simulator serves the same times under
    the same rule with ``per_batch``.  Without batch times the return leg is the whole residual (measured −
    simulated, request by request) and the batcher parts are left equal."""
    from .simulate import response_times

    n = run.sent_ms.size
    sent = np.asarray(run.sent_ms, dtype=np.float64)
    at = sent if run.entered_ms is None else np.asarray(run.entered_ms, dtype=np.float64)
    ok = np.isfinite(sent) & np.isfinite(at)
    if ok.sum() < 20:
        raise InputError(f"calibration at {run.lam_per_s:g} req/s: only {int(ok.sum())} requests were sent")
    idx = np.flatnonzero(ok)
    order = idx[np.argsort(at[idx], kind="stable")]
    sim = np.full(n, np.nan)
    sim[order] = response_times(problem.replace(lam=run.lam_per_s / 1000.0), rule,
                                at[order] - at[order[0]] + 1e-6, seed, per_batch)
    window = np.zeros(n, dtype=bool)
    lo = int(warmup * order.size)
    window[order[lo:order.size - lo]] = True
    use = window & np.isfinite(run.latency_ms) & np.isfinite(sim)
    if run.batch_of is not None and run.batch_times:
        use &= run.batch_of >= 0
    if not use.any():
        raise InputError(f"calibration at {run.lam_per_s:g} req/s: no request was answered; the server is down or "
                         "the load is far beyond it")
    pos = (run.position[use] if run.position is not None else np.full(int(use.sum()), -1)).astype(np.float64)
    inbound = None if run.entered_ms is None else at[use] - sent[use]
    sim_pos = np.full(n, 0.0)
    sim_pos[order] = batch_positions(at[order] + sim[order])  # in the simulated batches
    tail = (sim_pos[use], run.latency_ms[use])
    if run.batch_of is None or not run.batch_times:
        o = run.latency_ms[use] - sim[use] - (0.0 if inbound is None else inbound)
        return (o, pos, sim[use], sim[use], inbound, *tail)
    end = np.array([run.batch_times[int(k)][1] for k in run.batch_of[use]])
    return (sent[use] + run.latency_ms[use] - end, pos, end - at[use], sim[use], inbound, *tail)
