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
  timed ones end sooner (:mod:`smdp_batch.measure.energy`).  The counter libraries are imported from the
  installed packages only: never from the working folder or the measured module's folder.
* **Budget**: ``budget_s`` bounds the calls (warm-ups included) and, separately, the start of the
  child process with the import of the user's module.
* **Several callers** (``concurrency`` K): each size is timed again with k = 2..K callers at once, each on
  its own batch, in threads of the measuring process or (``callers="processes"``) in processes of their own
  that each import the function (:mod:`smdp_batch.measure.callers`), for the ``--contention`` factors of the
  several-instance model (:func:`contention_summary`).

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

from ..errors import InputError
from ..limits import BMAX_LIMIT
from .worker import (NAME, Run, default_make_batch, energy_source, load_callable, loaded_sources,
                             run_here, run_in_child, synchronize, untrusted_folders, versions)

__all__ = ["measure", "Measurement", "load_callable", "default_make_batch", "check_settings", "module_sources",
           "DEFAULT_SIZES", "REPEATS_MAX", "WARMUP_MAX", "CALLS_MAX", "POWER_MAX_W", "CONCURRENCY_MAX",
           "contention_summary"]

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
REPEATS_MAX = WARMUP_MAX = 100_000  # calls per size
CALLS_MAX = 1_000_000  # timed calls (rows) of one profile
POWER_MAX_W = 1e6
CALLERS = ("threads", "processes")  # where the callers at once run (--callers)
CONCURRENCY_MAX = 8  # callers at once (--concurrency): the instances a contention spec is measured for
#: A measured S_k up to this share above S_{k−1}·k/(k − 1) (k callers serving exactly as many as k − 1: a device
#: that runs one call at a time, plus the threads' overhead) is taken at that bound.
SERIAL_SLACK = 0.02
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
        from ..files import atomic_output, atomic_outputs, current_plan

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
        from ..model.profile import Profile

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


def contention_summary(blocks, levels, energy: bool) -> dict:
    """What the runs with k callers at once (``levels``: (b, k, round spans ns, energy mJ | None)) say against the
    runs alone (``blocks``: (b, times ns, energy mJ | None)): per size and k, the latency factor S_k(b) (the mean
    span of a round of k batches started together over the mean time of one alone: k instances serve k/S_k
    batches per l(b), as the contention model's processor sharing does) and, with energy, E_k(b) (the energy
    per batch over the energy alone);
    and the factors over all sizes (Σ_b of the means at k over Σ_b of the means alone, so the large batches that
    carry a heavy load weigh most) as a ``--contention`` spec.  A factor below 1 (noise: a batch is never faster
    beside others) counts as 1; the spec stops before the first k at which k callers served less than k − 1."""
    from ..specs.contention import Contention

    alone = {int(b): (np.mean(t), (e / len(t)) if e is not None else None) for b, t, e in blocks if len(t)}
    rows: list[dict] = []
    sums: dict[int, list[float]] = {}
    for b, k, t, e in levels:
        if int(b) not in alone or not len(t):
            continue
        m1, e1 = alone[int(b)]
        mk, ek = float(np.mean(t)), ((e / (k * len(t))) if e is not None else None)
        row = {"batch_size": int(b), "callers": int(k), "mean_span_ms": mk / 1e6, "latency_factor": mk / m1}
        if energy and ek is not None and e1:
            row["energy_factor"] = ek / e1
        rows.append(row)
        acc = sums.setdefault(int(k), [0.0, 0.0, 0.0, 0.0])
        acc[0] += mk
        acc[1] += m1
        if energy and ek is not None and e1:
            acc[2] += ek
            acc[3] += e1
    lat, en, note = [1.0], [1.0], ""
    for k in sorted(sums):
        if k != len(lat) + 1:
            break
        sk, top = float(f"{max(sums[k][0] / sums[k][1], 1.0):.4g}"), lat[-1] * k / (k - 1)
        if sk > top * (1 + SERIAL_SLACK):
            note = (f"{k} callers at once served less than {k - 1} ({k}/{sk:.3g} < {k - 1}/{lat[-1]:.3g}): run at most "
                    f"{k - 1} instance{'s' if k > 2 else ''}")
            break
        lat.append(min(sk, _at_most(top)))  # a device that runs one call at a time: S_k = k
        en.append(float(f"{sums[k][2] / sums[k][3]:.4g}") if sums[k][3] > 0 else 1.0)
    spec = Contention(tuple(lat), tuple(en)).spec() if len(lat) > 1 else None
    return {"sizes": rows, "latency": lat, "energy": en if energy else None, "spec": spec, "note": note,
            "spec_by_size": _spec_by_size(rows, len(lat)) if spec else None}


def _at_most(x: float) -> float:
    """The largest number of 4 significant digits ≤ x (a bound rounded up would break the bound)."""
    v = float(f"{x:.4g}")
    if v > x:
        v = float(f"{v - 10.0 ** (math.floor(math.log10(v)) - 3):.4g}")
    return v


