"""A cumulative energy counter that moves in steps (NVML's total energy), read the same way by
``smdp-batch measure`` and by the Autopilot's energy meter.

NVML's total-energy counter (mJ since the driver loaded; Volta and later) does not move with each call: the
driver refreshes it in steps.  On an NVIDIA H200 (driver 580) the steps came every ≈ 100 ms (10th-90th
percentiles 78-108 ms), and one read took 3.8 ms.  A block of calls of a few ms therefore has no counter
difference of its own: a plain difference of two reads around it sees zero, one or two steps.  What can be
measured is the energy between two *refreshes*, over the time between them.

:class:`SteppedCounter` reads such a counter and reports each refresh: a read that returns a new value closes
a step, and the refresh is placed at the midpoint between the last read with the old value and the first with
the new one, each read timed at the middle of its call.  A read that is not a finite number raises and leaves
the last good read in place, so it never ends a step.  The two readers differ only in what they make of the
refreshes, which is why they share this and nothing else:

* ``measure`` (:mod:`smdp_batch.measure.energy`) takes the mean power between two refreshes at least 0.5 s
  apart while a size's calls run, times each timed call's duration;
* the Autopilot (:mod:`smdp_batch.autopilot.energy_meter`) turns each interval between two refreshes into one
  linear equation in the idle power and the power while running each batch size, for a regression.

:func:`nvml_counter` opens NVML's counter of one GPU (``pynvml``, from ``nvidia-ml-py``, the ``measure`` extra).
Standard library only.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

from ..extras import require

__all__ = ["SteppedCounter", "nvml_counter"]


class SteppedCounter:
    """Reads ``read()`` (the counter's value) and reports each refresh as ``(τ, value)``; ``clock`` in s."""

    def __init__(self, read: Callable[[], Any], clock: Callable[[], float] = time.perf_counter):
        self.read, self.clock = read, clock
        self.last: tuple[float, float] | None = None  # (time, value) of the latest good read

    def sample(self) -> tuple[float, float] | None:
        """One read: ``(τ, value)`` of a refresh when the value differs from the previous good read, else None.
        Raises what ``read`` raises, and ValueError for a value that is not a finite number."""
        t0 = self.clock()
        v = float(self.read())
        t = 0.5 * (t0 + self.clock())
        if not math.isfinite(v):
            raise ValueError(f"the energy counter read {v}")
        last, self.last = self.last, (t, v)
        if last is None or v == last[1]:
            return None
        return 0.5 * (last[0] + t), v


def _visible_gpu(pynvml: Any) -> Any:
    """The NVML handle of the process's first GPU: the first entry of CUDA_VISIBLE_DEVICES (an index or a
    UUID), else GPU 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(first))
    if first.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def nvml_counter(index: int | None = None) -> tuple[Callable[[], float], str]:
    """``(read, device name)`` for NVML's total-energy counter (mJ) of GPU ``index`` (NVML's numbering), or
    with None of the process's first visible GPU.  Raises the extra's one-line error without ``pynvml``, and
    NVML's own error where there is no driver, no such GPU, or a GPU without the counter (before Volta)."""
    pynvml = require("pynvml", "the NVML energy counter")
    pynvml.nvmlInit()
    h = _visible_gpu(pynvml) if index is None else pynvml.nvmlDeviceGetHandleByIndex(index)

    def read() -> float:
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))

    read()  # NVMLError_NotSupported before Volta
    name = pynvml.nvmlDeviceGetName(h)
    return read, name.decode() if isinstance(name, bytes) else str(name)
