"""Ray Serve: a table-driven ``@serve.batch`` and a time-scaled stub deployment, run on a local 127.0.0.1 cluster.

* :func:`table_batch` is a decorator with ``@serve.batch``'s calling convention: the decorated ``async def
  f(self, items: list) -> list`` (or a plain function) is called as ``await f(item)``; the batches are formed
  by a :class:`~smdp_batch.runtime.DynamicBatcher` following the policy table (decision epochs of paper 004:
  an arrival to an idle batcher, a batch ending).  One batcher per instance and event loop.  It needs no Ray.
* :func:`stub_deployment` builds a Ray Serve deployment whose batch of b sleeps l(b)·scale (asyncio) and
  records (b, start, end); its batching is either the table (``table_batch``) or Ray's own ``serve.batch``
  with the settings ``smdp-batch export --to ray`` writes.  ``max_ongoing_requests`` is raised to 10 000:
  Ray's default (5 in Ray 2.60) caps how many requests reach a replica, and so the batch size.
* :func:`autopilot_deployment` builds a deployment whose batches are formed by an
  :class:`~smdp_batch.autopilot.pilot.Autopilot` (``table_batch(autopilot=...)``) living in the replica; it
  answers ``(request id, batch size)`` and reports the Autopilot's metrics and its batch log to the driver.
* :class:`RayServe` starts Ray (``num_cpus`` bounded, no dashboard) in its single-machine mode, so every Ray
  process binds 127.0.0.1 only (a test lists their sockets), and Serve with no HTTP proxy; requests go through
  a DeploymentHandle from the driver.  The replica records when
  each request entered it, so the arrival stream compared with the simulator is the one the batcher saw.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
import os
import time
from typing import Any, Callable

import numpy as np

from ..autopilot.report import EventLog
from ..errors import InputError
from ..extras import require
from ..runtime import DynamicBatcher

__all__ = ["table_batch", "stub_deployment", "autopilot_deployment", "RayServe", "run_load"]


def table_batch(table=None, max_wait_ms="auto", *, autopilot=None, lam: float | None = None,
                short_batch: str = "serve", pad_item: Any = None, batch_timeout_s: float | str | None = "default",
                served: bool = True):
    """``@serve.batch``'s calling convention, batches formed by ``table`` (a PolicyTable, a PhasePolicy, a path to
    either kind of table, a callable) or by ``autopilot`` (an :class:`~smdp_batch.autopilot.pilot.Autopilot`).

    Works on methods (``async def handle(self, items)``, called as ``await obj.handle(item)``) and on plain
    functions; the options are :class:`~smdp_batch.runtime.DynamicBatcher`'s.  With ``autopilot=`` the
    Autopilot is the batcher's table: it decides every batch from its live table and hears of every arrival,
    executed batch (size, seconds, ok) and response time through its hooks; with ``max_wait_ms="auto"`` the
    safety bound follows the live plan's timer.  One Autopilot may serve several instances' batchers.  With
    ``served=True`` it is also told each call's time from the call to its return (``observe_served``: the batch
    end's hand-back through the event loop included); pass False where the caller tells it a wider view of its
    own (the Triton and Ray deployments here: model entry → answer sent).
    """
    from ..runtime import PolicyTable
    from ..runtime.phase import PhasePolicy
    from ..runtime.phase_file import policy_version

    if (table is None) == (autopilot is None):
        raise InputError("table_batch needs exactly one of a table or autopilot=")
    if autopilot is not None:
        if not all(callable(getattr(autopilot, k, None)) for k in ("decide", "observe_arrival", "observe_batch")):
            raise InputError("autopilot= needs an Autopilot (decide, observe_arrival, observe_batch)")
        table = autopilot
    if isinstance(table, str):  # a phase table (schema 2) runs with its phase filter
        table = PhasePolicy.load(table) if policy_version(table) == 2 else PolicyTable.load(table)
    options = dict(lam=lam, short_batch=short_batch, pad_item=pad_item, batch_timeout_s=batch_timeout_s)
    DynamicBatcher(lambda items: items, table, max_wait_ms, **options)  # check the options now, not at the first request

    def wrap(func: Callable):
        batchers: dict = {}

        def batcher_for(owner) -> DynamicBatcher:
            loop = asyncio.get_running_loop()
            key = (id(loop), id(owner))
            hit = batchers.get(key)
            if hit is None or hit[0] is not loop or hit[1] is not owner:
                for k in [k for k, (lp, _, _) in batchers.items() if lp.is_closed()]:
                    del batchers[k]
                infer = func if owner is None else functools.partial(func, owner)
                hit = batchers[key] = (loop, owner, DynamicBatcher(infer, table, max_wait_ms, **options))
            return hit[2]

        tell = getattr(autopilot, "observe_served", None) if served else None

        @functools.wraps(func)
        async def single(*args):
            if len(args) not in (1, 2):
                raise TypeError(f"{func.__name__} takes one request (and self), got {len(args)} arguments")
            owner, item = (args[0], args[1]) if len(args) == 2 else (None, args[0])  # a method: (self, item)
            if tell is None:
                return await batcher_for(owner).submit(item)
            t0 = time.monotonic()
            try:
                return await batcher_for(owner).submit(item)
            finally:
                tell((time.monotonic() - t0) * 1e3)

        single.batcher_for = batcher_for  # type: ignore[attr-defined]  # a function attribute
        return single

    return wrap


def stub_deployment(name: str, latency_ms: dict, scale: float, *, table=None, max_wait_ms: float | None = None,
                    serve_batch: tuple[int, float] | None = None, pad_to: dict | None = None, onnx_path: str = ""):
    """A Ray Serve application: a stub model batched by ``table`` or by ``serve.batch(max, timeout_s)``.

    ``onnx_path``: the batch runs this ONNX model on pad(b) rows on the CPU (one ONNX Runtime thread, in a
    worker thread so that the replica's event loop keeps taking requests) instead of sleeping l(b)·scale.

    ``latency_ms``: l(b) in model ms per executed size; ``pad_to[b]``: the size a batch of b executes as.
    ``serve_batch`` is in model seconds (× scale here).  ``max_wait_ms`` (model ms) is the table's safety
    bound (× scale).  Calls return (entered, b, executed size, start, end, position in the batch), times in
    ``time.time()`` seconds.
    """
    serve = require("ray.serve", "stub_deployment")

    if (table is None) == (serve_batch is None):
        raise InputError("stub_deployment needs exactly one of table= or serve_batch=")
    lat = {int(k): float(v) for k, v in latency_ms.items()}
    pad = {int(k): int(v) for k, v in (pad_to or {}).items()}
    scale = float(scale)
    policy = None if table is None else np.asarray(table.policy)
    sizes = None if table is None else list(table.batch_sizes)
    wait = None if max_wait_ms is None else float(max_wait_ms) * scale

    @serve.deployment(name=name, num_replicas=1, max_ongoing_requests=10_000, ray_actor_options={"num_cpus": 0})
    class Stub:
        def __init__(self):
            self.log: list = []
            session = name = rows = None
            if onnx_path:
                from .triton_stub_model import onnx_session

                session, name, rows = onnx_session(onnx_path, set(pad.values()) | set(lat))

            async def run_batch(items: list) -> list:
                b = len(items)
                t0 = time.time()
                if session is not None:
                    await asyncio.to_thread(session.run, None, {name: rows[:pad.get(b, b)]})
                else:
                    await asyncio.sleep(lat[pad.get(b, b)] * scale / 1000.0)
                t1 = time.time()
                self.log.append((b, pad.get(b, b), t0, t1))
                return [(t, b, pad.get(b, b), t0, t1, k) for k, t in enumerate(items)]

            if policy is not None:
                from ..runtime import PolicyTable

                self.batched = table_batch(PolicyTable(policy, sizes), max_wait_ms=wait)(run_batch)
            else:
                self.batched = serve.batch(max_batch_size=int(serve_batch[0]),
                                           batch_wait_timeout_s=float(serve_batch[1]) * scale)(run_batch)

        async def __call__(self, _x=None):
            return await self.batched(time.time())

        def batches(self) -> list:
            return list(self.log)

    return Stub.bind()  # type: ignore[attr-defined]  # added by serve.deployment


def autopilot_deployment(name: str, make: Callable[[], tuple], *, max_wait_ms: float | str | None = "auto",
                         serve_batch: tuple[int, float] | None = None, num_cpus: float = 0, live_knobs: bool = False):
    """A Ray Serve application whose batches an Autopilot forms, built in the replica by ``make()``.

    ``make()`` returns ``(infer, policy)``: ``infer(items) -> list`` (async, or sync: then run in a worker
    thread so the replica's event loop keeps taking requests) and the policy, built in the replica (so an
    Autopilot's first solve and its solver threads run there): an Autopilot (``table_batch(autopilot=...)``),
    any other table ``table_batch`` takes (a PolicyTable, a λ-bank AdaptivePolicy), or None with
    ``serve_batch=(max_batch_size, batch_wait_timeout_s)``: Ray's own ``serve.batch`` (for comparisons).
    ``live_knobs=True``: Ray's own ``serve.batch`` forms the batches, at max batch Bmax, and the Autopilot
    (``family="ray"``) sets its ``batch_wait_timeout_s`` live: the timer in force (the live plan's × the closed
    loop's multiplier) is applied after each batch and arrival where it changed (``set_batch_wait_timeout_s``: an
    attribute write that the next batch reads; no restart, no request lost); the Autopilot hears of every arrival,
    every batch of a size it plans with (Ray forms any size ≤ Bmax; the others teach l̂(b) nothing, as with
    DynamicBatcher) and the replica's entry → answer times.
    A call ``handle.remote(i, x)`` returns ``(i, b, output)``, b the size of the batch that served it.
    ``handle.metrics.remote()`` returns the Autopilot's metrics as a dict (after waiting up to 30 s for a
    solve in flight; None for another policy); ``handle.batches.remote()`` the (b, start, end)
    ``time.time()`` seconds of every batch; ``handle.autopilot_events.remote()`` the Autopilot's event lines
    (swaps, rollbacks, failures: the JSON lines it logs on the ``smdp_batch`` logger, the latest 1000).  The
    Autopilot judges each request's replica entry → answer time, or, once a client calls
    ``handle.observe_client.remote(ms_list)`` with the times it measured, those instead.  Beside each time it is
    told the request's batcher view (replica entry → its batch's end), and learns their difference, the outside
    delay, per load (``Autopilot.observe_served(ms, batch_ms)``): from the replica's record, the hand-back alone;
    from a client that names its requests (``observe_client.remote(ms_list, ids)``, the ids it called with), every
    leg through the handle and Ray's router as well.
    """
    import dataclasses
    import inspect

    from ..autopilot.hooks import served_hook

    serve = require("ray.serve", "autopilot_deployment")

    @serve.deployment(name=name, num_replicas=1, max_ongoing_requests=10_000, ray_actor_options={"num_cpus": num_cpus})
    class AutopilotModel:
        def __init__(self):
            self.events = EventLog()
            infer, self.pilot = make()
            self.log: list = []
            self.served: collections.deque = collections.deque(maxlen=200_000)
            self.tell, self.pairs = served_hook(self.pilot)
            self.views: dict = {}  # request id → its batcher view (ms), for a client's times told with their ids
            self.knob_changes, self.timeout_ms = 0, math.nan  # live_knobs: timeouts set on Ray's batcher; the last
            self.client_told = False  # whether the client tells its own times (observe_client)
            is_async = inspect.iscoroutinefunction(infer)

            async def run_batch(items: list) -> list:
                t0 = time.time()
                xs = [x for _, x in items]
                out = await infer(xs) if is_async else await asyncio.to_thread(infer, xs)
                t1 = time.time()
                self.log.append((len(items), t0, t1))
                return [(i, len(items), y, t1) for (i, _), y in zip(items, out)]  # the batch's end: __call__'s

            async def run_knobs(items: list) -> list:  # Ray's batch, told to the Autopilot; then its timer applied
                t0, ok = time.monotonic(), False
                try:
                    out = await run_batch(items)
                    ok = True
                    return out
                finally:
                    if len(items) in sizes:  # a size the profile has (Ray forms any size ≤ Bmax; as DynamicBatcher)
                        self.pilot.observe_batch(len(items), time.monotonic() - t0, ok)
                    self.apply()

            if live_knobs:
                plan = getattr(self.pilot, "plan", None)
                if plan is None or plan.table.meta.get("family") != "ray":
                    raise InputError("live_knobs=True needs an Autopilot planning Ray's batcher (family='ray')")
                sizes = set(self.pilot.batch_sizes)
                self.timeout_ms = float(self.pilot.max_wait_ms)
                self.batched = serve.batch(max_batch_size=max(sizes), batch_wait_timeout_s=self.timeout_ms / 1e3)(run_knobs)
            elif self.pilot is None:
                if serve_batch is None:
                    raise InputError("autopilot_deployment: make() gave no policy and serve_batch= is not set")
                self.batched = serve.batch(max_batch_size=int(serve_batch[0]),
                                           batch_wait_timeout_s=float(serve_batch[1]))(run_batch)
            elif hasattr(self.pilot, "observe_batch"):
                self.batched = table_batch(autopilot=self.pilot, max_wait_ms=max_wait_ms, served=False)(run_batch)
            else:
                self.batched = table_batch(self.pilot, max_wait_ms=max_wait_ms)(run_batch)

        def apply(self) -> None:
            """The Autopilot's timer in force onto Ray's batcher, where it changed (``live_knobs``)."""
            t = self.pilot.max_wait_ms
            if t is not None and t != self.timeout_ms:
                self.batched.set_batch_wait_timeout_s(float(t) / 1e3)
                self.timeout_ms, self.knob_changes = float(t), self.knob_changes + 1

        async def __call__(self, i, x=None):
            t_in = time.time()
            if live_knobs:
                self.pilot.observe_arrival(time.monotonic() * 1e3)
                self.apply()
            i, b, y, t_end = await self.batched((i, x))
            t_out = time.time()
            self.served.append((i, t_in, t_out))
            if self.tell is None:
                return i, b, y
            view = (t_end - t_in) * 1e3  # the batcher's view: replica entry → batch end
            if self.pairs and _hashable(i):  # kept for the client's time of this request (observe_client)
                self.views[i] = view
                if len(self.views) > _VIEWS_KEPT:  # the oldest goes (dicts keep insertion order)
                    del self.views[next(iter(self.views))]
            if not self.client_told:  # the replica's record, entry → answer, and beside it the batcher's view
                self.tell((t_out - t_in) * 1e3, batch_ms=view)
            return i, b, y

        def observe_client(self, ms: list, ids: list | None = None) -> None:
            """Response times the client measured (ms, send → answer): from the first call on they are the
            Autopilot's responses instead of the replica's own record (``observe_served``).  ``ids``: the request
            ids the client called with, one per time: each time is then told beside that request's batcher view
            (replica entry → batch end, kept for the latest 20 000 requests answered), so that the outside delay
            learned takes in the client's legs."""
            if self.tell is None:
                return
            self.client_told = True
            if ids is None or not self.pairs:
                self.tell(ms)
                return
            if len(ids) != len(ms):
                raise InputError(f"observe_client: {len(ms)} times and {len(ids)} ids; give one id per time")
            for t, i in zip(ms, ids):
                self.tell(t, batch_ms=self.views.pop(i, None) if _hashable(i) else None)

        def served_times(self) -> list:
            """(request id, entered, answered) in ``time.time()`` s, the latest 200 000: the server's view."""
            return list(self.served)

        async def metrics(self) -> dict | None:
            if not hasattr(self.pilot, "join"):
                return None
            await asyncio.to_thread(self.pilot.join, 30.0)
            if live_knobs:  # a solve that ended in the wait swapped the plan: its timer goes onto Ray's batcher now,
                self.apply()  # not at the next arrival, so that the knob reported is the one in force
            extra = {"batch_wait_timeout_ms": self.timeout_ms, "knob_changes": self.knob_changes} if live_knobs else {}
            return {**dataclasses.asdict(self.pilot.metrics), **extra}

        def batches(self) -> list:
            return list(self.log)

        def autopilot_events(self) -> list:
            return self.events.lines()

    return AutopilotModel.bind()  # type: ignore[attr-defined]  # added by serve.deployment