def _spec_by_size(rows: list[dict], levels: int) -> str | None:
    """The factors per measured size as a ``B=K:S[:E],…/…`` spec for k = 2..``levels`` (the levels of the spec over
    all sizes): each S_k(b) at least 1 and at most S_{k−1}(b)·k/(k − 1) (k callers never serving less than
    k − 1: a size measured past that bound is taken at it).  None where a size lacks a level."""
    from ..specs.contention import Contention

    by: dict[int, dict[int, dict]] = {}
    for r in rows:
        by.setdefault(r["batch_size"], {})[r["callers"]] = r
    factors = {}
    for b, at in sorted(by.items()):
        if any(k not in at for k in range(2, levels + 1)):
            return None
        lat, en = [1.0], [1.0]
        for k in range(2, levels + 1):
            top = lat[-1] * k / (k - 1)
            lat.append(min(float(f"{max(at[k]['latency_factor'], 1.0):.4g}"), _at_most(top)))
            en.append(float(f"{at[k].get('energy_factor', 1.0):.4g}"))
        factors[b] = Contention(tuple(lat), tuple(en))
    return Contention.by_size(factors).spec() if factors else None


def measure(fn: Callable | str, make_batch: Callable | str | None = None, sizes: Sequence[int] = DEFAULT_SIZES, *,
            warmup: int = 3, repeats: int = 10, budget_s: float | None = None, energy: str = "auto",
            power_w: float | None = None, device_index: int = 0, progress: bool | None = None,
            warn: bool = True, concurrency: int = 1, callers: str = "threads") -> Measurement:
    """Time ``fn(make_batch(b))`` at each size (see the module doc); returns the :class:`Measurement`.

    ``fn`` and ``make_batch`` are callables or ``"module:function"`` names (both names, or a name and
    ``make_batch=None`` for :func:`default_make_batch`: measured in a child process).  ``energy``: ``auto``
    (NVML, then zeus, else none), ``nvml``, ``zeus`` or ``none``; ``power_w`` instead gives ζ = power_w·latency.
    ``progress``: a tqdm bar (None: on a terminal only).  ``warn``: log a failure that stopped the run.
    ``concurrency`` K (1..:data:`CONCURRENCY_MAX`): after each size alone, the same size with k = 2..K callers at
    once, each on its own batch; the rows stay the runs alone, and ``meta["concurrency"]`` holds the factors
    (:func:`contention_summary`).  ``callers``: ``threads`` (instances in one server process: Triton's ONNX
    Runtime, TensorRT and PyTorch backends) or ``processes`` (each caller imports ``fn`` in a process of its own:
    Triton's Python-backend instances, Ray Serve's replicas, and any code that holds the GIL); processes need
    ``fn`` named ``"module:function"``.
    """
    sizes, warmup, repeats, budget_s, power_w = check_settings(sizes, warmup, repeats, budget_s, power_w)
    if isinstance(concurrency, bool) or not isinstance(concurrency, (int, np.integer)) \
            or not 1 <= concurrency <= CONCURRENCY_MAX:
        raise InputError(f"concurrency must be an integer from 1 to {CONCURRENCY_MAX} (callers at once), "
                         f"got {concurrency!r}")
    concurrency = int(concurrency)
    if callers not in CALLERS:
        raise InputError(f"callers {callers!r} is unknown; valid: {', '.join(CALLERS)}")
    if callers == "processes" and concurrency == 1:
        raise InputError("callers in processes need a concurrency of 2 or more (--concurrency K: the callers at once "
                         "they are)")
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
    if callers == "processes" and concurrency > 1 and not child:
        raise InputError("callers in processes need the function named module:function (each process imports it) "
                         "on a POSIX system; use callers='threads' for a Python callable")
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
                   "device_index": int(device_index), "progress": bar is not None, "concurrency": concurrency,
                   "callers": callers,
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
            run_here(fn, make, sizes, warmup, repeats, budget_s, counter, sync, run, concurrency)
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
        # the device's power with no call running (a window before the first size and after the last; an energy
        # counter only): what every P̄ of a plan adds while the server waits
        "idle_power_w": (float(np.mean(run.info["idle_power_w"])) if run.info.get("idle_power_w") else None),
        "idle_power_readings_w": run.info.get("idle_power_w", []),
    }
    if concurrency > 1:
        meta["concurrency"] = {"callers": concurrency, "in": callers, "method": (
            "each size again with k = 2..K callers at once, each on its own batch in its own "
            + ("thread" if callers == "threads" else "process (each importing the function)")
            + ", every round started together; S_k(b) = mean span of a round (first start to last end) / mean time alone"
            + (", E_k(b) = energy per batch at k / alone" if source is not None else "")),
            **contention_summary(run.blocks, run.levels, source is not None)}
    return Measurement(batch=np.asarray(batch, dtype=np.int64), latency_ms=np.asarray(lat, dtype=np.float64),
                       energy_mj=np.asarray(en, dtype=np.float64) if has_energy else None, meta=meta,
                       sources=tuple(sources))
