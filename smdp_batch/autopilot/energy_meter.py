"""Batch energy ζ̂(b) from a GPU's cumulative energy counter, for the Autopilot.

A GPU's energy counter (NVML's total energy, mJ since the driver loaded; Volta and later) does not move
with each batch: the driver refreshes it in steps, about every 100 ms
(:mod:`smdp_batch.measure.counter`, which ``smdp-batch measure`` reads the same way).  A batch of a few ms
therefore has no counter difference of its own.  Instead, each interval between two observed refreshes, (τ_{k-1}, τ_k], is
one linear equation in the board's power while idle, p₀, and while running a batch of size b, p_b (W):

    ΔE_k = p₀·idle_k + Σ_b p_b·busy_{k,b}                          (J = W·s)

busy_{k,b} the time (s) the interval spent running batches of size b (from the batches' own start and end),
idle_k the rest.  The powers are written p_b = s·m_b + δ_b around the model's m_b = ζ(b)/l(b): one scale s
for the whole curve, and a per-size correction δ_b.  :class:`PowerRegression` is the Bayesian least-squares
(ridge) estimate of (p₀, s, δ) with weak priors p₀ ≈ 0 and δ_b ≈ 0, each as strong as ``prior_s`` seconds
of data, and s ≈ 1 a thousand times weaker (so the powers measured are explained by the scale first and by
corrections only where the model's shape is off), and old intervals forgotten with weight 1 − 1/``memory``
per new one.  So a size never
run follows the measured scale of the sizes that ran (ŝ·m_b), and a size that ran gets its own power.  The
batch energy is then ζ̂(b) = p̂_b·l̂(b) (W·ms = mJ), with l̂(b) the Autopilot's batch-time estimate: the same
quantity that ``smdp-batch measure --energy nvml`` profiles (the board's energy while the batch runs, idle
draw included).

:class:`EnergyMeter` samples the counter in a daemon thread every ``period_s`` and notes each refresh as
:class:`~smdp_batch.measure.counter.SteppedCounter` places it.  An interval is turned
into its equation once ``lag_s`` have passed (0.1 s plus three times the longest batch seen), so the
batches running in it have been reported.  An interval whose batches overlap each other (several batches
at once: replicas or instances sharing the GPU, where the counter cannot tell them apart) is dropped and
counted in ``overlapping``.  A failing or non-finite read is counted in ``errors``, ends no interval, and the
thread goes on.

numpy only; :func:`nvml_meter` imports ``pynvml`` (``nvidia-ml-py``, the ``measure`` extra) when called.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..measure.counter import SteppedCounter, nvml_counter

__all__ = ["PowerRegression", "EnergyMeter", "nvml_meter", "open_meter"]


class PowerRegression:
    """Ridge estimate of the idle power p₀ and the power p_b while running a batch of each size (module
    docstring).  ``model_w``: m_b = ζ(b)/l(b) of the model (W), in the order of the sizes."""

    def __init__(self, model_w: Sequence[float], *, prior_s: float = 0.02, memory: int = 600):
        m = np.asarray(model_w, dtype=np.float64)
        if m.ndim != 1 or m.size == 0 or not np.all(np.isfinite(m)) or np.any(m < 0):
            raise ValueError("model_w must be a non-empty 1-D array of finite powers ≥ 0 (W)")
        if not (math.isfinite(prior_s) and prior_s > 0) or not (isinstance(memory, int) and memory >= 2):
            raise ValueError(f"need prior_s > 0 (s) and memory ≥ 2 intervals, got {prior_s!r}, {memory!r}")
        self.model_w, self.memory = m, memory
        k = m.size + 2  # unknowns: p₀, s, δ_1..δ_K
        scale = float(np.mean(m)) or 1.0  # s multiplies W: its pseudo-data is in J
        self._prior = np.full(k, prior_s ** 2)
        self._prior[1] = 1e-3 * (prior_s * scale) ** 2  # s far weaker than δ: a shape the data bear out is a scale
        self._mean = np.zeros(k)
        self._mean[1] = 1.0
        self._A = np.zeros((k, k))
        self._r = np.zeros(k)
        self.intervals = 0
        self._cache: tuple[float, np.ndarray] | None = None

    def add(self, idle_s: float, busy_s: np.ndarray, joules: float) -> None:
        """One interval: idle time (s), time running each size (s, in the sizes' order) and energy (J)."""
        x = np.empty(self._r.size)
        x[0], x[1], x[2:] = idle_s, float(busy_s @ self.model_w), busy_s
        f = 1.0 - 1.0 / self.memory
        self._A *= f
        self._r *= f
        self._A += np.outer(x, x)
        self._r += joules * x
        self.intervals += 1
        self._cache = None

    def power_w(self) -> tuple[float, np.ndarray]:
        """(p̂₀, p̂_b for each size), W, each at least 0."""
        if self._cache is None:
            theta = np.linalg.solve(self._A + np.diag(self._prior), self._r + self._prior * self._mean)
            p = theta[1] * self.model_w + theta[2:]
            self._cache = (max(float(theta[0]), 0.0), np.maximum(p, 0.0))
        return self._cache


class EnergyMeter:
    """A cumulative energy counter turned into ζ̂(b) (module docstring).

    ``read()`` returns the counter in mJ; ``sizes`` are the batch sizes 𝓑 and ``model_w`` the model's power
    ζ(b)/l(b) (W) per size.  ``thread=False`` starts no sampler: call :meth:`sample` yourself (tests).
    """

    def __init__(self, read: Callable[[], float], sizes: Sequence[int], model_w: Sequence[float], *,
                 period_s: float = 0.005, min_intervals: int = 20, prior_s: float = 0.02, memory: int = 600,
                 clock: Callable[[], float] = time.monotonic, thread: bool = True, name: str = "energy counter"):
        self.sizes = tuple(int(b) for b in sizes)
        self._index = {b: i for i, b in enumerate(self.sizes)}
        self.regression = PowerRegression(model_w, prior_s=prior_s, memory=memory)
        if len(self.sizes) != self.regression.model_w.size:
            raise ValueError("sizes and model_w differ in length")
        self.read, self.clock, self.name = read, clock, name
        self._counter = SteppedCounter(read, clock)
        self.period_s, self.min_intervals = float(period_s), int(min_intervals)
        self.errors = self.overlapping = self.late = 0
        self._lock = threading.Lock()
        self._batches: collections.deque = collections.deque(maxlen=100_000)  # (size index, start, end) s
        self._longest = 0.0
        self._refresh: tuple[float, float] | None = None  # (τ, value) of the latest refresh seen
        self._pending: collections.deque = collections.deque(maxlen=10_000)  # (τ_{k-1}, τ_k, ΔE mJ)
        self._resolved = -math.inf  # intervals before this time are in the regression
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="smdp-energy-meter", daemon=True)
            self._thread.start()

    # --------------------------------------------------------------- inputs
    def batch(self, b: Any, seconds: Any) -> None:
        """A batch of size b that ended now and ran ``seconds``; other sizes and non-finite times are ignored."""
        i = self._index.get(int(b)) if isinstance(b, (int, np.integer)) and not isinstance(b, bool) else None
        try:
            d = float(seconds)
        except (TypeError, ValueError):
            return
        if i is None or not (math.isfinite(d) and 0 <= d < 3600):
            return
        end = self.clock()
        with self._lock:
            if end - d < self._resolved:
                self.late += 1  # it ran in an interval already fitted without it
            self._batches.append((i, end - d, end))
            self._longest = max(self._longest, d)

    def sample(self) -> None:
        """One read of the counter; a changed value closes an interval."""
        try:
            edge = self._counter.sample()
        except Exception:  # noqa: BLE001 - a failed or non-finite read is counted; serving goes on
            self.errors += 1
            return
        with self._lock:
            if edge is not None:
                tau, v = edge
                if self._refresh is not None and v > self._refresh[1]:
                    self._pending.append((self._refresh[0], tau, v - self._refresh[1]))
                self._refresh = (tau, v)  # a counter that went back (a driver reload) starts again here
            self._fit(self._counter.last[0] if self._counter.last is not None else self.clock())  # last: this read

    def _fit(self, now: float) -> None:
        lag = 0.1 + 3.0 * self._longest
        while self._pending and self._pending[0][1] + lag <= now:
            a, b, mj = self._pending.popleft()
            busy = np.zeros(len(self.sizes))
            for i, s, e in self._batches:
                if e > a and s < b:
                    busy[i] += min(e, b) - max(s, a)
            idle = (b - a) - float(busy.sum())
            if idle < -1e-3 * (b - a):
                self.overlapping += 1
            else:
                self.regression.add(max(idle, 0.0), busy, mj / 1e3)
            self._resolved = b
        while self._batches and self._batches[0][2] < self._resolved - lag:
            self._batches.popleft()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    # --------------------------------------------------------------- outputs
    @property
    def intervals(self) -> int:
        return self.regression.intervals

    def power_w(self) -> tuple[float, np.ndarray] | None:
        """(idle W, W while running each size), or None before ``min_intervals`` intervals are fitted."""
        with self._lock:
            return self.regression.power_w() if self.regression.intervals >= self.min_intervals else None

    def energy_mj(self, latency_ms: Sequence[float]) -> np.ndarray | None:
        """ζ̂(b) = p̂_b·l̂(b) (mJ) for the given batch times l̂(b) (ms), or None before enough intervals."""
        p = self.power_w()
        return None if p is None else p[1] * np.asarray(latency_ms, dtype=np.float64)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)