#: Batcher views an autopilot deployment keeps for a client's times told with their request ids (the latest).
_VIEWS_KEPT = 20_000


def _hashable(x: Any) -> bool:
    """Whether a request id can key the batcher views (a list cannot; its time is then told alone)."""
    try:
        hash(x)
    except TypeError:
        return False
    return True


#: Ray's switch for its single-machine mode: with it off, every Ray process takes 127.0.0.1 as the node's address
#: and binds its servers there (GCS, raylet, agents, Serve's controller).  Ray (2.60) turns an explicit
#: ``_node_ip_address="127.0.0.1"`` into the machine's address, and then listens on 0.0.0.0 and ::.
_RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayServe:
    """``with RayServe(num_cpus=2) as rs:`` — Ray and Serve without HTTP, every socket on 127.0.0.1 (Ray's
    single-machine mode: its processes inherit the setting); shut down on exit."""

    def __init__(self, num_cpus: int = 2):
        self.num_cpus = int(num_cpus)
        self._saved: tuple[str | None, Any] = (None, None)

    def __enter__(self) -> "RayServe":
        self._saved = (os.environ.get(_RAY_CLUSTER_ENV), None)
        os.environ[_RAY_CLUSTER_ENV] = "0"  # read by Ray's processes when they start: loopback only
        ray, serve = require("ray", "RayServe"), require("ray.serve", "RayServe")
        from ray._private import ray_constants  # read once at import: this process may have imported ray before

        self._saved = (self._saved[0], ray_constants.ENABLE_RAY_CLUSTER)
        ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        serve.start(proxy_location="Disabled")
        return self

    def deploy(self, app, name: str):
        from ray import serve

        return serve.run(app, name=name, route_prefix=None)

    def delete(self, name: str) -> None:
        from ray import serve

        serve.delete(name)

    def __exit__(self, *exc) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            env, flag = self._saved
            if env is None:
                os.environ.pop(_RAY_CLUSTER_ENV, None)
            else:
                os.environ[_RAY_CLUSTER_ENV] = env
            if flag is not None:
                from ray._private import ray_constants

                ray_constants.ENABLE_RAY_CLUSTER = flag


