"""λ-bank: tables solved over a grid of arrival rates, and a policy that follows the measured rate.

Traffic drifts; a table is optimal for one λ.  Paper 004 §VIII suggests per-phase policies for
modulated (MMPP) traffic.  :class:`AdaptivePolicy` estimates λ online from arrival times and serves
with the bank's table for the nearest grid rate (nearest in log λ), switching only when the estimate
has moved past the geometric midpoint between two grid rates by a relative margin (hysteresis), so a
rate sitting near a boundary does not make the policy flap.  numpy and h5py only.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections import deque
from typing import cast

import numpy as np

from ..errors import InputError
from .guard import check_rate, check_time_ms, real
from .schema import read_bank
from .table import PolicyTable

__all__ = ["PolicyBank", "RateEstimator", "AdaptivePolicy"]


class PolicyBank:
    """Tables of one scenario at increasing arrival rates λ_0 < λ_1 < … (1/ms)."""

    def __init__(self, tables: list[PolicyTable]):
        if not tables:
            raise InputError("a policy bank needs at least one table")
        lams = [t.lam for t in tables]
        if any(l is None for l in lams):
            raise InputError("every table of a bank must record the λ it was solved for")
        order = np.argsort(cast("list[float]", lams))  # no None, checked above
        self.tables = [tables[i] for i in order]
        self.lams = np.asarray([lams[i] for i in order], dtype=np.float64)
        if np.any(np.diff(self.lams) <= 0):
            raise InputError(f"a bank needs distinct arrival rates, got {self.lams.tolist()}")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PolicyBank":
        tables = []
        for pf in read_bank(path):
            meta = {**pf.meta, "integrity": pf.integrity, "inputs": pf.inputs, "truncation": pf.truncation,
                    "solution": {k: v for k, v in pf.solution.items() if k not in ("relative_values", "summary_json")}}
            tables.append(PolicyTable(pf.policy[:-1], pf.batch_sizes, meta, str(path)))
        return cls(tables)

    def index_for(self, lam: float) -> int:
        """Index of the grid rate nearest to ``lam`` in log λ."""
        x = math.nan if isinstance(lam, bool) or not isinstance(lam, numbers.Real) else real(lam)
        if not (math.isfinite(x) and x > 0):
            raise InputError(f"arrival rate must be a finite number > 0 (1/ms), got {lam!r:.60}")
        return int(np.argmin(np.abs(np.log(self.lams) - math.log(x))))

    def table_for(self, lam: float) -> PolicyTable:
        return self.tables[self.index_for(lam)]

    def __len__(self) -> int:
        return len(self.tables)

    def __repr__(self) -> str:
        return f"<PolicyBank {len(self)} tables, λ = {', '.join(f'{l:.4g}' for l in self.lams)} /ms>"


class RateEstimator:
    """Online arrival-rate estimate (1/ms) from arrival times in ms.

    ``mode="window"``: (K − 1) / (span of the last K arrivals), K = ``window``.
    ``mode="ewma"``: exponentially weighted arrivals over exponentially weighted elapsed time, time
    constant ``tau_ms``: Σ_i e^{−(t−t_i)/τ} / (τ·(1 − e^{−(t−t_0)/τ})), unbiased from the first arrival on.
    ``ready`` once ``min_arrivals`` arrivals have been seen.  Thread-safe; an arrival time earlier than
    the last (a clock stepped back, or two threads sharing one estimator) counts as the last (zero elapsed
    time); NaN, ±inf and negative times raise ``InputError`` and leave the estimate unchanged.
    """

    WINDOW_MAX = 10**7  # arrival times kept in window mode (8 bytes each)

    def __init__(self, mode: str = "window", window: int = 256, tau_ms: float = 1000.0, min_arrivals: int = 32):
        if mode not in ("window", "ewma"):
            raise InputError(f"rate estimator mode must be 'window' or 'ewma', got {mode!r}")
        tau = math.nan if isinstance(tau_ms, bool) or not isinstance(tau_ms, numbers.Real) else real(tau_ms)
        if not (_count(window, self.WINDOW_MAX) and math.isfinite(tau) and tau > 0 and _count(min_arrivals)):
            raise InputError(f"need an integer window in [2, {self.WINDOW_MAX}], a finite tau_ms > 0 (ms) and an "
                             f"integer min_arrivals ≥ 2; got window={window!r:.40}, tau_ms={tau_ms!r:.40}, "
                             f"min_arrivals={min_arrivals!r:.40}")
        self.mode, self.window, self.tau, self.min_arrivals = mode, int(window), tau, int(min_arrivals)
        self._times: deque[float] = deque(maxlen=self.window)
        self._rate = 0.0
        self._last: float | None = None
        self._first: float | None = None
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, t_ms: float) -> None:
        """Record one arrival at time t (ms ≥ 0; an earlier time than the last counts as the last)."""
        t = check_time_ms(t_ms)
        with self._lock:
            if self._last is not None and t < self._last:
                t = self._last
            if self.mode == "window":
                self._times.append(t)
            else:
                if self._last is not None:
                    self._rate *= math.exp(-(t - self._last) / self.tau)
                self._rate += 1.0 / self.tau
            self._last = t
            if self._first is None:
                self._first = t
            self.count += 1

    @property
    def ready(self) -> bool:
        return self.count >= self.min_arrivals

    @property
    def rate(self) -> float | None:
        """Current estimate (1/ms), or None before ``ready``."""
        with self._lock:
            if not self.ready:
                return None
            if self.mode == "window":
                span = self._times[-1] - self._times[0]
                return (len(self._times) - 1) / span if span > 0 else None
            assert self._last is not None and self._first is not None  # set by the arrivals that made it ready
            elapsed = -math.expm1(-(self._last - self._first) / self.tau)
            return self._rate / elapsed if elapsed > 0 else None


def _count(x, top: float = math.inf) -> bool:
    """x is an integer (int, numpy integer, or an integral float) in [2, top]."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    v = real(x)
    return math.isfinite(v) and v == int(v) and 2 <= x <= top  # type: ignore[operator]  # numbers.Real declares no >= (typeshed)


