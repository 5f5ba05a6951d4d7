"""A lower-priority child process that runs the Autopilot's solves, so a solve never slows the serving process.

Why a process: a re-solve (the SLO optimiser: policy iteration and a simulation, 0.5–2 s of CPU) run in a
thread of the serving process holds that process's GIL inside its numba kernels and takes a share of the
cores equal to the model's.  The batches then take longer, and the Autopilot reads the stretched batch times
as a service change and solves again.  A child process started with a lower CPU priority (``nice`` +10 by
default, and on Linux the SCHED_IDLE class: CPU time no normal process wants) leaves the server its GIL and, when
the cores are busy, their time; the Autopilot also leaves batches that ran beside a solve out of l̂(b).  A solve past its
budget is ended by killing the child (a thread cannot be stopped), and the next solve starts a new one.

The child runs ``python -m smdp_batch.autopilot.solve_process NICE`` with the parent's ``sys.path`` as its
``PYTHONPATH``, in a session of its own (a terminal's Ctrl-C reaches the server, which then closes it).  It
reads length-prefixed pickles ``(function, args)`` on stdin and answers ``(ok, value)`` on a copy of its
stdout; its own stdout and stderr go to the parent's stderr.  The pickles pass between this process and its
own child only.  It exits when its stdin closes (the parent closed it, or died), and on Linux it is killed when
the parent dies even in the middle of a solve (``PR_SET_PDEATHSIG``), so a server killed with SIGKILL leaves
no solve running.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
import weakref
from typing import Any, Callable

__all__ = ["SolveProcess", "SolveProcessError", "open_process", "python_executable", "warm"]

_HEADER = struct.Struct("<Q")
_MAX_MESSAGE = 256 << 20  # 256 MiB: a plan is a few kB; anything larger is a broken pipe


class SolveProcessError(RuntimeError):
    """The child could not start, died, was killed, or the call raised in it (the message says which)."""


def python_executable() -> str | None:
    """This interpreter's executable, also inside an embedding host (Triton's Python backend stub), or None."""
    cands = [sys.executable, getattr(sys, "_base_executable", ""),
             os.path.join(sys.exec_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"),
             os.path.join(sys.exec_prefix, "bin", "python3")]
    for c in cands:
        if c and os.path.basename(c).startswith("python") and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _read(stream) -> bytes | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(head)
    if n > _MAX_MESSAGE:
        return None
    data = stream.read(n)
    return data if len(data) == n else None


def _write(stream, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _kill(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass


class SolveProcess:
    """One child process that runs ``call(function, *args)`` at a lower CPU priority (module docstring).

    ``nice``: the child's niceness increment (0–19); ``warm``: module names the child imports as soon as it
    starts (so the first call does not pay for them).  Calls are serialised; ``kill()`` (from any thread)
    ends the child, and a call waiting on it raises :class:`SolveProcessError`; the next call starts a new
    child.  ``close()`` ends it for good.
    """

    def __init__(self, nice: int = 10, warm: tuple[str, ...] = ()):
        if not (isinstance(nice, int) and not isinstance(nice, bool) and 0 <= nice <= 19):
            raise ValueError(f"nice must be an integer in 0..19, got {nice!r}")
        self.nice, self.warm = nice, tuple(warm)
        self.python = python_executable()
        self._proc: subprocess.Popen | None = None
        self._call_lock = threading.Lock()
        self._proc_lock = threading.Lock()
        self._closed = False
        self._kills = 0  # a call queued behind a kill is not started
        self.starts = 0
        self._finalizer = weakref.finalize(self, _kill_box, [None])  # also runs at interpreter exit

    @property
    def pid(self) -> int | None:
        p = self._proc
        return p.pid if p is not None and p.poll() is None else None

    def start(self) -> None:
        """Start the child now (if not running) and have it import ``warm``; returns without waiting."""
        with self._proc_lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen:
        if self._closed:
            raise SolveProcessError("the solve process is closed")
        if self.python is None:
            raise SolveProcessError("no Python executable found to start a solve process")
        p = self._proc
        if p is not None and p.poll() is None:
            return p
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in sys.path if x), **{PARENT_ENV: str(os.getpid())})
        try:
            p = subprocess.Popen([self.python, "-m", "smdp_batch.autopilot.solve_process", str(self.nice), *self.warm],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env,
                                 start_new_session=True, close_fds=True)
        except OSError as exc:
            raise SolveProcessError(f"could not start a solve process: {exc}") from exc
        self._proc = p
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_box, [p])
        self.starts += 1
        return p

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the child (both picklable); its result, or :class:`SolveProcessError`."""
        try:
            data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - anything pickle raises
            raise SolveProcessError(f"cannot send the call to the solve process: {exc!r}"[:300]) from exc
        kills = self._kills
        with self._call_lock:
            with self._proc_lock:
                if self._kills != kills:
                    raise SolveProcessError("the solve process was killed before the call started")
                p = self._ensure()
            try:
                assert p.stdin is not None and p.stdout is not None
                _write(p.stdin, data)
                reply = _read(p.stdout)
            except (OSError, ValueError) as exc:
                reply = None
                err: Exception | None = exc
            else:
                err = None
            if reply is None:
                _kill(p)
                raise SolveProcessError(f"the solve process ended during the call (exit {p.poll()})"
                                        + (f": {err}" if err else ""))
            try:
                ok, value = pickle.loads(reply)
            except Exception as exc:  # noqa: BLE001
                raise SolveProcessError(f"unreadable reply from the solve process: {exc!r}"[:300]) from exc
        if not ok:
            raise SolveProcessError(f"the solve raised: {value}")
        return value

    def kill(self) -> None:
        """End the child now (the call running and any queued behind it raise); the next call starts a new one."""
        self._kills += 1
        _kill(self._proc)

    def close(self) -> None:
        """End the child for good."""
        self._closed = True
        p = self._proc
        if p is not None and p.poll() is None:
            try:
                if p.stdin is not None:
                    p.stdin.close()  # the child exits when its stdin closes
                p.wait(timeout=1.0)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        _kill(p)

    def __repr__(self) -> str:
        return f"<SolveProcess pid {self.pid} nice +{self.nice}>"


