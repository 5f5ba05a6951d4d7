"""Measure l(b) and ζ(b) of your own batch function: the profile CSV the model reads (paper 004 §III, §VII).

``measure(fn, make_batch, sizes=…)`` calls ``fn(make_batch(b))`` at every batch size b of a set —
``warmup`` untimed calls, then ``repeats`` timed ones — and returns a :class:`Measurement` that
writes ``batch_size,latency_ms[,energy_mj]`` (one row per call, the format of
:mod:`smdp_batch.model.profile`) and a sidecar ``FILE.csv.json`` saying how, where and when.

* **Latency**: wall time (``time.perf_counter_ns``) around the call.  When the user's code has
  imported torch and CUDA is available, ``torch.cuda.synchronize()`` runs before and after, so
  the time covers the device's work; torch is never imported here.
* **Energy**, first available of: NVML's total-energy counter (``nvidia-ml-py``, mJ, Volta and
  later), ``zeus``'s GPU energy window, or a constant power P the user gives (ζ = P·latency).
  The counters update too coarsely for one short call, so each size's counter reading spans its
  whole block of timed calls and is split over the calls in proportion to their times.  With
  none of them (a CPU machine without RAPL access, as in CI), a profile has latency only, and one
  notice says so.
* **Budget**: ``budget_s`` bounds the whole run, warm-ups included.  When it runs out the sizes
  measured so far are kept, ``complete`` is False and ``note`` says where it stopped.

Functions are named ``module:function`` (``package.module:object.method`` too), imported from the
current directory or ``sys.path`` as uvicorn names apps; no string is ever evaluated.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError

__all__ = ["measure", "Measurement", "load_callable", "default_make_batch", "DEFAULT_SIZES"]

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
_LOG = logging.getLogger("smdp_batch")
_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: libraries whose version the sidecar records when the measured code has imported them
_LIBRARIES = ("numpy", "onnxruntime", "onnx", "torch", "tensorflow", "jax", "tensorrt", "pynvml", "zeus")


# ------------------------------------------------------------------------------------ user callables
def load_callable(spec: str, what: str = "function") -> Callable:
    """``module:attr[.attr…]`` → the callable; the current directory is importable (as for uvicorn)."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not _NAME.match(module_name) or not _NAME.match(attr):
        raise InputError(f"{what} {spec!r} must be written module:function (e.g. examples.onnx_mlp:infer)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise InputError(f"{what} {spec!r}: no module named {e.name!r} (from {os.getcwd()} or sys.path)") from None
        raise InputError(f"{what} {spec!r}: importing {module_name} failed: {e}") from None
    except Exception as e:  # the user's module raised while importing
        raise InputError(f"{what} {spec!r}: importing {module_name} raised {type(e).__name__}: {e}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{what} {spec!r}: module {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(f"{what} {spec!r} is a {type(obj).__name__}, not callable")
    return obj


def default_make_batch(b: int) -> list:
    """A list of b items (zeros): for functions that take a list of requests, as ``DynamicBatcher``'s do."""
    return [0.0] * b


# ------------------------------------------------------------------------------------ device and energy
def _synchronize() -> Callable[[], None]:
    """``torch.cuda.synchronize`` when the user's code uses torch on CUDA, else nothing to wait for."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.synchronize
    except Exception:  # pragma: no cover - a torch without a working CUDA runtime
        pass
    return lambda: None


class _Nvml:
    """NVML's total-energy counter (mJ since the driver loaded; Volta and later)."""

    name = "nvml"

    def __init__(self, index: int):
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(self._h)  # NVMLError_NotSupported before Volta
        name = pynvml.nvmlDeviceGetName(self._h)
        self.device = name.decode() if isinstance(name, bytes) else str(name)
        self.note = f"NVML total-energy counter of GPU {index} ({self.device})"

    def begin(self) -> None:
        self._e0 = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._h))

    def end(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._h)) - self._e0


class _Zeus:
    """zeus's energy window (J) of one GPU."""

    name = "zeus"

    def __init__(self, index: int):
        from zeus.monitor import ZeusMonitor

        self._m = ZeusMonitor(gpu_indices=[index])
        self.device, self.note = f"GPU {index}", f"zeus ZeusMonitor energy window of GPU {index}"

    def begin(self) -> None:
        self._m.begin_window("smdp-batch")

    def end(self) -> float:
        return 1e3 * float(self._m.end_window("smdp-batch").total_energy)  # J → mJ


