"""The least power any batching rule can draw at a load, and the share of the achievable saving an answer takes.

Over a long run of T ms, c instances that each draw ``P_idle`` W while they run no batch, serving batches of
sizes B_1, B_2, … (each b taking l(b) ms and ζ(b) mJ on average), draw

    P̄ = c·P_idle + (1/T)·Σ_k (ζ(B_k) − P_idle·l(B_k))                                    (W = mJ/ms)
      = c·P_idle + λ·E_r[(ζ(B) − P_idle·l(B))/B],

E_r the average over requests of the batch each rides in (a batch of b carries b requests; λ·T requests in
all).  So no rule draws less than the *floor*

    P_floor(λ) = c·P_idle + λ·min_{b ∈ 𝓑_λ} (ζ(b) − P_idle·l(b))/b,

with 𝓑_λ the sizes a rule may rely on at that load: those that one size alone could carry (λ·l(b)/b < c)
and whose batches can fill and finish within the tightest latency bound on average, (b − 1)/(2λ) + l(b) ≤
bound (a batch of b waits on average (b − 1)/(2λ) for its requests to arrive).  With ``P_idle`` = 0 this is
λ·min ζ(b)/b: every request at the best energy per request.  The idle power moves the floor, and with it
how much there is to save against a default rule: that is why every answer states the idle power it used.
The floor bounds every rule that serves only sizes of 𝓑_λ; a rule may serve a larger batch in a burst, so
where the largest sizes are the cheapest per request (a high idle power) an answer can sit a little below it.

:func:`captured_share` is what an answer takes of the saving there is to take against a reference (Triton's
default, say): (P_reference − P_answer)/(P_reference − P_floor).  Contention between instances is left out
(the floor uses one instance's l(b) and ζ(b)).
"""

from __future__ import annotations

import math

import numpy as np

from ..model.problem import BatchingProblem

__all__ = ["power_floor", "captured_share"]


def power_floor(problem: BatchingProblem, lam: float, bound_ms: float, idle_power_w: float = 0.0) -> tuple[float, int | None]:
    """``(P_floor W, the size that attains it)`` at ``lam`` requests/ms under the tightest latency bound
    ``bound_ms`` (module doc); ``(nan, None)`` when no size qualifies."""
    sizes = np.asarray(problem.batch_sizes, dtype=np.float64)
    lat = np.asarray(problem.latency_ms(), dtype=np.float64)
    zeta = np.asarray(problem.energy_mj(), dtype=np.float64)
    c = problem.instances
    ok = (lam * lat / sizes < c) & ((sizes - 1.0) / (2.0 * lam) + lat <= bound_ms)
    if not np.any(ok):
        return math.nan, None
    per_request = np.where(ok, (zeta - idle_power_w * lat) / sizes, np.inf)
    i = int(np.argmin(per_request))
    return float(c * idle_power_w + lam * per_request[i]), int(sizes[i])


def captured_share(reference_w: float, answer_w: float, floor_w: float) -> float | None:
    """(P_reference − P_answer)/(P_reference − P_floor): the share of the achievable saving the answer takes;
    None where there is nothing to save (the reference at the floor) or a figure is not finite."""
    room = reference_w - floor_w
    if not all(math.isfinite(x) for x in (reference_w, answer_w, floor_w)) or room <= 0:
        return None
    return (reference_w - answer_w) / room