def warm(proc: SolveProcess, solver: Callable[..., Any], args: tuple) -> None:
    """One solve in a new child, so that its imports and compiled kernels are loaded before a change needs them."""
    try:
        proc.call(solver, *args)
    except Exception:  # noqa: BLE001 - a failed warm-up only means the first re-solve loads them
        pass


def open_process(solver: Callable[..., Any], nice: int, warm_args: tuple | None = None) -> SolveProcess:
    """A started solve process for ``solver`` (ValueError when it cannot be pickled; :class:`SolveProcessError` when
    the child does not start); with ``warm_args``, one solve on them in the background loads its kernels now."""
    try:
        pickle.dumps(solver)
    except Exception as exc:  # noqa: BLE001 - anything pickle raises
        raise ValueError(f"solve_in='process' needs a picklable solver (a module-level function): {exc}") from exc
    proc = SolveProcess(nice, warm=("smdp_batch.analysis.slo",))
    proc.start()
    if warm_args is not None:
        threading.Thread(target=warm, args=(proc, solver, warm_args), name="smdp-autopilot-warm", daemon=True).start()
    return proc


def _kill_box(box: list) -> None:
    _kill(box[0])


#: The environment variable that names the serving process to the solve child (whose death ends the child).
PARENT_ENV = "SMDP_BATCH_SOLVE_PARENT"


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when its parent dies (and at once if it has died already)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:  # noqa: BLE001 - not Linux: stdin's EOF still ends it between solves
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(0)


def _idle_class() -> bool:
    """Move this process to Linux's SCHED_IDLE class: it then runs only on CPU time no normal process wants, so
    a solve takes nothing from a busy server (nice +10 still took about a tenth of a core from it).  On a host
    whose cores the server keeps busy, a solve may then run past its budget and be retried later: serving wins.
    False where the class does not exist (not Linux)."""
    if not (hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE")):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return True
    except OSError:
        return False


def _main(argv: list[str]) -> int:
    _die_with_parent(int(os.environ.get(PARENT_ENV, os.getppid())))
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # prints of the solver go to stderr, not into the replies
    sys.stdout = sys.stderr
    try:
        os.nice(int(argv[0]) if argv else 10)
    except (OSError, ValueError):
        pass
    _idle_class()
    for mod in argv[1:]:
        try:
            __import__(mod)
        except Exception:  # noqa: BLE001 - the call itself will say what is missing
            pass
    inp = sys.stdin.buffer
    while True:
        msg = _read(inp)
        if msg is None:
            return 0
        try:
            fn, args = pickle.loads(msg)
            reply: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, the child goes on
            reply = (False, f"{type(exc).__name__}: {exc}"[:500])
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            data = pickle.dumps((False, f"the result cannot be sent back: {exc!r}"[:500]))
        try:
            _write(out, data)
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
