"""The Autopilot on a simulated clock: a batching policy served by one simulated instance through a trace of phases.

:func:`simulate` runs a policy — an :class:`~smdp_batch.autopilot.Autopilot`, a
:class:`~smdp_batch.runtime.PolicyTable`, an :class:`~smdp_batch.runtime.bank.AdaptivePolicy` — the way
:class:`~smdp_batch.runtime.DynamicBatcher` runs it on one instance, with time simulated instead of slept:

* arrivals are Poisson within each :class:`Phase` (a constant rate, or a linear ramp, by inverting the cumulative
  rate), the same times for every policy run with the same seed (common random numbers);
* when the instance is idle with n waiting it serves ``decide(n)`` of the oldest, or waits for the next arrival or
  for the safety bound (``max_wait_ms="auto"``: the table's own timer or :func:`~smdp_batch.runtime.bound.
  default_max_wait_ms`, as the batcher), then serves the largest allowed size ≤ n (a *forced* batch), or n when
  none fits (``short_batch="serve"``), or with ``short_batch="pad-up"`` min(n, Bmax) requests run as the next
  allowed size (Triton's rule on padded profiles); by default (``"auto"``) each forced batch follows the live table's
  ``meta["short_batch"]`` (an SLO plan records the form it was planned with); after the last arrival what is left
  is drained the same way;
* a batch of b takes a time drawn from the problem's service law with mean l(b), times the phase's ``slowdown``,
  and ζ(b) × ``slowdown`` of energy (mJ: a slowed model runs as long and as hard); ``per_batch_ms`` more holds the
  instance after each batch, unseen by the hooks (a server's own dispatch between batches: where it is large,
  smaller batches raise the delay);
* each response takes ``outside_ms`` more after its batch ends (the server's front end and the client: a constant,
  or a draw per response), which the end-to-end times recorded include and the policy's hooks do not see: they get
  each request's time from its arrival to its batch's end, as the batcher's hooks report it (an Autopilot budgets
  the rest as ``overhead_ms``, or with ``served=True`` is told the end-to-end times, as the server integrations
  tell it theirs);
* or ``outside_ms`` is what a real server was measured to add (a :class:`~smdp_batch.model.served.ServedDelay`,
  ``smdp-batch calibrate``'s file): batches take l(b) as that server ran them and hold the instance a + c·b more,
  the k-th response of a batch leaves k·r after the first, and each response draws an outside delay from the
  sample of the calibrated load nearest at or above the traffic's rate at its batch's end.

:func:`simulate_ray` runs Ray Serve 2.60's ``serve.batch`` on the same trace (a batch closes on its own timer or at
its size, whatever the model does; closed batches run one at a time, in order), which a table cannot express: at a
fixed timeout, or with an Autopilot planning Ray's batcher that sets the timeout live, as the Ray Serve integration
does.

An Autopilot's hooks are called at their simulated times: ``observe_arrival`` at each arrival,
``observe_batch`` and ``observe_response`` at each batch's end.  Built with ``clock=SimClock()`` (the same object
passed here) and ``solve_in="clock"``, it reads the simulated time, each solve runs at once in the hook that
starts it and goes live ``solve_seconds`` of simulated time later: the run is deterministic for a seed, and
controller designs can be compared on one trace in seconds.  What the simulation leaves out: the host's CPU
(a solve does not slow the batches beside it, though the Autopilot still leaves them out of l̂(b)), and any
delay of the server's own beyond ``outside_ms`` (a calibration draws each part independently, at its load).

Units: times in ms (``clock`` in s, as the Autopilot's), energy in mJ, rates in requests per ms.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..runtime.bound import default_max_wait_ms
from .hooks import served_hook
from .report import event_fields

__all__ = ["Phase", "SimClock", "SimRun", "arrivals", "simulate", "simulate_ray"]

#: The most requests one simulation takes (about 100 bytes each with an Autopilot's hooks).
MAX_REQUESTS = 5_000_000
_EARLY_MS = 1e-9  # a bound this close is due (the batcher's _EARLY_S)


class SimClock:
    """A clock the simulator moves: ``clock()`` is the simulated time in s (pass it to the Autopilot's ``clock``)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class Phase:
    """``seconds`` of traffic at ``rate`` requests/ms (a linear ramp to ``end_rate`` when given), every batch
    started in it taking ``slowdown`` × its drawn time."""

    seconds: float
    rate: float
    end_rate: float | None = None
    slowdown: float = 1.0
    name: str = ""

    def check(self, k: int) -> None:
        end = self.rate if self.end_rate is None else self.end_rate
        for what, v, ok in (("seconds", self.seconds, "a finite number > 0"),
                            ("rate", self.rate, "a finite rate ≥ 0 (requests/ms)"),
                            ("end_rate", end, "a finite rate ≥ 0 (requests/ms) or None"),
                            ("slowdown", self.slowdown, "a finite factor > 0")):
            good = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                (v > 0 if what in ("seconds", "slowdown") else v >= 0)
            if not good:
                raise ValueError(f"phase {k + 1}: {what} = {v!r}; it must be {ok}")


def arrivals(phases: Sequence[Phase], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Poisson arrival times (ms, increasing) and the phase index of each, for ``phases`` run back to back."""
    if not phases:
        raise ValueError("a trace needs at least one phase")
    for k, ph in enumerate(phases):
        ph.check(k)
    expected = sum(ph.seconds * 1e3 * 0.5 * (ph.rate + (ph.rate if ph.end_rate is None else ph.end_rate))
                   for ph in phases)
    if expected > MAX_REQUESTS:
        raise ValueError(f"the trace holds about {expected:.3g} requests; at most {MAX_REQUESTS:.0e} are simulated "
                         "(shorten the phases or lower the rates)")
    rng = np.random.default_rng([seed, 0])
    out, idx, t0 = [], [], 0.0
    for k, ph in enumerate(phases):
        T, la = ph.seconds * 1e3, float(ph.rate)
        lb = la if ph.end_rate is None else float(ph.end_rate)
        total = 0.5 * (la + lb) * T  # Λ(T), the cumulative rate Λ(t) = la·t + (lb − la)·t²/2T
        u = np.sort(rng.uniform(0.0, total, rng.poisson(total)))
        if abs(lb - la) <= 1e-12 * max(la, lb):
            t = u / la if la > 0 else u
        else:
            c = (lb - la) / (2.0 * T)
            t = 2.0 * u / (la + np.sqrt(la * la + 4.0 * c * u))  # the root of c·t² + la·t = u, without cancellation
        out.append(t0 + np.minimum(t, T))
        idx.append(np.full(u.size, k, dtype=np.int64))
        t0 += T
    return np.concatenate(out), np.concatenate(idx)


@dataclass(frozen=True)
class SimRun:
    """What :func:`simulate` saw: per request (arrival and end-to-end response time, ms; phase), per batch (start
    and duration, ms; size; energy, mJ; phase it started in), and the Autopilot's events (each its JSON line as a
    dict, with ``t_s``, the simulated time)."""

    phases: tuple[Phase, ...]
    arrival_ms: np.ndarray
    response_ms: np.ndarray
    phase: np.ndarray
    batch_start_ms: np.ndarray
    batch_ms: np.ndarray
    batch_size: np.ndarray
    batch_energy_mj: np.ndarray
    batch_phase: np.ndarray
    forced_batches: int
    events: tuple[dict, ...]

    def summary(self, slo_ms: float) -> list[dict]:
        """Per phase: requests, p99 (ms) with a distribution-free 95 % interval (the order statistics at the
        binomial(n, 0.99) ranks' normal bounds), the share over ``slo_ms``, mean batch size, energy per request
        (mJ), and the Autopilot's events in it by kind."""
        rows = []
        for k, ph in enumerate(self.phases):
            x = np.sort(self.response_ms[self.phase == k])
            n = x.size
            sel = self.batch_phase == k
            b = self.batch_size[sel]
            t_lo = sum(p.seconds for p in self.phases[:k])
            kinds: dict[str, int] = {}
            for e in self.events:
                if t_lo <= e["t_s"] < t_lo + ph.seconds:
                    kinds[e["event"]] = kinds.get(e["event"], 0) + 1
            half = 1.96 * math.sqrt(n * 0.99 * 0.01)
            lo, hi = int(math.floor(0.99 * n - half)), int(math.ceil(0.99 * n + half))
            rows.append({"phase": ph.name or str(k + 1), "requests": int(n),
                         "p99_ms": float(np.percentile(x, 99)) if n else math.nan,
                         "p99_interval_ms": (float(x[lo]) if n >= 100 and lo >= 0 else math.nan,
                                             float(x[hi]) if n >= 100 and hi < n else math.inf),
                         "over_slo": float(np.mean(x > slo_ms)) if n else math.nan,
                         "mean_batch": float(b.mean()) if b.size else math.nan,
                         "mj_per_request": float(self.batch_energy_mj[sel].sum() / b.sum()) if b.size else math.nan,
                         "events": kinds})
        return rows


def _outside(outside_ms: Any, calibrated: Any, rng: np.random.Generator, ph: Phase, end_ms: float, t: float,
             b: int) -> np.ndarray:
    """The time outside the batcher (ms) of the b responses of a batch ending at t in phase ``ph`` (ending at
    ``end_ms``): with a calibration, k·r for the k-th of the batch and a draw at the traffic's rate at t."""
    if calibrated is None:
        return np.asarray(outside_ms(rng, b) if callable(outside_ms) else np.full(b, float(outside_ms)), dtype=np.float64)
    frac = min(max((t - (end_ms - ph.seconds * 1e3)) / (ph.seconds * 1e3), 0.0), 1.0)
    sample = calibrated.outside_at(ph.rate if ph.end_rate is None else ph.rate + (ph.end_rate - ph.rate) * frac)
    return calibrated.return_ms * np.arange(b) + sample[rng.integers(0, sample.size, b)]


def _calibrated(outside_ms: Any) -> Any:
    """The ServedDelay ``outside_ms`` is, or None (a number of ms ≥ 0 or a function; anything else refused)."""
    if callable(getattr(outside_ms, "outside_at", None)):
        return outside_ms
    if not callable(outside_ms) and not (isinstance(outside_ms, (int, float)) and math.isfinite(outside_ms)
                                         and outside_ms >= 0):
        raise ValueError(f"outside_ms must be a finite number of ms ≥ 0, a function (rng, n) → ms or a ServedDelay "
                         f"(smdp-batch calibrate's file), got {outside_ms!r}")
    return None


def simulate_ray(problem: Any, phases: Sequence[Phase], max_batch_size: int, timeout_ms: Any, *, seed: int = 0,
                 outside_ms: float | Callable[[np.random.Generator, int], np.ndarray] | Any = 0.0,
                 clock: SimClock | None = None) -> SimRun:
    """Ray Serve 2.60's ``@serve.batch(max_batch_size, batch_wait_timeout_s)`` through ``phases``, on the arrivals and
    draws :func:`simulate` takes for the same seed: a batch opens at its first request and closes ``timeout_ms``
    later or at ``max_batch_size`` requests, whatever the model does, and the closed batches run one at a time, in
    order (:func:`smdp_batch.baselines.servers.ray_serve` has the source); each runs as the next of the problem's
    sizes (padded up).  ``outside_ms`` as for :func:`simulate`.

    ``timeout_ms`` is the timeout (ms), or an Autopilot planning Ray's batcher (``family="ray"``, built with
    ``solve_in="clock"`` and ``clock=SimClock()``, that clock passed here) that sets it live, as
    ``autopilot_deployment(live_knobs=True)`` does: each batch waits for the timer in force when its first request
    came (Ray reads ``batch_wait_timeout_s`` as a batch opens); the Autopilot hears of each arrival, of each batch
    of a profiled size when it ends, and of each response's end-to-end time beside its batcher view (first request
    in → batch end), at its batch's end (the deployment's client tells them every quarter second)."""
    from .pilot import Autopilot

    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, (int, np.integer)) or \
            not 1 <= max_batch_size <= max(problem.batch_sizes):
        raise ValueError(f"max_batch_size must be a whole number in 1..{max(problem.batch_sizes)}, got {max_batch_size!r}")
    pilot = timeout_ms if isinstance(timeout_ms, Autopilot) else None
    if pilot is not None:
        _check_clock(pilot, clock)
        if pilot.plan.table.meta.get("family") != "ray" or pilot.max_wait_ms is None:
            raise ValueError("an Autopilot sets Ray's batch_wait_timeout_s when it plans Ray's batcher (family='ray')")
    elif not (isinstance(timeout_ms, (int, float)) and not isinstance(timeout_ms, bool) and math.isfinite(timeout_ms)
              and timeout_ms >= 0):
        raise ValueError(f"timeout_ms must be a finite number of ms ≥ 0 or an Autopilot planning Ray's batcher, "
                         f"got {timeout_ms!r}")
    calibrated = _calibrated(outside_ms)
    problem = calibrated.apply(problem) if calibrated is not None else problem
    phases = tuple(phases)
    arr, ph_of = arrivals(phases, seed)
    clock = clock or SimClock()
    rng_s, rng_o = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    ends = np.cumsum([p.seconds * 1e3 for p in phases])
    sizes = sorted(int(b) for b in problem.batch_sizes)
    told = set(pilot.batch_sizes) if pilot is not None else set()  # the sizes the Autopilot hears of (its profile's)
    tell = served_hook(pilot)[0] if pilot is not None else None
    timeout = float(pilot.max_wait_ms or 0.0) if pilot is not None else float(timeout_ms)  # the setting in force (ms)
    N = arr.size
    resp = np.full(N, math.nan)
    out: list[list[float]] = [[], [], [], [], []]  # start, ms, size, mJ, phase
    waiting: deque[tuple[float, int, int]] = deque()  # closed batches: (close time ms, first request, count)
    first, n, close_at = 0, 0, math.inf  # the open batch
    running: tuple[float, float, int, int, int, int] | None = None  # (start, ms, first, count, size run as, phase)
    free, i = 0.0, 0  # when the model is next free (ms); the next arrival

    def run_next() -> None:  # the oldest closed batch starts once the model is free
        nonlocal running
        if running is None and waiting:
            close, a, b = waiting.popleft()
            start = max(close, free)
            k = min(int(np.searchsorted(ends, start, side="right")), len(phases) - 1)
            run_as = next(x for x in sizes if x >= b)
            dur = float(problem.service.sample(rng_s, float(problem.latency(np.float64(run_as))), 1, run_as)[0]) * \
                phases[k].slowdown
            running = (start, dur, a, b, run_as, k)

    with _events(clock) as events:
        while i < N or n or waiting or running is not None:
            t_arr = float(arr[i]) if i < N else math.inf
            t_end = running[0] + running[1] if running is not None else math.inf
            if n and close_at < t_arr and close_at <= t_end:  # the open batch's timer (a request on it still joins)
                waiting.append((close_at, first, n))
                n = 0
                run_next()
            elif t_arr <= t_end:
                clock.t = t_arr / 1e3
                if pilot is not None:
                    pilot.observe_arrival(t_arr)
                    live = pilot.max_wait_ms  # (a timeout of 0 is a setting: Ray's batches of one)
                    timeout = timeout if live is None else float(live)
                if n == 0:
                    first, close_at = i, t_arr + timeout
                n += 1
                i += 1
                if n == max_batch_size:
                    waiting.append((t_arr, first, n))
                    n = 0
                    run_next()
            else:
                assert running is not None  # (the loop runs while something waits; a closed batch starts at once)
                start, dur, a, b, run_as, k = running
                clock.t = t_end / 1e3
                idx = np.arange(a, a + b)
                view = t_end - arr[idx]
                resp[idx] = view + _outside(outside_ms, calibrated, rng_o, phases[k], float(ends[k]), t_end, b)
                for col, v in zip(out, (start, dur, b, float(problem.energy(np.float64(run_as))) * phases[k].slowdown,
                                        k)):
                    col.append(v)
                if pilot is not None:
                    if b in told:  # a size the profile has (Ray forms any size ≤ its maximum; as the deployment)
                        pilot.observe_batch(b, dur / 1e3, True)
                    if tell is not None:
                        tell(resp[idx], batch_ms=view)
                free = t_end + (float(calibrated.per_batch_ms(run_as)) if calibrated is not None else 0.0)
                running = None
                run_next()
    return SimRun(phases, arr, resp, ph_of, np.array(out[0]), np.array(out[1]), np.array(out[2], dtype=np.int64),
                  np.array(out[3]), np.array(out[4], dtype=np.int64), 0, tuple(events.lines))


class _Events(logging.Handler):
    """The Autopilot's JSON lines on the ``smdp_batch`` logger, stamped with the simulated time."""

    def __init__(self, clock: Callable[[], float]):
        super().__init__(logging.DEBUG)
        self.clock, self.lines = clock, []  # type: tuple[Callable[[], float], list[dict]]

    def emit(self, record: logging.LogRecord) -> None:
        fields = event_fields(record.getMessage())
        if fields is not None:
            self.lines.append({"t_s": self.clock(), **fields})


@contextlib.contextmanager
def _events(clock: Callable[[], float]) -> Iterator[_Events]:
    """The Autopilot's events while a simulation runs (the ``smdp_batch`` logger at INFO at least, then as it was)."""
    events = _Events(clock)
    logger = logging.getLogger("smdp_batch")
    level = logger.level
    logger.addHandler(events)
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    try:
        yield events
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)


