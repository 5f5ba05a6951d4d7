"""What the runtime checks at its edges, and the thread a plain ``infer`` runs in (numpy-free).

* :func:`check_queue_length`, :func:`check_time_ms`, :func:`check_rate`: one-line
  :class:`~smdp_batch.errors.InputError` (a ``ValueError``) naming the bad value and the valid range;
  :func:`check_max_wait_ms`, :func:`check_timeout_s`: the batcher's time options (``ValueError``);
* :func:`batch_results`: what ``infer`` returned, as the batch's results — a sized sequence of the batch's
  length (its length is checked before anything is iterated, so an endless iterator cannot freeze the loop);
* :func:`redecide_delay`: when the batcher asks a policy again (``next_decision_ms``), never sooner than
  ``REDECIDE_MIN_S``, backing off to ``REDECIDE_MAX_S`` while the policy keeps answering "now or earlier";
* :func:`running_infer`, :func:`inside_infer`: a context variable set while ``infer`` runs (in its task, its
  thread and what they start), so that ``close()`` awaited from ``infer`` does not wait for that ``infer``;
* :class:`InferWorker`: a daemon thread that runs a synchronous ``infer`` off the event loop, one call at a
  time.  A call the batcher gives up on (timed out, or ``close(drain=False)``) keeps its thread, which ends
  when the call returns; the next call gets a fresh thread.  Idle threads end after ``IDLE_S`` seconds, and a
  daemon thread never holds the interpreter at exit.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import numbers
import queue
import threading
from collections.abc import Mapping, Set
from typing import Any, Callable, Iterator

from ..errors import InputError
from ..limits import RATE_MAX, RATE_MIN

__all__ = ["check_queue_length", "check_time_ms", "check_rate", "check_max_wait_ms", "check_timeout_s", "real", "call_marked",
           "batch_results", "redecide_delay", "REDECIDE_MIN_S", "REDECIDE_MAX_S", "running_infer", "inside_infer",
           "InferWorker"]

#: The soonest the batcher asks a policy again (s) after ``next_decision_ms``; repeated answers sooner than
#: this (a time in the past, or now) double the step up to ``REDECIDE_MAX_S``, so the batcher never spins.
REDECIDE_MIN_S = 1e-3
REDECIDE_MAX_S = 0.1


def real(x: Any) -> float:
    """float(x) for a real number, with one beyond the float range (an int such as 10**400) as ±inf rather
    than ``OverflowError``; NaN stays NaN.  The caller has checked that x is a ``numbers.Real``."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def check_queue_length(n: Any) -> int:
    """n as an int if it is an integer ≥ 0 (``int`` or a numpy integer); floats, bools, strings raise."""
    if type(n) is not int:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise InputError(f"a queue length must be an integer ≥ 0, got {n!r} ({type(n).__name__})")
        n = int(n)
    if n < 0:
        raise InputError(f"a queue length must be an integer ≥ 0, got {_short(n)}")
    return n


def check_time_ms(t: Any, what: str = "arrival time") -> float:
    """t (ms) as a float if it is a finite real number ≥ 0; NaN, ±inf, negatives, bools, strings raise."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise InputError(f"{what} must be a finite number of ms ≥ 0, got {_short(t)} ({type(t).__name__})")
    x = real(t)
    if not (math.isfinite(x) and x >= 0.0):
        raise InputError(f"{what} must be a finite number of ms ≥ 0, got {_short(t)}")
    return x


def check_rate(lam: Any, name: str = "lam") -> float:
    """An arrival rate (1/ms) in [RATE_MIN, RATE_MAX] = [1e-12, 1e12]: a subnormal rate such as 1e-320 would
    make every waiting bound infinite, and silently switch the safety bound off."""
    x = math.nan if isinstance(lam, bool) or not isinstance(lam, numbers.Real) else real(lam)
    if not (math.isfinite(x) and RATE_MIN <= x <= RATE_MAX):
        raise InputError(f"{name} must be a finite arrival rate in [{RATE_MIN:g}, {RATE_MAX:g}] per ms, got {_short(lam)}")
    return x


def check_max_wait_ms(x: Any) -> float | None:
    """The batcher's ``max_wait_ms`` in seconds: None for ``"auto"``, inf for None or ``math.inf``."""
    if isinstance(x, str) and x == "auto":
        return None
    if x is None or (isinstance(x, numbers.Real) and x == math.inf):
        return math.inf
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and x >= 0 and math.isfinite(real(x)):  # type: ignore[operator]  # numbers.Real declares no >, >= (typeshed)
        return real(x) / 1e3
    raise ValueError(f"max_wait_ms must be 'auto', a finite number ≥ 0 (ms), None or inf; got {_short(x)}")