def _energy_source(energy: str, power_w: float | None, device_index: int):
    """The counter to read, None for a constant power, or a string saying why there is no counter;
    ``energy``: auto | nvml | zeus | none."""
    if energy not in ("auto", "nvml", "zeus", "none"):
        raise InputError(f"energy source {energy!r} is unknown; valid: auto, nvml, zeus, none")
    if power_w is not None:
        if not (isinstance(power_w, (int, float)) and np.isfinite(power_w) and power_w > 0):
            raise InputError(f"power must be a finite number of watts > 0, got {power_w!r}")
        if energy in ("nvml", "zeus"):
            raise InputError(f"give either a constant power or an energy counter ({energy}), not both")
        return None
    tried: list[str] = []
    for name, cls in (("nvml", _Nvml), ("zeus", _Zeus)):
        if energy not in ("auto", name):
            continue
        try:
            return cls(device_index)
        except Exception as e:  # not installed, no GPU, no counter on this GPU
            tried.append(f"{name}: {type(e).__name__}{': ' + str(e) if str(e) else ''}")
    if energy in ("nvml", "zeus"):
        raise InputError(f"no {energy} energy counter here ({'; '.join(tried)})")
    return "; ".join(tried) or "energy none"


def _versions() -> dict:
    from . import __version__

    out = {"python": platform.python_version(), "smdp_batch": __version__}
    for name in _LIBRARIES:
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "unknown"))
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ------------------------------------------------------------------------------------ the measurement
@dataclass
class Measurement:
    """Rows of one measurement run (one per timed call) and how they were taken (``meta``)."""

    batch: np.ndarray  # int64 per row
    latency_ms: np.ndarray
    energy_mj: np.ndarray | None
    meta: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return bool(self.meta.get("complete", True))

    @property
    def note(self) -> str:
        return str(self.meta.get("note", ""))

    def summary(self) -> list[dict]:
        """Per measured size: samples, mean and standard deviation of the latency, mean energy."""
        out = []
        for b in np.unique(self.batch):
            sel = self.batch == b
            lat = self.latency_ms[sel]
            row = {"batch_size": int(b), "samples": int(sel.sum()), "mean_latency_ms": float(lat.mean()),
                   "std_latency_ms": float(lat.std(ddof=1)) if lat.size > 1 else 0.0}
            if self.energy_mj is not None:
                row["mean_energy_mj"] = float(self.energy_mj[sel].mean())
            out.append(row)
        return out

    def csv_text(self) -> str:
        head = "batch_size,latency_ms" + (",energy_mj" if self.energy_mj is not None else "")
        rows = [head]
        for i in range(self.batch.size):
            row = f"{int(self.batch[i])},{self.latency_ms[i]:.9g}"  # ns resolution of perf_counter_ns
            rows.append(row + (f",{self.energy_mj[i]:.9g}" if self.energy_mj is not None else ""))
        return "\n".join(rows) + "\n"

    def write(self, path: str | os.PathLike) -> tuple[str, str]:
        """Write the profile CSV and its sidecar ``PATH.json``, each atomically; returns both paths."""
        from .files import atomic_output

        path = os.fspath(path)
        if not self.batch.size:
            raise InputError(f"nothing was measured; {path} not written")
        if os.path.isdir(path):
            raise InputError(f"output {path!r} is a folder; give a file name such as profile.csv")
        sidecar = path + ".json"
        meta = dict(self.meta, profile=os.path.basename(path))
        with atomic_output(sidecar) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            json.dump(meta, fh, indent=2)
            fh.write("\n")
        with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(self.csv_text())
        return path, sidecar

    def profile(self, path: str = "<measurement>"):
        """The rows as a :class:`~smdp_batch.model.profile.Profile` (``ProfileCurve(path, profile=…)``)."""
        from .model.profile import Profile

        return Profile(path=path, batch=self.batch.copy(), latency=self.latency_ms.copy(),
                       energy=None if self.energy_mj is None else self.energy_mj.copy(),
                       lines=np.arange(2, self.batch.size + 2))


def _name(obj) -> str:
    """``module:qualname`` of a callable given from Python (for the sidecar)."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def _check_sizes(sizes) -> list[int]:
    try:
        items = list(sizes)
    except TypeError:
        raise InputError(f"batch sizes must be a list of positive integers, got {sizes!r}") from None
    bad = [s for s in items if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1]
    if not items or bad:
        raise InputError(f"batch sizes must be positive integers, got {items!r}")
    return sorted({int(s) for s in items})


def _progress(total: int, enabled: bool | None):
    """A tqdm bar on a terminal (stderr), else nothing; ``enabled=None``: only when stderr is a TTY."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="call", desc="measuring", file=sys.stderr, leave=False)


