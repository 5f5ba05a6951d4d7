"""Triton's own dynamic batcher, retimed live by an Autopilot: a bank of loaded models, each at its own delay.

**Why a bank.**  Triton's dynamic batcher reads ``max_queue_delay_microseconds`` from the model's config when the
model loads.  Reloading the serving model with a new delay took 1.3–1.4 s on a 2-core host and stalled the
requests in flight, raising the next second's p99 to 16–50 ms (``benchmarks/bench_triton_retime.py``), so a
plan cannot be applied by a reload.  Batching in front of Triton instead (the Autopilot's DynamicBatcher inside
a decoupled Python model, :mod:`smdp_batch.integrations.triton_autopilot`) sends every request through the
Python backend on its own, which costs the host more than Triton's batcher handing the model whole batches:
at the same SLO it forms smaller batches and draws more energy per request than tuned Triton.

A bank loads the same model K times at start, each with Triton's batcher at max batch Bmax and one delay of a
grid d₁ < … < d_K (:func:`bank_delays_us`, :func:`bank_models`).  The client sends each request to the member
whose delay is the largest at or below the Autopilot's timer in force (its plan's, family ``"triton"``, times
the closed loop's multiplier): retiming is the name the next request carries — no load, no stall, no request
lost.  A member in use forms its batches as a tuned Triton does; the others hold their memory (one Python stub
process each) and no CPU.  The price: a delay between two members is served at the lower one (a grid of ratio
r costs at most a factor r of the delay), and requests in flight on the old member finish there.

**Where the Autopilot lives.**  In the client, beside the router (:class:`BankRouter`), so that it judges what
the client sees:

* each send is an arrival (``observe_arrival``, the client's monotonic clock);
* each answer's send → answer time is a response (``observe_served``): the time the SLO is about, so the
  Autopilot's ``overhead_ms`` is only what lies beyond the client (0 for a client on the same host); beside it the
  request's send → batch end (the member's answer carries its batch's end), whose difference, the return leg, the
  Autopilot learns per load (the send leg stays inside the batcher's view here: Triton's queue is not seen);
* each batch a member ran is a batch (``observe_batch``: size and model time, read from the members' batch
  logs every ``poll_s``), for l̂(b) and the slowdown test.

Units: delays in µs (as Triton's config writes them), times in ms unless named ``_s``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from ..autopilot.hooks import served_hook
from ..errors import InputError
from .triton_autopilot import AutopilotModelSpec

__all__ = ["BankRouter", "bank_delays_us", "bank_models"]

#: The most members a bank may have (each is a Python stub process of its own).
MAX_MEMBERS = 32


def bank_delays_us(lo_ms: float, hi_ms: float, count: int) -> tuple[int, ...]:
    """0 µs and ``count`` − 1 delays spaced geometrically from ``lo_ms`` to ``hi_ms`` (whole µs, increasing).

    0 serves whatever waits as soon as the model is free (the best effort when no delay meets the SLO); a grid of
    ratio r = (hi/lo)^(1/(count − 2)) serves a planned delay d at a member within d/r … d.

    >>> bank_delays_us(2.0, 32.0, 6)
    (0, 2000, 4000, 8000, 16000, 32000)
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= MAX_MEMBERS:
        raise InputError(f"a bank has 2..{MAX_MEMBERS} members, got {count!r}")
    lo, hi = float(lo_ms), float(hi_ms)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo and (hi > lo or (count == 2 and hi == lo))):
        raise InputError(f"bank delays need 0 < lo < hi ms (finite), got lo = {lo_ms!r}, hi = {hi_ms!r}")
    grid = np.geomspace(lo, hi, count - 1) if count > 2 else np.array([lo])
    out = sorted({0, *(int(round(1000.0 * d)) for d in grid)})
    if len(out) != count:
        raise InputError(f"bank delays {lo:g}..{hi:g} ms give {len(out)} distinct whole-µs values, not {count}: "
                         "widen the range or use fewer members")
    return tuple(out)


