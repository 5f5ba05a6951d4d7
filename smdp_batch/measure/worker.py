"""Where ``smdp-batch measure`` runs the user's code (:mod:`smdp_batch.measure` is the API): importing it,
the measuring loop, and the child process that the caller stops at its deadline (the energy counters are
:mod:`smdp_batch.measure.energy`).

* :func:`run_in_child` starts ``python -c`` with the working folder off ``sys.path``, loads this package
  from its own location, imports the energy libraries (installed packages only: :func:`energy_source`
  hides the working folder and the measured module's folder from ``sys.path`` meanwhile), then the
  user's module (its folder on ``sys.path`` for that import only), and runs :func:`_loop`.  Reports are
  JSON lines on a pipe; the caller kills the process group at the deadline, so a call that hangs or
  spins — in Python or in compiled code — is stopped, and what was measured before it is kept.
* :func:`run_here` runs the same loop in this process, for Python callables.
* Whatever the user's code raises — ``MemoryError``, ``SystemExit``, ``KeyboardInterrupt``,
  ``GeneratorExit`` included — ends the run at that size as a failure named in :class:`Run`; a real
  signal to the caller is not swallowed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ..errors import InputError
from .callers import CallerFailed, Processes, Threads, _Lines, _over, _timed, _write, serve, together
from .energy import _real, describe, energy_source, idle_power_w, untrusted_folders
from ..files import Terminated

__all__ = ["load_callable", "default_make_batch", "loaded_sources", "describe", "synchronize", "energy_source",
           "untrusted_folders", "versions", "Run", "run_here", "run_in_child", "NAME", "GRACE_S"]

GRACE_S = 0.5  # after the budget, for a call in flight to return before the worker is stopped
_EXIT_NOMEM = 86  # the child's exit status when even reporting a MemoryError failed
NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: libraries whose version the sidecar records when the measured code has imported them
_LIBRARIES = ("numpy", "onnxruntime", "onnx", "torch", "tensorflow", "jax", "tensorrt", "pynvml", "zeus")


# ------------------------------------------------------------------------------------ user callables
def _on_path(folder: str) -> bool:
    return _real(folder) in {_real(p) for p in sys.path}


def load_callable(spec: str, what: str = "function", folder: str | None = None) -> Callable:
    """``module:attr[.attr…]`` → the callable.  ``folder`` (default: the current one) is searched first for
    the module, and is on ``sys.path`` only while the module is imported."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not NAME.match(module_name) or not NAME.match(attr):
        raise InputError(f"{what} {spec!r} must be written module:function (e.g. examples.onnx_mlp:infer)")
    folder = os.path.abspath(folder or os.getcwd())
    added = not _on_path(folder)
    if added:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise InputError(f"{what} {spec!r}: no module named {e.name!r} (from {folder} or sys.path)") from None
        raise InputError(f"{what} {spec!r}: importing {module_name} failed: {describe(e)}") from None
    except (Exception, SystemExit, GeneratorExit) as e:  # the user's module raised while importing
        raise InputError(f"{what} {spec!r}: importing {module_name} raised {describe(e)}") from None
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{what} {spec!r}: module {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(f"{what} {spec!r} is a {type(obj).__name__}, not callable")
    return obj


def loaded_sources(obj) -> list[str]:
    """The files of an imported callable's module and its packages."""
    name = getattr(obj, "__module__", None)
    if not isinstance(name, str):
        return []
    parts = name.split(".")
    mods = [sys.modules.get(".".join(parts[:i + 1])) for i in range(len(parts))]
    files = [getattr(m, "__file__", None) for m in mods]
    return [os.path.abspath(f) for f in files if isinstance(f, str) and os.path.isfile(f)]


def default_make_batch(b: int) -> list:
    """A list of b items (zeros): for functions that take a list of requests, as ``DynamicBatcher``'s do."""
    return [0.0] * b


# ------------------------------------------------------------------------------------ device and energy
def synchronize() -> Callable[[], None]:
    """``torch.cuda.synchronize`` when the user's code uses torch on CUDA, else nothing to wait for."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.synchronize
    except Exception:  # pragma: no cover - a torch without a working CUDA runtime
        pass
    return lambda: None


def versions() -> dict:
    from .. import __version__

    out = {"python": platform.python_version(), "smdp_batch": __version__}
    for name in _LIBRARIES:
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "unknown"))
    return out


# ------------------------------------------------------------------------------------ the measuring loop
def _loop(fn, make, sizes, warmup, repeats, deadline, counter, sync, send, real=lambda e: False, calls=False,
          stop: threading.Event | None = None, concurrency: int = 1, others=None) -> None:
    """Measure every size, reporting through ``send``: {"begin": b}, {"made": b}, {"calls": 1} (``calls``),
    then {"size": b, "times": [ns…], "energy": mJ|None, "cut": bool}, and at the end {"done": True} or
    {"fail": b, "stage": make|call|energy, "error": text}.  Whatever the user's code raises is a failure of
    its size, except what ``real`` says a signal raised.  ``concurrency`` K > 1: after each size alone, the
    same size with k = 2..K callers at once (:func:`~.callers.together`; ``others``: the other callers,
    :class:`~.callers.Threads` by default), each announced by {"callers": k} and reported as
    {"size": b, "level": k, …} with the rounds' spans as its times."""
    others = others if others is not None or concurrency < 2 else Threads(fn, make, sync)
    if counter is not None:  # the device idle, before any call (an energy counter only)
        send({"idle": idle_power_w(counter, lambda: _over(deadline, stop))})
    for b in sizes:
        send({"begin": b})
        if _over(deadline, stop):
            return send({"size": b, "times": [], "energy": None, "cut": True})  # before building its batch
        stage, times, cut, begun, block, level = "make", [], False, False, None, 1
        try:
            data = make(b)
            stage = "call"
            send({"made": b})
            for k in range(warmup + repeats):
                if _over(deadline, stop):
                    cut = True
                    break
                if k == warmup and counter is not None:
                    sync()
                    counter.begin()
                    begun = True
                t0, t1 = _timed(fn, data, sync)
                if k >= warmup:
                    times.append(t1 - t0)
                if calls:
                    send({"calls": 1})
            while begun and not cut and counter.more() and not _over(deadline, stop):
                fn(data)  # untimed: the energy reading waits for the counter's next refresh
                sync()
            stage = "energy"
            if begun:
                block = float(counter.end(sum(times) / 1e9))
                if not math.isfinite(block):
                    raise ValueError(f"the {counter.name} counter read {block}")
            send({"size": b, "times": times, "energy": block, "cut": cut})
            if others is not None:
                others.reset()
            for level in range(2, concurrency + 1 if not cut else 0):
                stage = "make"
                send({"callers": level})
                others.add(b)  # each caller its own batch
                stage = "call"
                send({"made": b})
                got, energy, cut = together(functools.partial(_timed, fn, data, sync), others, warmup, repeats,
                                            deadline, counter, sync, stop)
                send({"size": b, "level": level, "times": got, "energy": energy, "cut": cut})
                if cut:
                    break
            del data
            if others is not None:
                others.reset()
            if b == sizes[-1] and counter is not None:  # and idle again after the last size
                send({"idle": idle_power_w(counter, lambda: _over(deadline, stop))})
        except BaseException as e:
            if real(e):
                raise
            data = None  # noqa: F841 - drop the batch before reporting (a MemoryError needs the room)
            if others is not None:
                others.reset()
            if isinstance(e, CallerFailed):  # a helper process's failure, as it described it
                stage, text = e.stage, e.text
            else:
                text = describe(e)
            send({"fail": b, "stage": stage, "error": text, "level": level})
            return
        if cut:
            return
    send({"done": True})


@contextlib.contextmanager
def _signal_flag():
    """``real(e)``: e was raised by a SIGINT/SIGTERM handler while the block ran (so it is the caller's, not
    the measured code's).  Only the main thread receives signals; elsewhere nothing is real."""
    hit: list[int] = []
    old: dict = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            h = signal.getsignal(s)
            if callable(h):
                def wrapper(signum, frame, h=h):
                    hit.append(signum)
                    return h(signum, frame)
                old[s] = h
                signal.signal(s, wrapper)
    try:
        yield lambda e: isinstance(e, Terminated) or (bool(hit) and not isinstance(e, Exception))
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ------------------------------------------------------------------------------------ the run's record
class Run:
    """What the loop reported, wherever it ran; and how it stopped."""

    def __init__(self, fn_name: str, sizes, repeats: int, budget_s, bar):
        self.fn_name, self.sizes, self.repeats, self.budget_s, self.bar = fn_name, sizes, repeats, budget_s, bar
        self.blocks: list = []  # (b, times in ns, energy mJ | None)
        self.levels: list = []  # with concurrent callers: (b, k, times in ns, energy mJ | None)
        self.current, self.stage, self.finished, self.level = None, "make", False, 1  # level: callers at once
        self.note, self.failure, self.stopped_at = "", "", None
        self.info: dict = {"libraries": {}, "cuda_sync": False, "sources": []}

    def handle(self, msg: dict) -> None:
        if "libraries" in msg:
            self.info["libraries"] = msg["libraries"]
        if "idle" in msg:
            if msg["idle"] is not None:
                self.info.setdefault("idle_power_w", []).append(float(msg["idle"]))
        elif "begin" in msg:
            self.current, self.stage, self.level = msg["begin"], "make", 1
        elif "callers" in msg:
            self.stage, self.level = "make", int(msg["callers"])
        elif "made" in msg:
            self.stage = "call"
        elif "calls" in msg:
            if self.bar is not None:
                self.bar.update(msg["calls"])
        elif "size" in msg:
            b, times, k = msg["size"], msg["times"], int(msg.get("level", 1))
            if times:
                if k == 1:
                    self.blocks.append((b, times, msg.get("energy")))
                else:
                    self.levels.append((b, k, times, msg.get("energy")))
            if msg.get("cut"):
                self.stopped_at, self.finished = b, True
                with_k = f" with {k} callers at once" if k > 1 else ""
                self.note = (f"time budget of {self.budget_s:g} s ran out at b = {b}{with_k} ({len(times)} of "
                             f"{self.repeats} timed {'rounds' if k > 1 else 'calls'}); sizes "
                             f"{[s for s in self.sizes if s > b] or 'none'} not measured")
        elif "fail" in msg:
            self.current, self.stage, self.level = msg["fail"], msg["stage"], int(msg.get("level", 1))
            err = msg["error"]
            oom = err.startswith("out of memory")
            self._stop(f"out of memory in {self._where()}{err[len('out of memory'):]}" if oom
                       else f"{self._where()} raised {err}")
        elif "crash" in msg:
            self._stop(f"the measurement failed: {msg['crash']}")
        self.finished = self.finished or bool(msg.keys() & {"done", "fail", "crash"})

    def _where(self) -> str:
        where = {"make": f"make_batch({self.current})", "call": self.fn_name}.get(self.stage, "the energy counter")
        return where + (f" with {self.level} callers at once" if self.level > 1 else "")

    def _stop(self, reason: str) -> None:
        b = self.current if self.current is not None else self.sizes[0]
        self.stopped_at, self.failure, self.finished = b, reason, True
        rest = ", ".join(str(s) for s in self.sizes if s > b or (s == b and self.level == 1)) or "none"
        alone = f" (b = {b} was measured alone)" if self.level > 1 else ""
        self.note = f"stopped at b = {b}: {reason}; b = {rest} not measured{alone}"

    def timed_out(self) -> None:
        self._stop(f"{self._where()} timed out after {self.budget_s:g} s, the time budget (it was stopped)")

    def died(self, how: str) -> None:
        self._stop(f"the measuring process {how} in {self._where()}")


def run_here(fn, make, sizes, warmup, repeats, budget_s, counter, sync, run: Run, concurrency: int = 1) -> None:
    """The loop in this process: in the calling thread, or with a budget in a worker thread it can leave."""
    calls = run.bar is not None
    if budget_s is None:
        with _signal_flag() as real:
            _loop(fn, make, sizes, warmup, repeats, math.inf, counter, sync, run.handle, real, calls,
                  concurrency=concurrency)
        return
    box: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()
    deadline = time.monotonic() + budget_s

    def work():
        try:
            _loop(fn, make, sizes, warmup, repeats, deadline, counter, sync, box.put, calls=calls, stop=stop,
                  concurrency=concurrency)
        except BaseException as e:  # only a failure to report: the loop catches the user's code
            box.put({"crash": describe(e)})

    threading.Thread(target=work, name="smdp-batch measure", daemon=True).start()
    try:
        while not run.finished:
            left = deadline + GRACE_S - time.monotonic()
            try:
                msg = box.get(timeout=min(max(left, 0.001), 3600.0))
            except queue.Empty:
                if left <= 0:
                    run.timed_out()
                continue
            run.handle(msg)
    finally:
        stop.set()  # a call still running is abandoned; the loop ends after it returns


# ------------------------------------------------------------------------------------ the child process
_BOOT = """\
import os, sys
os.dup2(2, 1)  # the measured code's prints go to stderr: stdout is the caller's (--json)
if sys.path and sys.path[0] == '':
    del sys.path[0]  # python -c would search the working folder first
import importlib.util as u
p = sys.argv[1]
s = u.spec_from_file_location('smdp_batch', os.path.join(p, '__init__.py'), submodule_search_locations=[p])
m = u.module_from_spec(s); sys.modules['smdp_batch'] = m; s.loader.exec_module(m)
from smdp_batch.measure.worker import ENTRIES
ENTRIES[sys.argv[2]](int(sys.argv[3]), int(sys.argv[4]))
"""


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):  # Linux: die with the caller
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _boot(entry: str) -> list[str]:
    """``python -c`` arguments that load this package from its own folder and run ``ENTRIES[entry]``."""
    return [_BOOT, os.path.dirname(os.path.dirname(os.path.abspath(__file__))), entry]  # smdp_batch/, above measure/