def measure(fn: Callable | str, make_batch: Callable | str | None = None, sizes: Sequence[int] = DEFAULT_SIZES, *,
            warmup: int = 3, repeats: int = 10, budget_s: float | None = None, energy: str = "auto",
            power_w: float | None = None, device_index: int = 0, progress: bool | None = None) -> Measurement:
    """Time ``fn(make_batch(b))`` at each size (see the module doc); returns the :class:`Measurement`.

    ``fn`` and ``make_batch`` are callables or ``"module:function"`` names; ``make_batch=None`` gives
    :func:`default_make_batch`.  ``energy``: ``auto`` (NVML, then zeus, else none), ``nvml``, ``zeus``
    or ``none``; ``power_w`` instead gives ζ = power_w·latency.  ``progress``: a tqdm bar (None: on a
    terminal only).
    """
    fn_name = fn if isinstance(fn, str) else _name(fn)
    mb_name = make_batch if isinstance(make_batch, str) else _name(make_batch or default_make_batch)
    sizes = _check_sizes(sizes)
    for name, v, lo in (("warmup", warmup, 0), ("repeats", repeats, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise InputError(f"{name} must be an integer ≥ {lo}, got {v!r}")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and budget_s > 0 and np.isfinite(budget_s)):
        raise InputError(f"the time budget must be a finite number of seconds > 0, got {budget_s!r}")
    fn = load_callable(fn, "function") if isinstance(fn, str) else fn
    make = load_callable(make_batch, "--make-batch") if isinstance(make_batch, str) else (make_batch or default_make_batch)
    if not callable(fn) or not callable(make):
        raise InputError(f"{'function' if not callable(fn) else 'make_batch'} is not callable")
    counter = _energy_source(energy, power_w, device_index)
    if isinstance(counter, str):  # why there is none
        _LOG.info(f"no energy counter ({counter}): latency only; give a constant power (--power-w W) for "
                  "ζ(b) = P·l(b)")
        counter = None
    sync = _synchronize()

    start = time.perf_counter()
    deadline = start + budget_s if budget_s is not None else float("inf")
    batch, lat, en, note = [], [], [], ""
    bar = _progress(len(sizes) * (warmup + repeats), progress)
    try:
        for b in sizes:
            try:
                data = make(b)
            except Exception as e:
                raise InputError(f"make_batch({b}) raised {type(e).__name__}: {e}") from None
            times: list[int] = []
            for k in range(warmup + repeats):
                if time.perf_counter() >= deadline:
                    note = (f"time budget of {budget_s:g} s ran out at b = {b} ({len(times)} of {repeats} timed calls); "
                            f"sizes {[s for s in sizes if s > b] or 'none'} not measured")
                    break
                if k == warmup and counter is not None:
                    sync()
                    counter.begin()
                sync()
                t0 = time.perf_counter_ns()
                try:
                    fn(data)
                except Exception as e:
                    raise InputError(f"{fn_name} raised {type(e).__name__} at batch size {b}: {e}") from None
                sync()
                t1 = time.perf_counter_ns()
                if k >= warmup:
                    times.append(t1 - t0)
                if bar is not None:
                    bar.update(1)
            if times:
                t = np.asarray(times, dtype=np.float64) / 1e6  # ms
                batch += [b] * t.size
                lat += t.tolist()
                if counter is not None:
                    block = max(counter.end(), 0.0)
                    en += (block * t / t.sum()).tolist()
                elif power_w is not None:
                    en += (power_w * t).tolist()  # W · ms = mJ
            if note:
                break
    finally:
        if bar is not None:
            bar.close()
    if note:
        _LOG.info(note)
    source = counter.name if counter is not None else ("constant" if power_w is not None else "none")
    meta = {
        "format": "smdp-batch-measurement", "function": fn_name, "make_batch": mb_name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
        "platform": platform.platform(), "cpu": _cpu_name(), "device": counter.device if counter is not None else "cpu",
        "libraries": _versions(),
        "method": "wall time (time.perf_counter_ns) around fn(make_batch(b)), one row per timed call"
                  + ("; torch.cuda.synchronize() before and after" if sync.__name__ == "synchronize" else ""),
        "sizes": sizes, "measured_sizes": sorted(set(batch)), "warmup": int(warmup), "repeats": int(repeats),
        "budget_s": budget_s, "elapsed_s": round(time.perf_counter() - start, 3),
        "energy_source": source,
        "energy_method": (counter.note + ", read around each size's timed calls and split over them by time"
                          if counter is not None else f"constant power {power_w:g} W × latency" if power_w is not None
                          else "not measured"),
        "complete": not note, "note": note,
    }
    return Measurement(batch=np.asarray(batch, dtype=np.int64), latency_ms=np.asarray(lat, dtype=np.float64),
                       energy_mj=np.asarray(en, dtype=np.float64) if (counter is not None or power_w is not None) else None,
                       meta=meta)
