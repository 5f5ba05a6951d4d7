"""What the runtime checks at its edges, and the thread a plain ``infer`` runs in (numpy-free).

* :func:`check_queue_length`, :func:`check_time_ms`, :func:`check_rate`: one-line
  :class:`~smdp_batch.errors.InputError` (a ``ValueError``) naming the bad value and the valid range;
  :func:`check_max_wait_ms`, :func:`check_timeout_s`: the batcher's time options (``ValueError``);
* :class:`InferWorker`: a daemon thread that runs a synchronous ``infer`` off the event loop, one call at a
  time.  A call the batcher gives up on (timed out, or ``close(drain=False)``) keeps its thread, which ends
  when the call returns; the next call gets a fresh thread.  Idle threads end after ``IDLE_S`` seconds, and a
  daemon thread never holds the interpreter at exit.
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
from typing import Any, Callable

from ..errors import InputError
from ..limits import RATE_MAX, RATE_MIN

__all__ = ["check_queue_length", "check_time_ms", "check_rate", "check_max_wait_ms", "check_timeout_s", "InferWorker"]


def check_queue_length(n: Any) -> int:
    """n as an int if it is an integer ≥ 0 (``int`` or a numpy integer); floats, bools, strings raise."""
    if type(n) is not int:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise InputError(f"a queue length must be an integer ≥ 0, got {n!r} ({type(n).__name__})")
        n = int(n)
    if n < 0:
        raise InputError(f"a queue length must be an integer ≥ 0, got {n}")
    return n


def check_time_ms(t: Any, what: str = "arrival time") -> float:
    """t (ms) as a float if it is a finite real number ≥ 0; NaN, ±inf, negatives, bools, strings raise."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise InputError(f"{what} must be a finite number of ms ≥ 0, got {t!r} ({type(t).__name__})")
    x = float(t)
    if not (math.isfinite(x) and x >= 0.0):
        raise InputError(f"{what} must be a finite number of ms ≥ 0, got {t!r}")
    return x


def check_rate(lam: Any, name: str = "lam") -> float:
    """An arrival rate (1/ms) in [RATE_MIN, RATE_MAX] = [1e-12, 1e12]: a subnormal rate such as 1e-320 would
    make every waiting bound infinite, and silently switch the safety bound off."""
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not (
            math.isfinite(float(lam)) and RATE_MIN <= float(lam) <= RATE_MAX):
        raise InputError(f"{name} must be a finite arrival rate in [{RATE_MIN:g}, {RATE_MAX:g}] per ms, got {lam!r}")
    return float(lam)


def check_max_wait_ms(x: Any) -> float | None:
    """The batcher's ``max_wait_ms`` in seconds: None for ``"auto"``, inf for None or ``math.inf``."""
    if isinstance(x, str) and x == "auto":
        return None
    if x is None or (isinstance(x, numbers.Real) and x == math.inf):
        return math.inf
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and x >= 0:
        return float(x) / 1e3
    raise ValueError(f"max_wait_ms must be 'auto', a number ≥ 0 (ms), None or inf; got {x!r}")


def check_timeout_s(x: Any, name: str) -> float | None:
    """A timeout in seconds > 0, or None (also for ``math.inf``) for no limit."""
    if x is None or (isinstance(x, numbers.Real) and not isinstance(x, bool) and x == math.inf):
        return None
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x > 0:
        return float(x)
    raise ValueError(f"{name} must be a number of seconds > 0, or None for no limit; got {x!r}")


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