def nvml_meter(sizes: Sequence[int], model_w: Sequence[float], **kw: Any) -> EnergyMeter | None:
    """An :class:`EnergyMeter` on NVML's total-energy counter of the process's GPU, or None where there is
    none (no ``pynvml``, no driver, no GPU, or a GPU before Volta without the counter)."""
    try:
        read, name = nvml_counter()
    except Exception:  # noqa: BLE001 - the extra's InputError or any NVMLError: no counter to read
        return None
    return EnergyMeter(read, sizes, model_w, name=f"NVML total energy of {name}", **kw)


def open_meter(spec: Any, sizes: Sequence[int], problem: Any) -> Any:
    """The Autopilot's energy meter: ``"auto"`` NVML's counter of the process's GPU where there is one (else
    None), None for none, or a meter of your own (``batch(b, seconds)``, ``energy_mj(latency_ms)``,
    ``power_w()``, ``name``, ``close()``), e.g. an :class:`EnergyMeter` on another counter."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec != "auto":
            raise ValueError(f"energy_meter must be 'auto', None or an energy meter, got {spec!r}")
        return nvml_meter(sizes, problem.energy_mj() / problem.latency_ms())  # ζ(b)/l(b): mJ/ms = W
    if not all(callable(getattr(spec, k, None)) for k in ("batch", "energy_mj", "power_w", "close")):
        raise ValueError(f"energy_meter must be 'auto', None or an energy meter, got {spec!r}")
    return spec
