"""Fitting the served-delay model to calibration runs on a real server (:mod:`smdp_batch.model.served`).

A calibration run sends a Poisson stream at real speed to the deployed server with the setting to be
checked, and records for each request when the client sent it and when the answer came back; where the
server reports it (our Triton and Ray Serve stand-ins do, a plain HTTP endpoint may), also the batch that
served it, its position in that batch, and the batch's compute start and end.  :func:`fit_served` turns
the runs at several loads into a :class:`~smdp_batch.model.served.ServedDelay`:

1. **Per-batch time a + c·b.**  For consecutive batches k, k + 1 where batch k + 1 was due when batch k's
   compute ended (its first request had reached the batcher, or been sent where the server does not say when
   it reached it, more than the rule's delay + 1 ms before, or it was full),
   the gap (start of k + 1 − end of k) is the instance's own time between batches: handing k's responses
   back, freeing the instance, forming and dispatching k + 1.  Least squares of the gap on k's size; a
   negative slope or intercept is taken as 0 (a + c·b ≥ 0).
2. **l(b) as served**: the mean compute time of each executed size that ran at least 5 batches.
3. **The outside delay.**  A request's time splits exactly into the leg to the batcher, the batcher's part
   (to the end of its batch's compute) and the return leg after it.  The return leg, less the position term,
   is measured request by request; so is the leg to the batcher where the server says when each request
   reached it (Ray Serve's replica does).  Where it does not (Triton's Python backend), the batcher's part is
   taken from the send, and the leg's mean is the mean by which that part exceeds the simulator's for the
   same send times, rule, l(b) as served and a + c·b (≥ 0).  Without batch times (an endpoint that reports none) the outside
   delay is the residual measured − simulated request by request, which the replay's batch mismatch widens:
   the plan then errs on the safe side.
4. **The return per position**, r: least squares of the return leg on the request's measured position in its
   batch (0 = answered first), where positions were reported.
5. **The tail the parts miss.**  The plan of each calibration run itself (its send times, its rule, the
   outside delay drawn independently) is compared with the run's measured p99; where the plan falls short
   (the parts are not independent: a congested host slows the batcher and the way back together), that
   load's outside sample moves up by the shortfall (``tail_gap_ms``), so that the plan holds at the
   calibrated loads by construction.
6. **What the path carried**, per load: every request answered, no errors, no growing queue (response
   times of the last third ≤ 2× the first third + 1 ms).  ``carried_per_s`` is the top of the run of
   calibrated loads, from the lowest, that carried.  A load where the measured batcher part's p99 is above
   1.15× the simulated one + 1 ms did not carry either: the host did not keep up with the rule.  The client's lag behind its send schedule is reported
   (p99): a client that does not keep up sends a thinner stream than asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..model.served import ServedDelay, as_served, batch_positions

__all__ = ["CalibrationRun", "fit_served"]


@dataclass
class CalibrationRun:
    """One calibration run at one load, times in ms on one clock (the client's send of its first request = 0).

    ``latency_ms[i]``: the client's end-to-end time (NaN: unanswered).  Where the server reports batches:
    ``batch_of[i]`` (−1: unknown), ``position[i]`` (its place in the batch, −1: unknown), ``batches`` (id →
    (requests, executed size)) and ``batch_times`` (id → (compute start, compute end)).  ``lag_ms``: how late
    each request was sent against its schedule.  ``entered_ms``: when each request reached the batcher, where
    the server reports it (Ray Serve's replica does; Triton's Python backend does not).
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


def _per_batch(runs, delay_ms: float, maxb: int) -> tuple[float, float, int]:
    xs, ys = [], []
    for run in runs:
        if run.batch_of is None or not run.batch_times:
            continue
        first: dict[int, float] = {}
        reached = run.sent_ms if run.entered_ms is None else run.entered_ms
        for i, k in enumerate(run.batch_of):
            if k >= 0 and math.isfinite(reached[i]):
                first[int(k)] = min(first.get(int(k), math.inf), float(reached[i]))
        ks = sorted(run.batch_times, key=lambda k: run.batch_times[k][0])
        for k0, k1 in zip(ks, ks[1:]):
            e0, s1 = run.batch_times[k0][1], run.batch_times[k1][0]
            due = run.batches[k1][0] >= maxb or first.get(k1, math.inf) + delay_ms + 1.0 < e0
            if due and s1 >= e0:
                xs.append(float(run.batches[k0][0]))
                ys.append(s1 - e0)
    if len(xs) < 5:
        return 0.0, 0.0, len(xs)
    x, y = np.asarray(xs), np.asarray(ys)
    if np.ptp(x) > 0:
        c, a = np.polyfit(x, y, 1)
    else:
        c, a = 0.0, float(np.mean(y))
    if c < 0:
        c, a = 0.0, float(np.mean(y))
    if a < 0:
        a, c = 0.0, float(max((x @ y) / (x @ x), 0.0))
    return float(a), float(c), len(xs)


def _growing(lat: np.ndarray) -> bool:
    ok = lat[np.isfinite(lat)]
    if ok.size < 30:
        return False
    t = ok.size // 3
    return float(ok[-t:].mean()) > 2.0 * float(ok[:t].mean()) + 1.0


def fit_served(problem, rule, runs: list[CalibrationRun], *, slo_ms: float | None = None, warmup: float = 0.05,
               seed: int = 0, idle_power_w: float | None = None, source: dict | None = None) -> ServedDelay:
    """The served-delay model of ``runs`` (module doc), for plans with ``problem``'s l(b) and ζ(b).

    ``rule``: the server rule (or table) the runs were served with.  ``slo_ms``: a load whose outside p99
    alone reaches it is not carried.  ``warmup``: the share of each run's first (and last) requests left out.
    """
    from ..baselines.servers import ServerRule, table_rule

    if not runs:
        raise InputError("calibration: no runs to fit")
    runs = sorted(runs, key=lambda r: r.lam_per_s)
    rule = rule if isinstance(rule, ServerRule) else table_rule(rule, problem.batch_sizes)
    delay = float(rule.delay) if math.isfinite(getattr(rule, "delay", math.inf)) else 0.0
    a, c, pairs = _per_batch(runs, delay, int(rule.maxb))
    per_batch = lambda s: a + c * s  # noqa: E731
    served_lat: dict[int, list[float]] = {}
    for run in runs:
        for k, (s0, s1) in run.batch_times.items():
            served_lat.setdefault(int(run.batches[k][1]), []).append(s1 - s0)
    lat_means = {b: float(np.mean(v)) for b, v in sorted(served_lat.items()) if len(v) >= 5}
    served_problem = as_served(problem, lat_means)
    # per load: the return legs, their positions, the batcher part measured and simulated (with l(b) as served)
    parts = [_split(served_problem, rule, run, per_batch, warmup, seed) for run in runs]
    ret_all = np.concatenate([x[0] for x in parts])  # the return legs (position regression on these alone)
    pos_all = np.concatenate([x[1] for x in parts])
    known = pos_all >= 0
    r = 0.0
    if known.sum() >= 30 and np.ptp(pos_all[known]) > 0:
        r = max(float(np.polyfit(pos_all[known], ret_all[known], 1)[0]), 0.0)
    outside, stats, carried, still = [], [], None, True
    for run, (ret, pos, meas, sim, inbound, sim_pos, lat_used) in zip(runs, parts):
        # reaching the batcher: measured request by request where the server says when, else its mean (≥ 0)
        shift = max(float(meas.mean() - sim.mean()), 0.0) if inbound is None else float(np.mean(inbound))
        o = ret - r * np.where(pos >= 0, pos, 0.0) + (shift if inbound is None else inbound)
        if inbound is not None:
            shift = 0.0  # the batcher parts are from the batcher's own arrival times
        # the plan of this very run (same stream, same rule, an independent outside draw) against what it measured:
        # where the parts are not independent (a congested host slows the batcher and the way back together) the
        # convolution's p99 falls short, and the whole sample moves up by the shortfall
        rng = np.random.default_rng(np.random.SeedSequence([seed, int(run.lam_per_s * 1000)]))
        planned = (sim + r * sim_pos)[None, :] + o[rng.integers(0, o.size, (20, o.size))]
        gap = max(float(np.percentile(lat_used, 99)) - float(np.percentile(planned, 99)), 0.0)
        o = o + gap
        outside.append(o)
        answered = int(np.isfinite(run.latency_ms).sum())
        lat = run.latency_ms[np.isfinite(run.latency_ms)]
        lag99 = float(np.percentile(run.lag_ms, 99)) if run.lag_ms is not None and run.lag_ms.size else math.nan
        m99, s99 = float(np.percentile(meas, 99)), float(np.percentile(sim, 99)) + shift
        why = None
        if answered < run.latency_ms.size or run.errors:
            why = f"{run.latency_ms.size - answered} of {run.latency_ms.size} requests were not answered"
        elif _growing(run.latency_ms[np.argsort(run.sent_ms)]):
            why = f"its queue grew: response times rose to a p99 of {np.percentile(lat, 99):.4g} ms"
        elif m99 > 1.15 * s99 + 1.0:
            why = (f"the server's batcher took p99 {m99:.4g} ms where its rule on the model takes {s99:.4g} ms "
                   f"(end-to-end p99 {np.percentile(lat, 99):.4g} ms): the host does not keep up"
                   + (f"; the client's sends lagged p99 {lag99:.3g} ms" if lag99 > 5.0 else ""))
        elif slo_ms is not None and np.percentile(o, 99) >= slo_ms:
            why = f"the server's own path alone took p99 {np.percentile(o, 99):.4g} ms ≥ the SLO {slo_ms:g} ms"
        still = still and why is None
        if still:
            carried = run.lam_per_s
        stats.append({"load_per_s": run.lam_per_s, "requests": int(run.latency_ms.size), "answered": answered,
                      "errors": int(run.errors), "p99_ms": float(np.percentile(lat, 99)) if lat.size else math.nan,
                      "batcher_p99_ms": m99, "batcher_model_p99_ms": s99, "to_batcher_ms": shift,
                      "tail_gap_ms": gap,
                      "model_p99_ms": float(np.percentile([e - s for s, e in run.batch_times.values()], 99))
                      if run.batch_times else math.nan,
                      "outside_p50_ms": float(np.percentile(o, 50)), "outside_p99_ms": float(np.percentile(o, 99)),
                      "client_lag_p99_ms": lag99, "client_kept_up": not lag99 > 5.0, "carried": why is None,
                      "why": why or "", "wall_s": float(run.wall_s)})
    src = dict(source or {})
    src.update({"per_batch_pairs": pairs, "setting": rule.spec})
    return ServedDelay(a, c, r, tuple(x.lam_per_s for x in runs), tuple(outside),
                       0.0 if carried is None else float(carried), lat_means, idle_power_w, tuple(stats), src)


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
