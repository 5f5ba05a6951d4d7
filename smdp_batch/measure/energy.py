"""The energy counters ``smdp-batch measure`` reads, and where they may be imported from.

* :func:`energy_source` opens the first counter available — NVML's total energy (``nvidia-ml-py``), then
  zeus — importing their libraries from installed packages only (never the working folder or the measured
  module's folder, :func:`untrusted_folders`).
* **NVML's counter moves in steps** (:mod:`smdp_batch.measure.counter`, shared with the Autopilot's
  energy meter), so two plain reads around a block of calls of a few ms each see zero, one or two steps: the
  energy is off by up to a whole step either way.
  :class:`_Nvml` therefore reads it in a thread while the calls run and measures between *refreshes*: the
  block starts just after one, goes on (with untimed calls of the same size, when the timed ones end
  sooner) until a refresh at least ``MIN_WINDOW_S`` = 0.5 s later, and the mean power between the two,
  ΔE/Δτ, times each timed call's duration is that call's energy.  A counter that does not refresh within
  ``EDGE_WAIT_S`` = 1 s is read around the block as it is (the window is then named in the note).
* zeus's window is read around the timed calls as zeus reports it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Sequence

from ..errors import InputError
from ..extras import require
from .counter import SteppedCounter, nvml_counter

__all__ = ["energy_source", "untrusted_folders", "describe", "idle_power_w", "IDLE_WINDOW_S"]

_PROBES = ("pynvml", "zeus")
MIN_WINDOW_S = 0.5  # the shortest span between the two refreshes an NVML energy reading rests on
EDGE_WAIT_S = 1.0  # the longest wait for a refresh
IDLE_WINDOW_S = 0.5  # the shortest window with no calls an idle-power reading spans


def _real(p) -> str:
    try:
        return os.path.realpath(os.fspath(p) or os.curdir)
    except (TypeError, ValueError):
        return ""


def describe(e: BaseException) -> str:
    """``Type: message`` on one line; a MemoryError as ``out of memory (MemoryError…)``."""
    try:
        text = " ".join(str(e).split())
    except Exception:  # a user exception whose __str__ raises
        text = ""
    text = text if len(text) <= 300 else text[:300] + "…"
    named = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return f"out of memory ({named})" if isinstance(e, MemoryError) else named

class _Nvml:
    """NVML's total-energy counter (mJ since the driver loaded; Volta and later), read between refreshes."""

    name = "nvml"

    def __init__(self, index: int):
        self._read, self.device = nvml_counter(index)
        self.note = (f"NVML total-energy counter of GPU {index} ({self.device}): the mean power between two of its "
                     f"refreshes at least {MIN_WINDOW_S:g} s apart while the size's calls run")
        self._edges: list[tuple[float, float]] = []  # (time s, mJ) of each refresh seen in the block
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _watch(self) -> None:
        """Read until stopped, noting each refresh (:class:`~smdp_batch.measure.counter.SteppedCounter`); a read
        that fails or is not finite ends the watch with a NaN edge, so the block's energy is NaN (named)."""
        counter = SteppedCounter(self._read)
        try:
            counter.sample()
            while not self._stop.is_set():
                edge = counter.sample()
                if edge is not None:
                    self._edges.append(edge)
                time.sleep(0.001)
        except Exception:  # noqa: BLE001 - the driver's error or a NaN: this block has no energy
            self._edges.append((time.perf_counter(), math.nan))

    def begin(self) -> None:
        """Start watching and return just after the next refresh (after at most EDGE_WAIT_S)."""
        self._edges, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._watch, name="smdp-nvml-watch", daemon=True)
        self._start = time.perf_counter()
        self._v0 = self._read()
        self._thread.start()
        while not self._edges and time.perf_counter() - self._start < EDGE_WAIT_S:
            time.sleep(0.0005)
        self._start = time.perf_counter()

    def more(self) -> bool:
        """Whether the block should go on: no refresh yet MIN_WINDOW_S after the first (and not given up)."""
        if not self._edges:
            return False  # a counter that does not refresh: read as it is
        first = self._edges[0][0]
        return self._edges[-1][0] - first < MIN_WINDOW_S and time.perf_counter() - first < MIN_WINDOW_S + EDGE_WAIT_S

    def end(self, busy_s: float) -> float:
        """The energy (mJ) of ``busy_s`` seconds of the timed calls: the mean power between the first and the
        last refresh of the block times busy_s (the plain difference where there were not two refreshes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=EDGE_WAIT_S)  # a read that hangs in the driver is not waited for
        edges = list(self._edges)
        if len(edges) >= 2 and edges[-1][0] > edges[0][0]:
            (t0, e0), (t1, e1) = edges[0], edges[-1]
            return (e1 - e0) / (t1 - t0) * busy_s
        return self._read() - (edges[0][1] if edges else self._v0)


def idle_power_w(counter, over) -> float | None:
    """The device's power while nothing is called (W): a window of at least :data:`IDLE_WINDOW_S` with no calls,
    read as the calls' blocks are (NVML: between two of its refreshes), before the first size and after the last.
    ``over()`` says the budget ran out (the window is then cut short, and nothing is read).  None where there is
    no counter or the reading is not a finite power ≥ 0."""
    if counter is None or over():
        return None
    counter.begin()
    t0 = time.perf_counter()
    while (counter.more() or time.perf_counter() - t0 < IDLE_WINDOW_S) and not over():
        time.sleep(0.005)
    span = time.perf_counter() - t0
    mj = float(counter.end(span))  # the mean power between refreshes × span (mJ); ends the counter's watch
    w = mj / span / 1e3  # mJ/s → W
    return w if not over() and math.isfinite(w) and w >= 0 else None


class _Zeus:
    """zeus's energy window (J) of one GPU."""

    name = "zeus"

    def __init__(self, index: int):
        ZeusMonitor = require("zeus.monitor", "the zeus energy counter").ZeusMonitor

        self._m = ZeusMonitor(gpu_indices=[index])
        self.device = f"GPU {index}"
        self.note = f"zeus ZeusMonitor energy window of GPU {index}, around each size's timed calls"

    def begin(self) -> None:
        self._m.begin_window("smdp-batch")

    def more(self) -> bool:
        return False

    def end(self, busy_s: float) -> float:
        return 1e3 * float(self._m.end_window("smdp-batch").total_energy)  # J → mJ