class AdaptivePolicy:
    """A table from a :class:`PolicyBank`, switched as the estimated λ moves (with hysteresis).

    Use it wherever a table goes: ``decide(n)``; :class:`~smdp_batch.runtime.DynamicBatcher` calls
    ``observe_arrival(t_ms)`` for every request.  Thread-safe: several batchers (threads) may share one.
    """

    # declared here: mypy takes the numbers.Real check in __init__ to always raise for a float
    bank: PolicyBank
    estimator: RateEstimator
    h: float
    index: int
    switches: list[tuple[float, float, float]]
    _lock: threading.Lock

    def __init__(self, bank: PolicyBank, estimator: RateEstimator | None = None, hysteresis: float = 0.1,
                 initial_lam: float | None = None):
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, numbers.Real) or not (0 <= hysteresis < 1):
            raise InputError(f"hysteresis must be in [0, 1), got {hysteresis!r:.60}")
        self.bank = bank
        self.estimator = estimator or RateEstimator()
        self.h = float(hysteresis)
        self.index = (bank.index_for(check_rate(initial_lam, "initial_lam")) if initial_lam is not None
                      else len(bank) // 2)
        self.switches: list[tuple[float, float, float]] = []  # (time ms, λ from, λ to)
        self._lock = threading.Lock()

    @property
    def table(self) -> PolicyTable:
        return self.bank.tables[self.index]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.table.batch_sizes

    def decide(self, n: int) -> int:
        return self.table.decide(n)

    def observe_arrival(self, t_ms: float) -> None:
        """One arrival at t (ms ≥ 0; NaN, ±inf and negative times raise ``InputError``, changing nothing)."""
        t = check_time_ms(t_ms)
        with self._lock:
            self.estimator.observe(t)
            lam = self.estimator.rate
            if lam is None or not (math.isfinite(lam) and lam > 0):
                return
            lams, i = self.bank.lams, self.index
            while i + 1 < lams.size and lam > math.sqrt(lams[i] * lams[i + 1]) * (1.0 + self.h):
                i += 1
            while i > 0 and lam < math.sqrt(lams[i - 1] * lams[i]) * (1.0 - self.h):
                i -= 1
            if i != self.index:
                self.switches.append((t, float(lams[self.index]), float(lams[i])))
                self.index = i

    def __repr__(self) -> str:
        return f"<AdaptivePolicy at λ = {self.bank.lams[self.index]:.4g}/ms of {self.bank!r}, {len(self.switches)} switches>"
