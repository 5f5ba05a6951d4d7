"""Measure l(b) and ζ(b) of your own batch function: the profile CSV the model reads (paper 004 §III, §VII).

``measure(fn, make_batch, sizes=…)`` calls ``fn(make_batch(b))`` at every batch size b of a set —
``warmup`` untimed calls, then ``repeats`` timed ones — and returns a :class:`Measurement` that
writes ``batch_size,latency_ms[,energy_mj]`` (one row per call, the format of
:mod:`smdp_batch.model.profile`) and a sidecar ``FILE.csv.json`` saying how, where and when.

* **Where it runs.**  A function named ``module:function`` (as the CLI names it) runs in a child
  process, which the caller stops at the deadline: a call that hangs or spins, in Python or in
  compiled code, cannot outlive the budget.  A Python callable runs in this process: in the calling
  thread without a budget, in a worker thread with one (abandoned at the deadline; a compiled loop
  that never releases the GIL can only be stopped in a child process — name the function).
* **Failures.**  Anything the user's code raises at a size — an exception, ``MemoryError``, even
  ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit`` — stops the run at that size; the sizes
  measured before it are kept and ``note``/``failure`` name the size and the error ("out of memory",
  "timed out after N s").  A real Ctrl-C or SIGTERM of the caller still stops everything.
* **Latency**: wall time (``time.perf_counter_ns``) around the call.  When the user's code has
  imported torch and CUDA is available, ``torch.cuda.synchronize()`` runs before and after.
* **Energy**, first available of: NVML's total-energy counter (``nvidia-ml-py``, mJ, Volta and
  later), ``zeus``'s GPU energy window, or a constant power P the user gives (ζ = P·latency).  Each
  size's counter reading spans its block of timed calls and is split over them in proportion to
  their times.  NVML's counter is refreshed in steps (every ≈ 100 ms on an H200), so it is read between
  two refreshes at least 0.5 s apart, the block going on with untimed calls of the same size where the
  timed ones end sooner (:mod:`smdp_batch.measure_energy`).  The counter libraries are imported from the
  installed packages only: never from the working folder or the measured module's folder.
* **Budget**: ``budget_s`` bounds the calls (warm-ups included) and, separately, the start of the
  child process with the import of the user's module.

Functions are named ``module:function`` (``package.module:object.method`` too), imported from the
current folder or ``sys.path`` as uvicorn names apps; no string is ever evaluated.  The current folder
is on ``sys.path`` only while the user's module is imported.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.machinery
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .limits import BMAX_LIMIT
from .measure_worker import (NAME, Run, default_make_batch, energy_source, load_callable, loaded_sources,
                             run_here, run_in_child, synchronize, untrusted_folders, versions)

__all__ = ["measure", "Measurement", "load_callable", "default_make_batch", "check_settings", "module_sources",
           "DEFAULT_SIZES", "REPEATS_MAX", "WARMUP_MAX", "CALLS_MAX", "POWER_MAX_W"]

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
REPEATS_MAX = WARMUP_MAX = 100_000  # calls per size
CALLS_MAX = 1_000_000  # timed calls (rows) of one profile
POWER_MAX_W = 1e6
_LOG = logging.getLogger("smdp_batch")


# ------------------------------------------------------------------------------------ settings
def check_settings(sizes=DEFAULT_SIZES, warmup=3, repeats=10, budget_s=None, power_w=None, flags: bool = False):
    """Validate the settings before any work; (sizes sorted and distinct, warmup, repeats, budget_s, power_w).
    ``flags``: name them as the CLI's options in the messages."""
    name = (lambda flag, word: flag if flags else word)
    try:
        items = list(sizes)
    except TypeError:
        items = [sizes]
    bad = [s for s in items
           if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= s <= BMAX_LIMIT]
    if not items or bad:
        got = repr(items) if len(repr(items)) <= 80 else repr(items)[:80] + "…"
        raise InputError(f"{name('--sizes', 'batch sizes')} must be integers in 1..{BMAX_LIMIT}, got {got}")
    hi: float  # an int bound below, then a float one
    for flag, v, lo, hi in (("warmup", warmup, 0, WARMUP_MAX), ("repeats", repeats, 1, REPEATS_MAX)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
            raise InputError(f"{name('--' + flag, flag)} must be an integer in {lo}..{hi}, got {v!r}")
    sizes = sorted({int(s) for s in items})
    if len(sizes) * int(repeats) > CALLS_MAX:
        raise InputError(f"{len(sizes)} sizes × {int(repeats)} repeats = {len(sizes) * int(repeats)} timed calls; at "
                         f"most {CALLS_MAX} are written in one profile: give fewer sizes or "
                         f"{name('--repeats', 'repeats')}")
    for flag, v, hi, what in (("--budget-s", budget_s, math.inf, "seconds"),
                              ("--power-w", power_w, POWER_MAX_W, "watts")):
        if v is not None and not (isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
                                  and math.isfinite(v) and 0 < v <= hi):
            rng = "> 0" if hi == math.inf else f"in (0, {hi:g}]"
            raise InputError(f"{name(flag, 'budget_s' if flag == '--budget-s' else 'power_w')} must be a finite number "
                             f"of {what} {rng}, got {v!r}")
    return (sizes, int(warmup), int(repeats), None if budget_s is None else float(budget_s),
            None if power_w is None else float(power_w))


def module_sources(spec: str | None, folder: str | None = None) -> list[str]:
    """The files that importing ``spec``'s module would run (each package ``__init__`` on the way), found
    without running anything: the inputs an output must never overwrite."""
    name = str(spec or "").partition(":")[0]
    if not NAME.match(name):
        return []
    path = [os.path.abspath(folder or os.getcwd())] + [p for p in sys.path if isinstance(p, str) and p]
    files, parts = [], name.split(".")
    importlib.invalidate_caches()  # a module written a moment ago must not be missed
    for i in range(len(parts)):
        try:
            found = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), path)
        except (ImportError, ValueError, OSError):
            break
        if found is None:
            break
        if found.origin and os.path.isfile(found.origin):
            files.append(os.path.abspath(found.origin))
        path = list(found.submodule_search_locations or [])
    return files


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
    """Rows of one measurement run (one per timed call), how they were taken (``meta``) and the files of the
    measured code (``sources``: :meth:`write` never overwrites them)."""

    batch: np.ndarray  # int64 per row
    latency_ms: np.ndarray
    energy_mj: np.ndarray | None
    meta: dict = field(default_factory=dict)
    sources: tuple = ()

    @property
    def complete(self) -> bool:
        return bool(self.meta.get("complete", True))

    @property
    def note(self) -> str:
        return str(self.meta.get("note", ""))

    @property
    def failure(self) -> str:
        """What stopped the run at ``meta["stopped_at"]`` (empty when complete or cut by the budget)."""
        return str(self.meta.get("failure", ""))

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

    def write(self, path: str | os.PathLike, flag: str = "") -> tuple[str, str]:
        """Write the profile CSV and its sidecar ``PATH.json`` together (both or neither); returns both paths.
        Refuses a path that is one of the measured code's files, and a symlink at the sidecar's name."""
        from .files import atomic_output, atomic_outputs, current_plan

        path = os.fspath(path)
        if not self.batch.size:
            raise InputError(f"nothing was measured ({self.note or 'no sizes'}); {path} not written")
        if os.path.isdir(path):
            raise InputError(f"output {path!r} is a folder; give a file name such as profile.csv")
        values = [self.latency_ms] + ([] if self.energy_mj is None else [self.energy_mj])
        if not all(np.all(np.isfinite(v)) and np.all(v >= 0) for v in values):
            raise InputError(f"the measurement holds a value that is not a finite number ≥ 0; {path} not written")
        sidecar = path + ".json"
        meta = dict(self.meta, profile=os.path.basename(path))
        text = json.dumps(meta, indent=2, allow_nan=False) + "\n"
        outer = current_plan()
        with contextlib.nullcontext(outer) if outer is not None else atomic_outputs() as plan:
            plan.prepare([(flag, path), (f"{flag}'s sidecar" if flag else "", sidecar, False)],
                         [(f"source of the measured code ({f})", f) for f in self.sources])
            with atomic_output(sidecar, follow_symlinks=False) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
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
            power_w: float | None = None, device_index: int = 0, progress: bool | None = None,
            warn: bool = True) -> Measurement:
    """Time ``fn(make_batch(b))`` at each size (see the module doc); returns the :class:`Measurement`.

    ``fn`` and ``make_batch`` are callables or ``"module:function"`` names (both names, or a name and
    ``make_batch=None`` for :func:`default_make_batch`: measured in a child process).  ``energy``: ``auto``
    (NVML, then zeus, else none), ``nvml``, ``zeus`` or ``none``; ``power_w`` instead gives ζ = power_w·latency.
    ``progress``: a tqdm bar (None: on a terminal only).  ``warn``: log a failure that stopped the run.
    """
    sizes, warmup, repeats, budget_s, power_w = check_settings(sizes, warmup, repeats, budget_s, power_w)
    if energy not in ("auto", "nvml", "zeus", "none"):
        raise InputError(f"energy source {energy!r} is unknown; valid: auto, nvml, zeus, none")
    if power_w is not None and energy in ("nvml", "zeus"):
        raise InputError(f"give either a constant power or an energy counter ({energy}), not both")
    if isinstance(device_index, bool) or not isinstance(device_index, (int, np.integer)) \
            or not 0 <= device_index < 1 << 16:
        raise InputError(f"device index must be an integer in 0..65535, got {device_index!r}")
    fn_name = fn if isinstance(fn, str) else _name(fn)
    mb_name = make_batch if isinstance(make_batch, str) else _name(make_batch or default_make_batch)
    for spec, what in ((fn, "function"), (make_batch, "--make-batch")):
        if isinstance(spec, str) and not (NAME.match(spec.partition(":")[0]) and NAME.match(spec.partition(":")[2])):
            raise InputError(f"{what} {spec!r} must be written module:function (e.g. examples.onnx_mlp:infer)")
    named = isinstance(fn, str) and (make_batch is None or isinstance(make_batch, str))
    child = named and os.name == "posix" and bool(sys.executable)
    wall = time.perf_counter()
    bar = _progress(len(sizes) * (warmup + repeats), progress)
    run = Run(fn_name, sizes, repeats, budget_s, bar)
    try:
        if child:
            folder = os.getcwd()
            # names here (child): fn is a str and make_batch a str or None
            statics = module_sources(fn, folder) + module_sources(make_batch, folder)  # type: ignore[arg-type]
            cfg = {"fn": fn, "make_batch": make_batch, "folder": folder, "ppid": os.getpid(), "sizes": sizes,
                   "warmup": warmup, "repeats": repeats, "energy": energy, "power_w": power_w,
                   "device_index": int(device_index), "progress": bar is not None,
                   "untrusted": untrusted_folders(statics),
                   "path": [p for p in sys.path if isinstance(p, str) and p]}
            run_in_child(cfg, budget_s, run)
            why, c = run.info.get("no_counter", ""), run.info.get("counter")
            sources = sorted(set(statics) | set(run.info.get("sources", [])))
            source, device, energy_note = (c[0], c[1], c[2]) if c else (None, "cpu", "")
        else:
            fn = load_callable(fn, "function") if isinstance(fn, str) else fn
            make = (load_callable(make_batch, "--make-batch") if isinstance(make_batch, str)
                    else (make_batch or default_make_batch))
            if not callable(fn) or not callable(make):
                raise InputError(f"{'function' if not callable(fn) else 'make_batch'} is not callable")
            sources = sorted(set(loaded_sources(fn) + (loaded_sources(make) if make is not default_make_batch else [])))
            counter = energy_source(energy, power_w, int(device_index), untrusted_folders(sources))
            why, counter = (counter, None) if isinstance(counter, str) else ("", counter)
            sync = synchronize()
            run.info["cuda_sync"] = sync.__name__ == "synchronize"
            source, device, energy_note = ((counter.name, counter.device, counter.note) if counter is not None
                                           else (None, "cpu", ""))
            run_here(fn, make, sizes, warmup, repeats, budget_s, counter, sync, run)
            run.info["libraries"] = versions()
    finally:
        if bar is not None:
            bar.close()
    if why and run.blocks:  # no notice about a profile that will not be written
        _LOG.info(f"no energy counter ({why}): latency only; give a constant power (--power-w W) for ζ(b) = P·l(b)")
    if run.failure:
        if warn:
            _LOG.warning(run.note)
    elif run.note:
        _LOG.info(run.note)
    batch, lat, en = [], [], []
    for b, times, block in run.blocks:
        t = np.asarray(times, dtype=np.float64) / 1e6  # ms
        batch += [b] * t.size
        lat += t.tolist()
        if source is not None:
            share = t / t.sum() if t.sum() > 0 else np.full(t.size, 1.0 / t.size)
            en += (max(float(block or 0.0), 0.0) * share).tolist()
        elif power_w is not None:
            en += (power_w * t).tolist()  # W · ms = mJ
    has_energy = source is not None or power_w is not None
    meta = {
        "format": "smdp-batch-measurement", "function": fn_name, "make_batch": mb_name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
        "platform": platform.platform(), "cpu": _cpu_name(), "device": device,
        "libraries": run.info.get("libraries") or versions(),
        "method": ("wall time (time.perf_counter_ns) around fn(make_batch(b)), one row per timed call, "
                   + ("in a child process" if child else "in this process")
                   + ("; torch.cuda.synchronize() before and after" if run.info.get("cuda_sync") else "")),
        "sizes": sizes, "measured_sizes": sorted(set(batch)), "warmup": warmup, "repeats": repeats,
        "budget_s": budget_s, "elapsed_s": round(time.perf_counter() - wall, 3),
        "energy_source": source or ("constant" if power_w is not None else "none"),
        "energy_method": (energy_note + "; per size, split over its timed calls by their times"
                          if source is not None else f"constant power {power_w:g} W × latency" if power_w is not None
                          else "not measured"),
        "complete": not run.note, "note": run.note, "stopped_at": run.stopped_at, "failure": run.failure,
    }
    return Measurement(batch=np.asarray(batch, dtype=np.int64), latency_ms=np.asarray(lat, dtype=np.float64),
                       energy_mj=np.asarray(en, dtype=np.float64) if has_energy else None, meta=meta,
                       sources=tuple(sources))