def _installed_roots() -> list[str]:
    """Where installed code lives: the interpreter's prefixes (stdlib, lib-dynload, site-packages of a venv)
    and the site-packages folders."""
    import site

    roots = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    with contextlib.suppress(Exception):
        roots += site.getsitepackages()
    with contextlib.suppress(Exception):
        roots.append(site.getusersitepackages())
    return [real for r in roots if r and len(real := _real(r)) > 1]  # never "/": that would trust everything


def untrusted_folders(sources: Sequence[str]) -> list[str]:
    """Folders no energy library may come from: the current one and the measured modules' own (a module's
    folder, and for a package the folder holding it), unless that is where installed code lives."""
    roots, out = _installed_roots(), ["", os.getcwd()]
    for f in sources:
        d = os.path.dirname(f)
        for folder in (d, os.path.dirname(d)) if os.path.basename(f).startswith("__init__.") else (d,):
            real = _real(folder)
            if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
                out.append(folder)
    return out


def _entry(mod) -> str | None:
    """The sys.path folder a top-level module was imported from."""
    f = getattr(mod, "__file__", None)
    if not isinstance(f, str):
        return None
    d = os.path.dirname(os.path.abspath(f))
    return _real(os.path.dirname(d) if os.path.basename(f).startswith("__init__.") else d)


@contextlib.contextmanager
def _installed_only(untrusted: Sequence[str]):
    """``sys.path`` without the untrusted folders for the block; then every energy library loaded must
    come from elsewhere (one loaded earlier from such a folder is refused, not used)."""
    bad = {_real(p) for p in untrusted}

    def check():
        for name in _PROBES:
            if name in sys.modules and _entry(sys.modules[name]) in bad:
                raise ImportError(f"{name} was loaded from {sys.modules[name].__file__}, the working or the measured "
                                  "module's folder, not from an installed package; not used")

    check()  # loaded before: never called
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if _real(p) not in bad]
    try:
        yield
        check()
    finally:
        sys.path[:] = saved


def energy_source(energy: str, power_w: float | None, device_index: int, untrusted: Sequence[str] = ()):
    """The counter to read, None for a constant power, or a string saying why there is no counter;
    ``energy``: auto | nvml | zeus | none."""
    if energy not in ("auto", "nvml", "zeus", "none"):
        raise InputError(f"energy source {energy!r} is unknown; valid: auto, nvml, zeus, none")
    if power_w is not None:
        if energy in ("nvml", "zeus"):
            raise InputError(f"give either a constant power or an energy counter ({energy}), not both")
        return None
    tried: list[str] = []
    for name, cls in (("nvml", _Nvml), ("zeus", _Zeus)):
        if energy not in ("auto", name):
            continue
        try:
            with _installed_only(untrusted):
                return cls(device_index)
        except Exception as e:  # not installed, no GPU, no counter on this GPU, not an installed package
            tried.append(f"{name}: {e if isinstance(e, InputError) else describe(e)}")
    if energy in ("nvml", "zeus"):
        raise InputError(f"no {energy} energy counter here ({'; '.join(tried)})")
    return "; ".join(tried) or "energy none"