def bank_models(spec: AutopilotModelSpec, max_batch_size: int, delays_us, prefix: str = "bank"
                ) -> dict[str, AutopilotModelSpec]:
    """The bank's members: ``spec`` (whose factory returns ``(infer, None)``: a plain model) once per delay, each with
    Triton's batcher at ``max_batch_size`` and that delay, named ``{prefix}_{delay_us}``."""
    b = int(max_batch_size)
    if b != max_batch_size or b < 1:
        raise InputError(f"the bank's max batch size must be a whole number ≥ 1, got {max_batch_size!r}")
    delays = [int(d) for d in delays_us]
    if not delays or delays != sorted(set(delays)) or delays[0] < 0 or len(delays) > MAX_MEMBERS:
        raise InputError(f"bank delays must be 1..{MAX_MEMBERS} distinct increasing whole µs ≥ 0, got {list(delays_us)}")
    return {f"{prefix}_{d}": dataclasses.replace(spec, triton_batching=(b, float(d))) for d in delays}


class BankRouter:
    """Routes each request to a bank member by the Autopilot's timer, and tells the Autopilot what the client sees.

    ``pilot``: an :class:`~smdp_batch.autopilot.Autopilot` planning Triton's batcher (``family="triton"``) at max
    batch the members' ``max_batch_size``; ``members``: name → delay (µs), e.g. :func:`bank_models`'s names with
    their delays; ``server``: the running :class:`~smdp_batch.integrations.triton_autopilot.AutopilotTriton` whose
    batch logs :meth:`poll` reads.  Used from one thread (the client's event loop: :func:`run_load` with
    ``router=``); the Autopilot's hooks take their own lock.
    """

    def __init__(self, pilot: Any, members: dict, server: Any = None, poll_s: float = 0.1):
        plan = getattr(pilot, "plan", None)
        if plan is None or plan.table.meta.get("family") != "triton":
            raise InputError("a Triton bank needs an Autopilot planning Triton's batcher (family='triton')")
        if not members:
            raise InputError("a Triton bank needs at least one member")
        items = sorted(((int(d), str(n)) for n, d in members.items()))
        if items[0][0] != 0:
            raise InputError("a Triton bank needs a member at delay 0 µs (the best effort when no delay meets the SLO)")
        self.pilot, self.server, self.poll_s = pilot, server, float(poll_s)
        self.delays_ms = np.array([d / 1000.0 for d, _ in items])
        self.names = [n for _, n in items]
        self.sent_to = dict.fromkeys(self.names, 0)  # requests per member
        self.switches = 0  # member changes
        self.current: str | None = None  # the member the last request went to
        self._offsets = dict.fromkeys(self.names, 0)  # bytes of each member's batch log read so far
        self._last_poll = -math.inf
        self._tell = served_hook(pilot)[0]  # the time, with the batcher's view beside it where the Autopilot takes it

    def member(self) -> str:
        """The member for the next request: the largest delay at or below the timer in force (no timer: the largest)."""
        t = self.pilot.max_wait_ms
        k = len(self.names) - 1 if t is None else max(int(np.searchsorted(self.delays_ms, float(t) + 1e-9)) - 1, 0)
        name = self.names[k]
        if name != self.current:
            self.switches += self.current is not None
            self.current = name
        return name

    def sent(self) -> str:
        """A request is being sent now: the Autopilot hears the arrival, and the member it goes to is returned."""
        self.pilot.observe_arrival(time.monotonic() * 1e3)
        name = self.member()
        self.sent_to[name] += 1
        self.poll()
        return name

    def answered(self, ms: float, batch_ms: float | None = None) -> None:
        """A request's send → answer time at the client (ms): the Autopilot's response.  ``batch_ms``: its send →
        batch end (the member's batch log clock against the client's: one host), told beside it where the
        Autopilot takes it, so that it learns the return leg per load (``observe_served(ms, batch_ms)``)."""
        if self._tell is not None:
            self._tell(ms, batch_ms=batch_ms if batch_ms is not None and math.isfinite(batch_ms) else None)

    def poll(self, force: bool = False) -> None:
        """Tell the Autopilot the batches the members ran since the last poll (at most every ``poll_s``)."""
        now = time.monotonic()
        if self.server is None or not (force or now - self._last_poll >= self.poll_s):
            return
        self._last_poll = now
        for name in self.names:
            rows, self._offsets[name] = self.server.batches_since(name, self._offsets[name])
            for b, t0, t1 in rows:
                self.pilot.observe_batch(b, t1 - t0)

    def stats(self) -> dict:
        """Requests per member, member switches, and the member in use."""
        return {"sent_to": {n: c for n, c in self.sent_to.items() if c}, "switches": self.switches,
                "current": self.current}