def _import_user(cfg: dict) -> tuple[Callable, Callable]:
    """The function and make_batch that ``cfg`` names (``fn``, ``make_batch``, ``folder``), imported; what the
    import raised becomes an InputError naming the function."""
    try:
        fn = load_callable(cfg["fn"], "function", cfg["folder"])
        make = (load_callable(cfg["make_batch"], "--make-batch", cfg["folder"]) if cfg["make_batch"]
                else default_make_batch)
    except InputError:
        raise
    except BaseException as e:
        raise InputError(f"function {cfg['fn']!r}: importing raised {describe(e)}") from None
    return fn, make


def _exit_quietly() -> None:
    """End a measuring or caller process: flush what the user's code printed, skip the interpreter's teardown."""
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def _child(fd: int, ctl: int) -> None:
    """The measuring process: settings, then "go", as JSON lines on ``ctl``; reports as JSON lines on ``fd``."""
    def send(msg):
        if msg.keys() & {"done", "fail"} or msg.get("cut"):
            msg["libraries"] = versions()
        _write(fd, msg)

    control = os.fdopen(ctl, "r", encoding="utf-8")
    try:
        cfg = json.loads(control.readline())
        _die_with_parent()
        if os.getppid() != cfg["ppid"]:
            return
        sys.path[:] = cfg["path"]
        try:
            counter = energy_source(cfg["energy"], cfg["power_w"], cfg["device_index"], cfg["untrusted"])
            fn, make = _import_user(cfg)
        except InputError as e:
            return send({"error": str(e)})
        except BaseException as e:
            return send({"error": f"function {cfg['fn']!r}: importing raised {describe(e)}"})
        why, counter = (counter, None) if isinstance(counter, str) else ("", counter)
        concurrency, others = int(cfg.get("concurrency", 1)), None
        if cfg.get("callers") == "processes" and concurrency > 1:
            try:
                others = Processes(concurrency - 1, _boot("_helper"),
                                   {k: cfg[k] for k in ("fn", "make_batch", "folder", "path")})
            except CallerFailed as e:
                return send({"error": f"starting the caller processes: {e.text}"})
        sync = synchronize()
        send({"ready": {"libraries": versions(), "cuda_sync": sync.__name__ == "synchronize", "no_counter": why,
                        "sources": loaded_sources(fn) + (loaded_sources(make) if cfg["make_batch"] else []),
                        "counter": None if counter is None else [counter.name, counter.device, counter.note]}})
        go = control.readline()
        if not go:
            return
        budget = json.loads(go)["budget_s"]
        threading.Thread(target=lambda: (control.read(), os._exit(1)), daemon=True).start()  # caller gone: stop
        deadline = time.monotonic() + budget if budget else math.inf
        try:
            _loop(fn, make, cfg["sizes"], cfg["warmup"], cfg["repeats"], deadline, counter, sync, send,
                  calls=cfg["progress"], concurrency=concurrency, others=others)
        finally:
            if others is not None:
                others.close()  # each helper's loop ends and it is waited for
    except MemoryError:
        os._exit(_EXIT_NOMEM)
    except BaseException as e:  # noqa: BLE001 - a report that failed; the caller sees the process end
        with contextlib.suppress(BaseException):
            send({"crash": describe(e)})
    finally:
        _exit_quietly()


