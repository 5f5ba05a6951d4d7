"""The service-time draws of a simulation run, drawn once for every run on the same random numbers.

A run draws its batches' service times up front, as unit-mean draws from the problem's law (the kernel scales
each by l(b)): one pool for every size when the law's shape is the same for every b, else one pool per
executed size, each as long as the most batches of that size the run can form.  Which draws a run gets depends
only on the generator's state, the law, the stream's length and the pools' sizes, not on the rule's other
knobs: the SLO search simulates hundreds of settings of one rule family on each load's stream (common random
numbers), and with a per-size law (a measured profile) drawing these pools again for each took over half of
its time.

So the pools are kept, by exactly what decides them, with the generator's state after the draws: a run that
finds them leaves its generator where drawing them would have, and gets the same numbers to the bit.  The
kept pools are bounded by :data:`CACHE_BYTES` (least recently used out first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

__all__ = ["unit_draws", "CACHE_BYTES"]

#: The most bytes of pools kept (a 2·10⁵-request run with six per-size pools holds about 10 MB).
CACHE_BYTES = 64 * 2**20

_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()  # the SLO search simulates on threads: one reader or writer of the cache at a time


def unit_draws(law, rng: np.random.Generator, rule, n_base: int, n_req: int, smax_exec: int, shared: bool,
               det: bool) -> tuple[np.ndarray, np.ndarray]:
    """(unit draws, pool of each executed size) for a run of ``n_req`` requests of which the first ``n_base``
    are the stream's own (their draws come first, exactly as for the stream alone; the continuation's after
    them).  ``shared``: one pool for every size; ``det``: deterministic times (no draws).  The pools must not
    be written to: they may be another run's too."""
    pool_of = np.zeros(smax_exec + 1, dtype=np.int64)
    if det:
        return np.ones((1, 1)), pool_of
    if shared:  # at most one batch per request
        layout: tuple = ("shared",)
    else:  # a size s is used by at most N / (fewest requests padded to s) batches
        executed = tuple(int(s) for s in rule.executed_sizes())
        layout = (executed, tuple(n_base // rule.fewest_requests_for(s) + 1 for s in executed),
                  tuple(n_req // rule.fewest_requests_for(s) + 1 for s in executed))
    st = rng.bit_generator.state
    key = (id(law), repr(st), int(n_base), int(n_req), layout)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is law:
            _CACHE.move_to_end(key)
    if hit is not None and hit[0] is law:
        rng.bit_generator.state = hit[3]
        return hit[1], hit[2]
    if shared:
        unit = law.sample(rng, 1.0, n_base)[None, :]
        if n_req > n_base:
            unit = np.concatenate([unit, law.sample(rng, 1.0, n_req - n_base)[None, :]], axis=1)
    else:
        executed, base, caps = layout
        unit = np.zeros((len(executed), max(caps)))
        for i, (s, cap) in enumerate(zip(executed, base)):
            pool_of[s] = i
            unit[i, :cap] = law.sample(rng, 1.0, cap, s)
        for i, (s, lo, hi) in enumerate(zip(executed, base, caps)):  # the continuation's, after the stream's
            if hi > lo:
                unit[i, lo:hi] = law.sample(rng, 1.0, hi - lo, s)
    if unit.nbytes <= CACHE_BYTES // 4:
        with _LOCK:
            _CACHE[key] = (law, unit, pool_of, rng.bit_generator.state)
            while sum(v[1].nbytes for v in _CACHE.values()) > CACHE_BYTES:
                _CACHE.popitem(last=False)
    return unit, pool_of