def _check_clock(pilot: Any, clock: SimClock | None) -> None:
    if pilot.solve_in != "clock" or clock is None or pilot._clock is not clock:
        raise ValueError("an Autopilot runs in the simulator when built with solve_in='clock' and clock=SimClock(), "
                         "that same clock passed here: a solve in a thread or process would race the simulated time")


def simulate(policy: Any, problem: Any, phases: Sequence[Phase], *, seed: int = 0, clock: SimClock | None = None,
             outside_ms: float | Callable[[np.random.Generator, int], np.ndarray] | Any = 0.0,
             max_wait_ms: float | str | None = "auto", short_batch: str = "auto", per_batch_ms: float = 0.0,
             served: bool = False) -> SimRun:
    """Serve ``phases`` of Poisson traffic with ``policy`` on one simulated instance of ``problem``'s server (its
    service law, l(b) and ζ(b)); see the module doc.  ``clock``: the :class:`SimClock` an Autopilot was built with
    (``solve_in="clock"``); ``outside_ms``: each response's time outside the batcher (ms, or ``f(rng, n)`` → n
    draws), or a :class:`~smdp_batch.model.served.ServedDelay` (module doc); ``max_wait_ms`` and ``short_batch``
    ("serve", "pad-up", or "auto": the table's own): as :class:`~smdp_batch.runtime.DynamicBatcher` takes them.
    ``served``: an Autopilot is also told each response's end-to-end time (``observe_served``, at its batch's end,
    with the batch's view beside it: the outside delay it learns), as a server integration that records them does.  ``batch_size`` records the requests of each batch; its time and
    energy are those of the size it ran as (padded up, where it was)."""
    from .pilot import Autopilot

    if not callable(getattr(policy, "decide", None)):
        raise TypeError("policy must have a decide(n) method (an Autopilot, a PolicyTable, an AdaptivePolicy)")
    if isinstance(policy, Autopilot):
        _check_clock(policy, clock)
    if short_batch not in ("serve", "pad-up", "auto"):
        raise ValueError(f"short_batch must be 'serve', 'pad-up' or 'auto', got {short_batch!r}")
    if isinstance(max_wait_ms, str) and max_wait_ms != "auto":
        raise ValueError(f"max_wait_ms must be 'auto', None or a number of ms ≥ 0, got {max_wait_ms!r}")
    fixed = None if max_wait_ms == "auto" else math.inf if max_wait_ms is None else float(max_wait_ms)
    if fixed is not None and not fixed >= 0:
        raise ValueError(f"max_wait_ms must be 'auto', None or a number of ms ≥ 0, got {max_wait_ms!r}")
    if not (isinstance(per_batch_ms, (int, float)) and math.isfinite(per_batch_ms) and per_batch_ms >= 0):
        raise ValueError(f"per_batch_ms must be a finite number of ms ≥ 0, got {per_batch_ms!r}")
    calibrated = _calibrated(outside_ms)
    if calibrated is not None:  # l(b) as that server ran it; its a + c·b and k·r below
        problem = calibrated.apply(problem)
    phases = tuple(phases)
    arr, ph_of = arrivals(phases, seed)
    clock = clock or SimClock()
    rng_s, rng_o = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    ends = np.cumsum([p.seconds * 1e3 for p in phases])
    slow = [float(p.slowdown) for p in phases]
    sizes = sorted(int(b) for b in (getattr(policy, "batch_sizes", None) or problem.batch_sizes))
    law = problem.service
    l_of: dict[int, float] = {}
    z_of: dict[int, float] = {}
    bound_cache: dict[int, tuple[Any, float]] = {}

    def bound_ms() -> float:
        if fixed is not None:
            return fixed
        table = policy if hasattr(policy, "phase_table") else getattr(policy, "table", policy)
        hit = bound_cache.get(id(table))
        if hit is None or hit[0] is not table:
            hit = bound_cache[id(table)] = (table, float(default_max_wait_ms(table)))
        return hit[1]

    def forced(n: int) -> tuple[int, int]:  # (requests taken, the size they run as)
        meta = getattr(getattr(policy, "table", policy), "meta", None)
        form = short_batch if short_batch != "auto" else meta.get("short_batch") if isinstance(meta, dict) else None
        if form == "pad-up":
            take = min(n, sizes[-1])
            return take, next(b for b in sizes if b >= take)
        fit = [b for b in sizes if b <= n]
        return (fit[-1], fit[-1]) if fit else (n, n)

    on_arrival = getattr(policy, "observe_arrival", None)
    on_batch = getattr(policy, "observe_batch", None)
    on_response = getattr(policy, "observe_response", None)
    on_served = served_hook(policy)[0] if served else None
    on_timer = getattr(policy, "poll", None)
    N = arr.size
    resp = np.full(N, math.nan)
    b_start, b_ms, b_size, b_mj, b_ph = [], [], [], [], []
    q: deque[int] = deque()
    i, t, n_forced = 0, 0.0, 0

    def arrive(until: float) -> None:  # the arrivals before ``until`` (ms) join the queue, each at its own time
        nonlocal i
        while i < N and arr[i] < until:
            clock.t = float(arr[i]) / 1e3
            q.append(i)
            if on_arrival is not None:
                on_arrival(float(arr[i]))
            i += 1

    with _events(clock) as events:
        while i < N or q:
            if not q:
                t = max(t, float(arr[i]))
                arrive(math.nextafter(t, math.inf))
                continue
            n = len(q)
            clock.t = t / 1e3
            b = policy.decide(n)
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b <= n:
                raise ValueError(f"the policy returned {b!r} at queue length {n}; a batch must be an int in 0..{n}")
            b = run_as = int(b)
            if b == 0:
                deadline = float(arr[q[0]]) + bound_ms()
                nxt = float(arr[i]) if i < N else math.inf
                if deadline - t > _EARLY_MS and min(nxt, deadline) < math.inf:
                    if nxt <= deadline:  # an arrival first: decide again with it
                        t = nxt
                        arrive(math.nextafter(t, math.inf))
                    else:  # the bound fires: decide again (a swap may have come), then serve
                        t = deadline
                        if on_timer is not None:
                            clock.t = t / 1e3
                            on_timer()
                    continue
                b, run_as = forced(n)  # overdue, or the last arrival came and no bound is set: drain
                n_forced += 1
            batch = [q.popleft() for _ in range(b)]
            k = min(int(np.searchsorted(ends, t, side="right")), len(phases) - 1)
            if run_as not in l_of:
                l_of[run_as] = float(problem.latency(np.float64(run_as)))
                z_of[run_as] = float(problem.energy(np.float64(run_as)))
            dur = float(law.sample(rng_s, l_of[run_as], 1, run_as)[0]) * slow[k]
            end = t + dur
            arrive(end)  # the arrivals during the batch
            t = end
            clock.t = t / 1e3
            extra = _outside(outside_ms, calibrated, rng_o, phases[k], ends[k], t, b)
            idx = np.asarray(batch, dtype=np.int64)
            view = end - arr[idx]  # the batcher's: arrival → batch end
            resp[idx] = view + np.asarray(extra, dtype=np.float64).reshape(b)
            if on_batch is not None:
                on_batch(run_as, dur / 1e3, True)
            if on_response is not None:
                on_response(view)
            if on_served is not None:  # an Autopilot is told its batcher's view beside (the outside delay learned)
                on_served(resp[idx], batch_ms=view)
            b_start.append(end - dur)
            b_ms.append(dur)
            b_size.append(b)
            b_mj.append(z_of[run_as] * slow[k])
            b_ph.append(k)
            hold = per_batch_ms + (float(calibrated.per_batch_ms(run_as)) if calibrated is not None else 0.0)
            if hold > 0:  # the instance stays busy, unseen: arrivals meanwhile wait for it
                arrive(t + hold)
                t += hold
    return SimRun(phases, arr, resp, ph_of, np.array(b_start), np.array(b_ms), np.array(b_size, dtype=np.int64),
                  np.array(b_mj), np.array(b_ph, dtype=np.int64), n_forced, tuple(events.lines))
