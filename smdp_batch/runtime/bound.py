"""The batcher's automatic safety bound (``max_wait_ms="auto"``): how long the oldest request may wait
while the table says wait, before the largest allowed batch is served anyway.  numpy only."""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import numpy as np

from ..limits import RATE_MAX, RATE_MIN
from .guard import check_rate, real
from .table import PolicyTable

__all__ = ["BOUND_EPS", "BOUND_SAFETY", "FALLBACK_MAX_WAIT_MS", "default_max_wait_ms", "erlang_bound_ms",
           "erlang_quantile_ms"]

#: Safety bound (ms) when the arrival rate or the table's waiting states are unknown.
FALLBACK_MAX_WAIT_MS = 1000.0
#: The default bound is ``BOUND_SAFETY`` × the (1 − ``BOUND_EPS``) quantile of the fill time.
BOUND_EPS = 1e-6
BOUND_SAFETY = 2.0


@functools.lru_cache(maxsize=256)
def erlang_quantile_ms(k: int, lam: float, p: float) -> float:
    """Time t (ms) with P(T_k ≤ t) = p, T_k the time of the k-th arrival of a Poisson stream of rate lam
    (1/ms): T_k ~ Erlang(k, lam), and P(T_k > t) = P(Poisson(lam·t) < k).  Bisection, numpy-free."""
    if k <= 0:
        return 0.0

    def tail(x: float) -> float:  # P(Poisson(x) < k), summed in logs
        if x <= 0:
            return 1.0
        lx = math.log(x)
        logs = [j * lx - x - math.lgamma(j + 1) for j in range(k)]
        top = max(logs)
        return math.exp(top) * math.fsum(math.exp(a - top) for a in logs)

    q = 1.0 - p
    lo, hi = 0.0, float(k)
    while tail(hi) > q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tail(mid) > q else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return hi / lam


def erlang_bound_ms(k: int, lam: float) -> float:
    """``BOUND_SAFETY`` × the (1 − ``BOUND_EPS``) quantile of Erlang(k, lam) (ms); the fallback if that is not
    a finite number."""
    b = BOUND_SAFETY * erlang_quantile_ms(int(k), float(lam), 1.0 - BOUND_EPS)
    return b if math.isfinite(b) else FALLBACK_MAX_WAIT_MS


def _policy_array(table: Any) -> np.ndarray | None:
    table = getattr(table, "table", table)  # an AdaptivePolicy: its current table
    return table.policy if isinstance(table, PolicyTable) else None


def default_max_wait_ms(table: Any, lam: float | None = None) -> float:
    """The default safety bound (ms) for ``table`` at arrival rate ``lam`` (1/ms; default: the table's λ).

    Let k be the last queue length at which the table waits (for a control-limit table, k = Q − 1).
    Once a request is the oldest waiting, k further arrivals are enough for the table to serve it at the
    next epoch (FIFO: the requests behind it stay queued).  So the bound can fire for it only if those k
    arrivals take longer than the bound: with Poisson arrivals at λ that time is Erlang(k, λ), whatever
    the service times.  The bound is ``BOUND_SAFETY`` (2) × its (1 − ``BOUND_EPS``) = (1 − 10⁻⁶)
    quantile: at the table's λ it fires for far fewer than 10⁻⁶ of the waits, and still for at most
    10⁻⁶ of them if traffic runs at half the table's rate.  It costs one timer per idle wait and
    otherwise nothing.  0 if the table never waits with a request queued.

    A table whose ``meta["max_wait_ms"]`` records its timer (an SLO setting of a λ-bank built by
    :func:`smdp_batch.analysis.bands.slo_bank`) is bounded by that timer instead.  A
    :class:`~smdp_batch.runtime.phase.PhasePolicy` computes its own (per phase).

    ``lam`` must lie in [1e-12, 1e12] per ms (:class:`~smdp_batch.errors.InputError` otherwise).  Without a
    policy array (a plain callable) or without a usable rate (a table built in memory with no
    ``meta["inputs"]["lam"]``, or one outside that range, and no ``lam`` given), the bound is
    ``FALLBACK_MAX_WAIT_MS`` (1 s): long enough for any batch-forming wait at server rates, short enough that
    traffic that stops does not strand requests.  Pass ``max_wait_ms`` for anything else.
    """
    if lam is not None:
        lam = check_rate(lam)
    own = getattr(table, "default_max_wait_ms", None)  # a PhasePolicy knows its phases' rates
    meta = getattr(getattr(table, "table", table), "meta", None)
    timer = meta.get("max_wait_ms") if isinstance(meta, dict) else None
    if isinstance(timer, numbers.Real) and not isinstance(timer, bool) and math.isfinite(real(timer)) and timer >= 0:  # type: ignore[operator]  # numbers.Real declares no >, >= (typeshed)
        return real(timer)  # the table's own timer (an SLO setting, smdp_batch.analysis.bands)
    if callable(own):
        return float(own(lam))
    policy = _policy_array(table)
    if lam is None:
        lam = getattr(getattr(table, "table", table), "lam", None)
        if lam is not None and not (math.isfinite(lam) and RATE_MIN <= lam <= RATE_MAX):
            lam = None  # a table recording no usable rate: the fallback
    if policy is None or lam is None:
        return FALLBACK_MAX_WAIT_MS
    k = int(np.nonzero(policy == 0)[0][-1])  # policy[0] = 0 always; policy[s_max] > 0 (validated)
    return erlang_bound_ms(k, lam)
