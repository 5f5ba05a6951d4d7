"""Several callers at once for ``measure --concurrency K``: k callers, each on its own batch, in rounds started
together; what k instances of one model on one device take for k batches.

* :func:`together` — the rounds of one (size, k): ``warmup`` untimed ones, ``repeats`` timed ones, then untimed
  ones while the energy counter waits for its refresh.  A round's span runs from its first call's start to its
  last call's end: a device that runs one call at a time gives a span of k calls alone, where the calls' own
  times would average (k + 1)/2.  The measuring thread is caller 0; the others are
* :class:`Threads` — threads of this process, as a server runs instances of one model in one process (Triton's
  ONNX Runtime, TensorRT and PyTorch backends);
* :class:`Processes` — processes of their own, each importing the function and building its own batch, as
  Triton's Python-backend instances and Ray Serve's replicas run (and the only honest form for code that holds
  the GIL: threads would take turns).  A round starts at a moment of the monotonic clock every process shares
  (``time.perf_counter_ns``: ``CLOCK_MONOTONIC`` on Linux), sent :data:`LEAD_NS` ahead.  The helpers are in
  the measuring process's process group, so the caller's stop at the budget stops them too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .energy import describe

__all__ = ["together", "Threads", "Processes", "CallerFailed", "serve", "LEAD_NS"]

LEAD_NS = 500_000  # a round's start is sent this far ahead to the helper processes: more than a pipe hop (~0.1 ms), and
# short, as the rounds must follow each other as closely as the runs alone do (a core idle for a few ms makes the
# next call up to 2× slower: measured on the example MLP)


def _over(deadline: float, stop: threading.Event | None) -> bool:
    """Whether the calls must stop: the deadline (time.monotonic) passed, or the caller gave up."""
    return time.monotonic() >= deadline or (stop is not None and stop.is_set())


class CallerFailed(Exception):
    """A helper process's call or batch failed (``text`` as :func:`describe` wrote it there), or it died."""

    def __init__(self, text: str, stage: str = "call"):
        super().__init__(text)
        self.text, self.stage = text, stage


def together(own: Callable[[], tuple[int, int]], others, warmup: int, repeats: int, deadline: float, counter,
             sync: Callable[[], None], stop: threading.Event | None) -> tuple[list, float | None, bool]:
    """Rounds of ``own()`` (this thread's timed call, returning its (start, end) in ns) beside ``others`` (a
    :class:`Threads` or :class:`Processes` holding their batches).  Returns (each timed round's span in ns, the
    energy of the timed rounds in mJ or None, whether the deadline cut them); raises what a call raised."""
    spans: list[int] = []
    r, begun, cut, t0, t1 = 0, False, False, 0.0, 0.0
    others.start()
    try:
        while True:
            if r == warmup and counter is not None:
                sync()
                counter.begin()
                begun = True
            if r == warmup:
                t0 = time.perf_counter()
            if r == warmup + repeats:
                t1 = time.perf_counter()
            if r >= warmup + repeats and not (begun and counter.more() and not _over(deadline, stop)):
                break  # past the timed rounds, untimed ones only while the energy reading waits for a refresh
            if _over(deadline, stop):
                cut = True
                break
            times = others.round(own)
            if warmup <= r < warmup + repeats:
                spans.append(max(e for _, e in times) - min(s for s, _ in times))
            r += 1
    finally:
        others.stop()
    block = None
    if begun:
        block = float(counter.end(max(t1 - t0, 0.0) if not cut else sum(spans) / 1e9))
        if not math.isfinite(block):
            raise ValueError(f"the {counter.name} counter read {block}")
    return spans, block, cut


def _timed(fn, data, sync) -> tuple[int, int]:
    sync()
    t0 = time.perf_counter_ns()
    fn(data)
    sync()
    return t0, time.perf_counter_ns()


class Threads:
    """The other callers as threads of this process, each on a batch of its own, rounds started on a barrier."""

    def __init__(self, fn, make, sync):
        self.fn, self.make, self.sync = fn, make, sync
        self.datas: list = []
        self._threads: list[threading.Thread] = []

    def reset(self) -> None:
        self.datas = []

    def add(self, b: int) -> None:
        self.datas.append(self.make(b))

    def start(self) -> None:
        k = len(self.datas) + 1
        self._go, self._done = threading.Barrier(k), threading.Barrier(k)
        self._times: list = [None] * len(self.datas)
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._caller, args=(i,), name=f"smdp-batch caller {i + 1}",
                                          daemon=True) for i in range(len(self.datas))]
        for t in self._threads:
            t.start()

    def _caller(self, i: int) -> None:
        try:
            while True:
                self._go.wait()
                try:
                    self._times[i] = _timed(self.fn, self.datas[i], self.sync)
                except BaseException as e:  # noqa: BLE001 - the user's code: reported as its size's failure
                    self._errors.append(e)
                self._done.wait()
        except threading.BrokenBarrierError:
            return

    def round(self, own) -> list[tuple[int, int]]:
        self._go.wait()
        try:
            mine = own()
        except BaseException:
            self._done.abort()
            raise
        self._done.wait()
        if self._errors:
            raise self._errors[0]
        return [mine, *self._times]

    def stop(self) -> None:
        self._go.abort()  # callers waiting for a round leave
        self._done.abort()
        for t in self._threads:
            while t.is_alive():  # joined in steps: the calling thread stays responsive to signals
                t.join(0.05)
        self._threads = []