def run_load(handle, arrivals_ms, scale: float, max_seconds: float = 60.0):
    """Replay ``arrivals_ms`` (model ms) through ``handle``; a :class:`~.loadgen.Run` on the replica's clock.

    The arrival times are when requests entered the replica; latency is entry → batch end (model ms).
    ``notes["overhead_ms"]``: mean (driver sent → replica entry) + (batch end → driver answered), model ms.
    The client's view, in the run's order and on its clock: ``notes["sent_ms"]`` (when the driver sent each),
    ``notes["client_ms"]`` (sent → answered, model ms), ``notes["position"]`` (its place in its batch, −1:
    unanswered); ``notes["lag_ms"]``: how late each was sent against its schedule (real ms, sending order).
    """
    from .loadgen import Run, replay, send_lag_ms

    async def main():
        async def send(i: int):
            return await handle.remote(i)

        t0 = time.perf_counter()
        out = await replay(send, arrivals_ms, scale, max_seconds)
        return out + (time.perf_counter() - t0,)

    sent, done, results, errors, wall = asyncio.run(main())
    n = sent.size
    entered = np.full(n, np.nan)
    end = np.full(n, np.nan)
    batch_of = np.full(n, -1, dtype=np.int64)
    keys: dict = {}
    batches, times = {}, {}
    position = np.full(n, -1, dtype=np.int64)
    for i, r in enumerate(results):
        if r is None:
            continue
        t, b, size, t0, t1, position[i] = r
        entered[i], end[i] = t, t1
        k = keys.setdefault(round(t0, 6), len(keys))
        batch_of[i] = k
        batches[k] = (b, size)
        times[k] = (t0, t1)
    order = np.argsort(np.where(np.isfinite(entered), entered, np.inf), kind="stable")
    base = np.nanmin(entered)
    to_ms = lambda t: (t - base) * 1000.0 / scale  # noqa: E731
    run = Run(to_ms(entered[order]), (end - entered)[order] * 1000.0 / scale, batch_of[order], batches,
              errors=errors, wall_s=wall, batch_times={k: (to_ms(a), to_ms(b)) for k, (a, b) in times.items()})
    run.notes["overhead_ms"] = float(np.nanmean((entered - sent) + (done - end)) * 1000.0 / scale)
    run.notes["sent_ms"], run.notes["client_ms"] = to_ms(sent[order]), (done - sent)[order] * 1000.0 / scale
    run.notes["position"], run.notes["lag_ms"] = position[order], send_lag_ms(sent, arrivals_ms, scale)
    return run