def _helper(cin: int, cout: int) -> None:
    """A caller process of ``--callers processes``: the function's settings as a JSON line on ``cin``, then
    ``{"ready": true}`` (or ``{"error": …}``) on ``cout`` and :func:`~.callers.serve`."""
    try:
        _die_with_parent()
        lines = _Lines(cin)
        setup = lines.next(math.inf)
        if not isinstance(setup, dict):
            return
        sys.path[:] = setup["path"]
        try:
            fn, make = _import_user(setup)
        except InputError as e:
            return _write(cout, {"error": str(e)})
        _write(cout, {"ready": True})
        serve(fn, make, synchronize(), lines, cout)
    except MemoryError:
        os._exit(_EXIT_NOMEM)
    finally:
        _exit_quietly()


ENTRIES = {"_child": _child, "_helper": _helper}  # what the boot line may run


def _status(proc: subprocess.Popen) -> str:
    """How the measuring process ended, in words."""
    try:
        rc = proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if rc == _EXIT_NOMEM:
        return "ran out of memory (MemoryError)"
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        return f"was killed by {name}" + (" (out of memory?)" if -rc == signal.SIGKILL else "")
    return f"exited with status {rc}"


def _kill(proc: subprocess.Popen) -> None:
    """End the measuring process and its whole process group: what the measured code forked (a DataLoader worker,
    a pool) lives in that group and may outlive the process itself."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its leader while a forked child is in it
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def run_in_child(cfg: dict, budget_s, run: Run) -> None:
    """The loop in a child process (see _child), stopped at the deadline; fills ``run``."""
    r, w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-c", *_boot("_child"), str(w), str(ctl_r)],
                                stdin=subprocess.DEVNULL, pass_fds=(w, ctl_r), start_new_session=True)
    except OSError as e:
        os.close(r)
        os.close(ctl_w)
        raise InputError(f"cannot start the measuring process: {e.strerror or e}") from None
    finally:
        os.close(w)
        os.close(ctl_r)
    lines, what = _Lines(r), f"{cfg['fn']}" + (f" and {cfg['make_batch']}" if cfg["make_batch"] else "")
    control = os.fdopen(ctl_w, "w", encoding="utf-8")

    def tell(msg: dict) -> None:
        with contextlib.suppress(OSError):  # it ended already: said below
            control.write(json.dumps(msg) + "\n")
            control.flush()

    try:
        tell(cfg)
        msg = lines.next(time.monotonic() + budget_s if budget_s else math.inf, proc)
        if msg is _Lines.TIMEOUT:
            raise InputError(f"importing {what} did not finish within the time budget of {budget_s:g} s; "
                             "nothing was measured")
        if msg is None or "error" in msg or "ready" not in msg:
            raise InputError((msg or {}).get("error")
                             or f"the measuring process {_status(proc)} while importing {what}")
        run.info.update(msg["ready"])
        tell({"budget_s": budget_s})
        end = time.monotonic() + budget_s + GRACE_S if budget_s else math.inf
        while not run.finished:
            msg = lines.next(end, proc)
            if msg is _Lines.TIMEOUT:
                run.timed_out()
            elif msg is None:
                run.died(_status(proc))
            else:
                run.handle(msg)
    finally:
        _kill(proc)
        os.close(r)
        with contextlib.suppress(OSError):
            control.close()