def check_timeout_s(x: Any, name: str) -> float | None:
    """A timeout in seconds > 0, or None (also for ``math.inf``) for no limit."""
    if x is None or (isinstance(x, numbers.Real) and not isinstance(x, bool) and x == math.inf):
        return None
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(real(x)) and x > 0:  # type: ignore[operator]  # numbers.Real declares no >, >= (typeshed)
        return real(x)
    raise ValueError(f"{name} must be a finite number of seconds > 0, or None for no limit; got {_short(x)}")


def _short(x: Any) -> str:
    """repr(x), cut to 60 characters (an int of 400 digits stays a one-line message)."""
    r = repr(x)
    return r if len(r) <= 60 else f"{r[:40]}…({len(r)} characters)"


def batch_results(out: Any, k: int) -> list:
    """What ``infer`` returned for a batch of k items, as a list of k results.

    ``out`` must be a sized sequence — a list, tuple, numpy array, or any object with ``__len__`` and
    ``__getitem__`` that is not a str, bytes, bytearray, mapping or set — of length k.  Its length is checked
    before anything is iterated, and at most k items are read.  ``TypeError`` (not a sized sequence) or
    ``ValueError`` (the wrong length) otherwise, naming what infer returned."""
    kind = type(out)
    if isinstance(out, (str, bytes, bytearray, Mapping, Set)) or not (
            hasattr(kind, "__len__") and hasattr(kind, "__getitem__")):
        raise TypeError(f"infer returned a {kind.__qualname__}; it must return a sequence of {k} results, one per "
                        "item in order (a list, tuple or array; not a generator, iterator, str, bytes, dict or set)")
    try:
        n = len(out)
    except Exception as exc:  # e.g. a 0-d numpy array
        raise TypeError(f"infer returned a {kind.__qualname__} without a length ({exc}); it must return a "
                        f"sequence of {k} results") from None
    if n != k:
        raise ValueError(f"infer returned {n} results for a batch of {k}")
    results = list(itertools.islice(iter(out), k))
    if len(results) != k:
        raise ValueError(f"infer returned a {kind.__qualname__} of length {k} that holds only {len(results)} items")
    return results


def redecide_delay(t_ms: Any, now_s: float, soon: int) -> tuple[float | None, int]:
    """(seconds until the policy's re-decision time ``t_ms``, or None for none; the new ``soon``).

    ``soon`` counts the answers in a row that were less than ``REDECIDE_MIN_S`` ahead (in the past, now, or
    just after): such an answer waits ``REDECIDE_MIN_S``·2^soon, at most ``REDECIDE_MAX_S``.  None, NaN, ±inf,
    a non-number, or an int beyond the float range: no re-decision."""
    if t_ms is None or isinstance(t_ms, bool) or not isinstance(t_ms, numbers.Real):
        return None, 0
    t = real(t_ms)
    if not math.isfinite(t):
        return None, 0
    d = t / 1e3 - now_s
    if d >= REDECIDE_MIN_S:
        return d, 0
    return min(REDECIDE_MIN_S * 2.0 ** soon, REDECIDE_MAX_S), min(soon + 1, 32)


_IN_INFER: contextvars.ContextVar[tuple] = contextvars.ContextVar("smdp_batch_in_infer", default=())


@contextlib.contextmanager
def running_infer(owner: Any) -> Iterator[None]:
    """Mark the current context as running ``owner``'s infer (tasks and threads it starts inherit the mark)."""
    token = _IN_INFER.set(_IN_INFER.get() + (owner,))
    try:
        yield
    finally:
        _IN_INFER.reset(token)


def inside_infer(owner: Any) -> bool:
    """True when called (directly or through tasks it started) from ``owner``'s running infer."""
    return any(o is owner for o in _IN_INFER.get())


def call_marked(owner: Any, fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)`` with the context marked as ``owner``'s infer (for the worker thread)."""
    with running_infer(owner):
        return fn(arg)


class InferWorker:
    """Runs ``fn(arg)`` calls in one daemon thread; each call's outcome arrives on an asyncio future as
    ``(True, result)`` or ``(False, exception)`` (every ``BaseException`` is carried, none escapes the thread)."""

    IDLE_S = 5.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, loop, fn: Callable[[Any], Any], arg: Any):
        """Queue one call; returns a future of ``loop`` with its outcome."""
        fut = loop.create_future()
        with self._lock:
            self._jobs.put((loop, fut, fn, arg))
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="smdp-batch-infer", daemon=True)
                self._thread.start()
        return fut

    def _main(self) -> None:
        while True:
            try:
                loop, fut, fn, arg = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            try:
                outcome = (True, fn(arg))
            except BaseException as exc:  # noqa: BLE001 - carried to the event loop, which decides
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(_deliver, fut, outcome)
            except RuntimeError:  # the loop has closed: nobody waits for this outcome any more
                pass
            del loop, fut, fn, arg, outcome


def _deliver(fut, outcome) -> None:
    if not fut.done():
        fut.set_result(outcome)