class _Lines:
    """JSON lines from a pipe, each awaited until a deadline (time.monotonic), and while the writing process lives.

    The end of the writer is its exit, not the pipe's EOF: a process the measured code forked (a DataLoader
    worker, a multiprocessing pool) inherits the pipe and keeps it open after the writer has died."""

    TIMEOUT = object()
    POLL_S = 0.2  # how often the writer's life is checked while no line comes

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def next(self, deadline: float, writer: subprocess.Popen | None = None):
        """The next line as JSON; None at EOF, at an unreadable line, or once ``writer`` has exited with no line
        left in the pipe; TIMEOUT at the deadline."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return self.TIMEOUT
            ready, _, _ = select.select([self.fd], [], [], min(left, 3600.0 if writer is None else self.POLL_S))
            if not ready and writer is not None and writer.poll() is not None:
                ready, _, _ = select.select([self.fd], [], [], 0)  # what it wrote before it ended
                if not ready:
                    return None
            if ready:
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    return None
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None


def _write(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _until(t_ns: int) -> None:
    """Wait for the moment t_ns of time.perf_counter_ns: sleep to 2 ms before it, then spin."""
    left = (t_ns - time.perf_counter_ns()) / 1e9
    if left > 2e-3:
        time.sleep(left - 2e-3)
    while time.perf_counter_ns() < t_ns:
        pass


def serve(fn, make, sync, lines: _Lines, cout: int) -> None:
    """A helper process's loop: {"make": b} builds its batch, {"at": ns} times one call starting then, until the
    measuring process closes the pipe.  Each answer is {"ok"}, {"t": [start, end]} or {"error", "stage"}."""
    data = None
    while True:
        msg = lines.next(math.inf)
        if not isinstance(msg, dict):
            return
        stage = "make" if "make" in msg else "call"
        try:
            if "make" in msg:
                data = None  # the previous size's batch goes first
                data = make(int(msg["make"]))
                _write(cout, {"ok": True})
            else:
                _until(int(msg["at"]))
                _write(cout, {"t": list(_timed(fn, data, sync))})
        except BaseException as e:  # noqa: BLE001 - the user's code: reported by the measuring process
            data = None
            _write(cout, {"error": describe(e), "stage": stage})


class Processes:
    """The other callers as ``count`` helper processes, each running ``boot`` (which loads the function and
    calls :func:`serve`), started once and kept for every size; ``setup`` (JSON) is their first line."""

    def __init__(self, count: int, boot: list[str], setup: dict):
        self.helpers: list[tuple[subprocess.Popen, int, _Lines]] = []
        self.k = 0  # helpers holding a batch of the current size
        try:
            for _ in range(count):
                cin_r, cin_w = os.pipe()
                out_r, out_w = os.pipe()
                try:
                    proc = subprocess.Popen([sys.executable, "-c", *boot, str(cin_r), str(out_w)],
                                            stdin=subprocess.DEVNULL, pass_fds=(cin_r, out_w))
                finally:
                    os.close(cin_r)
                    os.close(out_w)
                self.helpers.append((proc, cin_w, _Lines(out_r)))
                _write(cin_w, setup)
            for i in range(count):
                self._answer(i, "ready")
        except BaseException:
            self.close()
            raise

    def _answer(self, i: int, what: str) -> dict:
        proc, _, lines = self.helpers[i]
        msg = lines.next(math.inf, proc)
        if not isinstance(msg, dict):
            try:
                rc = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:  # it closed its pipe and lives on: stopped with the others
                raise CallerFailed(f"caller process {i + 1} stopped answering", "call" if what != "make" else "make") from None
            how = (f"was killed by {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.Signals._value2member_map_
                   else f"exited with status {rc}")
            raise CallerFailed(f"caller process {i + 1} {how}", "call" if what != "make" else "make")
        if "error" in msg:
            raise CallerFailed(str(msg["error"]), str(msg.get("stage", "call")))
        return msg

    def reset(self) -> None:
        self.k = 0

    def add(self, b: int) -> None:
        _write(self.helpers[self.k][1], {"make": int(b)})
        self._answer(self.k, "make")
        self.k += 1

    def start(self) -> None:
        pass

    def round(self, own) -> list[tuple[int, int]]:
        at = time.perf_counter_ns() + LEAD_NS
        for _, cin, _ in self.helpers[:self.k]:
            _write(cin, {"at": at})
        _until(at)
        try:
            mine = own()
        except BaseException:
            self.close()  # the helpers' answers are not awaited: the run ends at this failure
            raise
        return [mine, *(tuple(self._answer(i, "call")["t"]) for i in range(self.k))]

    def stop(self) -> None:
        pass

    def close(self) -> None:
        for proc, cin, lines in self.helpers:
            with contextlib.suppress(OSError):
                os.close(cin)  # the helper's loop ends
            with contextlib.suppress(OSError):
                os.close(lines.fd)
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.helpers = []
