"""Triton (PyTriton's binary) with an Autopilot-driven DynamicBatcher in front of a model's infer function.

Design.  Triton's dynamic batcher is **off** (``max_batch_size: 0``, no ``dynamic_batching`` block): Triton
hands every request to the model on its own, and the batches are formed in the model process by
:func:`~smdp_batch.integrations.ray_serve.table_batch` ``(autopilot=...)`` — one
:class:`~smdp_batch.runtime.DynamicBatcher` whose table is the :class:`~smdp_batch.autopilot.pilot.Autopilot`.
Why not Triton's batcher with the Autopilot's table exported to it: Triton's batcher knows only
``max_batch_size`` / ``preferred_batch_size`` / ``max_queue_delay`` (fixed at load time), not a table n ↦ b,
and its batches never reach a Python hook with their arrival times, so the Autopilot could neither decide
nor learn.  Why the model is *decoupled* with ``async def execute``: a non-decoupled Python model runs one
``execute`` at a time per instance and waits for it, so single requests could never queue up to form a
batch; a decoupled model's coroutine runs in the background on the stub's event loop (Triton 2.51's Python
backend), so every request waits in the one batcher and the Autopilot sees the real queue.  The price: the
client must use gRPC streaming (:func:`run_load` does), and one batcher serves one model instance.

Why not ``pytriton.Triton.bind``: under numpy 2 its proxy sends empty outputs (see
:mod:`smdp_batch.integrations.triton`); this module uses the same binary and backend layout, our own model.

* :class:`AutopilotModelSpec` — the model: ``factory`` ("module:function") builds ``(infer, autopilot)`` in
  the model process from ``kwargs`` (JSON); ``dim`` floats in, ``out_dim`` floats out per request.
* :class:`AutopilotTriton` — ``with AutopilotTriton({"name": spec}) as srv:``; ``srv.metrics(name)`` reads the
  Autopilot's metrics (written by the model every 0.2 s; ``events``: its swap/rollback/failure lines),
  ``srv.batches(name)`` its batch log.
* :func:`run_load` — replay arrival times (model ms × scale) over one gRPC stream; every request id answered.
* :func:`sleep_pilot` — a factory for tests: the model is a sleep of l(b) = base + per_item·b ms that echoes
  each request's first input value; :func:`sleep_model` — the same model without a policy, for Triton's batcher.
* ``TritonPythonModel`` — what Triton's Python backend loads (the repository's ``model.py`` imports it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..autopilot.hooks import served_hook
from ..autopilot.report import EventLog
from ..errors import InputError
from ..extras import require
from .triton import TritonServer

__all__ = ["AutopilotModelSpec", "AutopilotTriton", "run_load", "sleep_model", "sleep_pilot", "TritonPythonModel"]

_MODEL_PY = "from smdp_batch.integrations.triton_autopilot import TritonPythonModel  # noqa: F401\n"


@dataclass
class AutopilotModelSpec:
    """``factory`` ("module:function", importable in the model process; ``sys_path`` entries are added).

    ``factory(**kwargs)`` returns ``(infer, policy)``: an Autopilot, another table (PolicyTable, λ-bank), or
    None with ``triton_batching=(max_batch_size, max_queue_delay_us)``: then the model is an ordinary batched
    Triton model (Triton's dynamic batcher, not decoupled) running ``infer`` on Triton's batches — the
    baseline to compare with.
    """

    factory: str
    kwargs: dict = field(default_factory=dict)
    dim: int = 1
    out_dim: int = 1
    sys_path: tuple[str, ...] = ()
    max_wait_ms: float | str | None = "auto"
    triton_batching: tuple[int, float] | None = None  # (max_batch_size, max_queue_delay µs): Triton's own batcher
    # gc.collect() + gc.freeze() once the model is built: a full garbage collection then no longer walks the
    # framework's and the model's objects, which stopped processes here for 33-75 ms (ray's, numba's, jax's objects;
    # Ray Serve freezes its replicas by default).  Objects alive then are never collected as cycles.
    freeze_gc: bool = True


def model_parameters(spec: AutopilotModelSpec, files: dict) -> dict:
    """The model's ``parameters`` (strings, as config.pbtxt carries them): the factory, its kwargs, the batcher's
    timer, whether to freeze the collector, and the log files."""
    return {"factory": spec.factory, "kwargs": json.dumps(spec.kwargs), "sys_path": json.dumps(list(spec.sys_path)),
            "max_wait_ms": json.dumps(spec.max_wait_ms), "freeze_gc": json.dumps(bool(spec.freeze_gc)), **files}


def autopilot_config(name: str, spec: AutopilotModelSpec, files: dict) -> str:
    """config.pbtxt: no Triton batching, decoupled (or Triton's batcher: ``triton_batching``), the factory and
    the log files as parameters."""
    params = model_parameters(spec, files)
    if spec.triton_batching is None:
        block = "max_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n"
    else:
        mb, us = spec.triton_batching
        block = (f"max_batch_size: {int(mb)}\n"
                 + f"dynamic_batching {{\n  max_queue_delay_microseconds: {int(round(float(us)))}\n}}\n")
    return (f'name: "{name}"\nbackend: "python"\n' + block
            + f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {int(spec.dim)} ] }} ]\n'
            + f'output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {int(spec.out_dim)} ] }} ]\n'
            + 'output [ { name: "info" data_type: TYPE_FP64 dims: [ -1 ] } ]\n'  # 3, or 5 with the server's view
            + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
            + "".join(f'parameters: {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}\n' for k, v in params.items()))


class AutopilotTriton(TritonServer):
    """A running Triton on 127.0.0.1 whose models are Autopilot-batched (``models``: name → AutopilotModelSpec)."""

    def __init__(self, models: dict, start_timeout_s: float = 120.0, **kw):
        for spec in models.values():
            if not isinstance(spec, AutopilotModelSpec):
                raise InputError("AutopilotTriton takes AutopilotModelSpec models")
        super().__init__(models, 1.0, start_timeout_s, **kw)

    def _files(self, name: str) -> dict:
        tmp = Path(self.tmp)  # type: ignore[arg-type]  # set by start()
        return {"batch_log": str(tmp / f"{name}.batches.csv"), "metrics_file": str(tmp / f"{name}.metrics.json")}

    def _layout(self) -> list[str]:
        models, self.models = self.models, {}
        try:
            argv = super()._layout()  # the backend directory, the ports, an empty repository
        finally:
            self.models = models
        repo = Path(self.tmp) / "models"  # type: ignore[arg-type]  # set by start()
        for name, spec in models.items():
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "1" / "model.py").write_text(_MODEL_PY)
            (repo / name / "config.pbtxt").write_text(autopilot_config(name, spec, self._files(name)))
        return argv

    def metrics(self, name: str) -> dict | None:
        """The Autopilot's latest metrics (a dict), or None before the first write."""
        try:
            return json.loads(Path(self._files(name)["metrics_file"]).read_text())
        except (OSError, ValueError):
            return None

    def batches(self, name: str) -> list[tuple[int, int, float, float]]:
        """(b, b, start, end) of every batch (``time.time()`` s), as :meth:`TritonServer.batches`."""
        return [(b, b, t0, t1) for b, t0, t1 in self.batches_since(name, 0)[0]]

    def batches_since(self, name: str, offset: int) -> tuple[list[tuple[int, float, float]], int]:
        """The (b, start, end) batches logged after byte ``offset`` of the model's log (whole lines only), and the
        offset to read on from: a poll that costs what is new, not the whole log."""
        try:
            with open(self._files(name)["batch_log"], "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n") + 1
        rows = []
        for ln in data[:end].split():
            b, t0, t1 = ln.split(b",")
            rows.append((int(b), float(t0), float(t1)))
        return rows, offset + end


def run_load(server: TritonServer, name: str | None, arrivals_ms, scale: float = 1.0, make_input=None,
             max_seconds: float = 120.0, outputs: list | None = None, served: list | None = None, router: Any = None):
    """Send request i at arrivals_ms[i]·scale ms over one gRPC stream; (sent_s, done_s, sizes, errors).

    ``router``: a :class:`~smdp_batch.integrations.triton_bank.BankRouter` (``name`` None): each request goes to
    the member it names at the send, and its send → answer time is told to it at the answer, beside its send →
    batch end (the member's clock, this host's) (a request that fails is counted in ``errors``, not told: the
    Autopilot judges answered requests).

    ``make_input(i)`` gives request i's input (a float32 vector, default a zero of dim 1); ``sizes[i]`` is the
    batch size that served it (0: not answered).  A response for an id not sent, or a second one, is an error.
    ``outputs``: a list to fill with each request's ``y`` (None where not answered); ``served``: with each
    request's (entered, answered) in the model (``time.time()`` s; NaN where not answered or with Triton's
    own batcher, whose queue the model does not see).
    """
    if (name is None) == (router is None):
        raise InputError("run_load sends to one model (name) or through a bank's router (router=), not both or neither")
    grpcclient = require("tritonclient.grpc.aio", "streaming to Triton")
    from .loadgen import replay

    async def main():
        async with grpcclient.InferenceServerClient(server.grpc_url) as client:
            queue: asyncio.Queue = asyncio.Queue()
            pending: dict[str, asyncio.Future] = {}
            extra = 0

            async def requests():
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    yield item

            async def reader(stream):
                nonlocal extra
                async for result, error in stream:
                    rid = result.get_response().id if result is not None else None
                    fut = pending.pop(rid, None) if rid is not None else None
                    if fut is None:
                        extra += 1
                        continue
                    if error is not None:
                        fut.set_exception(RuntimeError(str(error)))
                    else:
                        info = result.as_numpy("info").reshape(-1)  # b, batch start, batch end[, entered, answered]
                        fut.set_result((int(info[0]), result.as_numpy("y"), tuple(info[3:5]) if info.size >= 5 else None,
                                        float(info[2]) if info.size >= 3 else math.nan))

            stream = client.stream_infer(requests())
            task = asyncio.ensure_future(reader(stream))

            models = getattr(server, "models", {})

            async def send(i: int):
                t0, t_wall = time.perf_counter(), time.time()
                model = name if router is None else router.sent()
                x = np.zeros(1, np.float32) if make_input is None else np.asarray(make_input(i), np.float32)
                batched = getattr(models.get(model), "triton_batching", None) is not None  # a leading batch dim
                x = x.reshape(1, -1) if batched else x.reshape(-1)
                inp = grpcclient.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                fut = pending[str(i)] = asyncio.get_running_loop().create_future()
                await queue.put({"model_name": model, "inputs": [inp], "request_id": str(i)})
                out = await asyncio.wait_for(fut, 60.0)
                if router is not None:  # beside the send → answer time, the batcher's view: send → its batch's end
                    router.answered((time.perf_counter() - t0) * 1e3, (out[3] - t_wall) * 1e3)
                return out

            out = await replay(send, arrivals_ms, scale, max_seconds)
            await queue.put(None)
            try:
                await asyncio.wait_for(task, 5.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - the stream ends with the client
                task.cancel()
            return out, extra

    (sent, done, results, errors), extra = asyncio.run(main())
    sizes = np.array([0 if r is None else int(r[0]) for r in results], dtype=np.int64)
    if outputs is not None:
        outputs[:] = [None if r is None else r[1] for r in results]
    if served is not None:
        served[:] = [(math.nan, math.nan) if r is None or r[2] is None else r[2] for r in results]
    return sent, done, sizes, errors + extra


def sleep_pilot(base_ms: float, per_item_ms: float, lam: float, slo_p99_ms: float, **autopilot_kw):
    """``(infer, autopilot)``: a batch of b sleeps base + per_item·b ms; paper 004's basic model with that l(b)."""
    from ..model.curves import Table
    from ..model.problem import BatchingProblem
    from ..autopilot import Autopilot

    p = BatchingProblem.basic(rho=0.3)
    sizes = tuple(p.batch_sizes)
    p = p.replace(lam=float(lam), latency=Table(sizes, tuple(float(base_ms + per_item_ms * b) for b in sizes)))

    async def infer(items: list) -> list:  # echoes each request's input: the caller can check who got what
        await asyncio.sleep((base_ms + per_item_ms * len(items)) / 1e3)
        return [np.asarray(x, np.float32).reshape(-1)[:1] for x in items]

    return infer, Autopilot(p, slo_p99_ms, **autopilot_kw)


def sleep_model(base_ms: float, per_item_ms: float):
    """``(infer, None)``: a plain model for Triton's own batcher (a bank member, a baseline); a batch of b sleeps
    base + per_item·b ms and echoes each request's first input value."""
    def infer(items: list) -> list:
        time.sleep((base_ms + per_item_ms * len(items)) / 1e3)
        return [np.asarray(x, np.float32).reshape(-1)[:1] for x in items]

    return infer, None


def _as_array(tensor) -> np.ndarray:
    """An input tensor as a numpy array, through DLPack: the stub's ``as_numpy()`` is built against numpy 1.x
    and, under numpy 2, returns arrays whose every element reads as the first (measured: an input 0, 1, 2, …
    arrived as 0, 0, 0, …)."""
    return np.array(np.from_dlpack(tensor), copy=True)


def _load(factory: str):
    mod, _, fn = factory.partition(":")
    return getattr(importlib.import_module(mod), fn)


class TritonPythonModel:
    """Triton's Python backend model: single requests into one Autopilot-driven DynamicBatcher (module docstring)."""

    def initialize(self, args):
        from .ray_serve import table_batch

        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        for p in json.loads(params["sys_path"]):
            if p not in sys.path:
                sys.path.insert(0, p)
        self.events = EventLog()
        infer, self.pilot = _load(params["factory"])(**json.loads(params["kwargs"]))
        self.is_async = asyncio.iscoroutinefunction(infer)
        self.infer = infer
        self.log = open(params["batch_log"], "a", buffering=1)
        self.metrics_file = params["metrics_file"]
        self.native = self.pilot is None
        wait = json.loads(params["max_wait_ms"])
        if self.native:  # Triton's own batcher hands execute() its batches
            if self.is_async:
                raise InputError("with Triton's own batching the infer function must be synchronous")
        elif hasattr(self.pilot, "observe_batch"):  # told the server's view below (model entry → answer sent)
            self.batched = table_batch(autopilot=self.pilot, max_wait_ms=wait, served=False)(self._batch)
        else:
            self.batched = table_batch(self.pilot, max_wait_ms=wait)(self._batch)
        self.tell = served_hook(self.pilot)[0]
        self.stop = threading.Event()
        self.writer = threading.Thread(target=self._write_loop, daemon=True, name="autopilot-metrics")
        if hasattr(self.pilot, "metrics"):
            self.writer.start()
        if json.loads(params.get("freeze_gc", "true")):  # AutopilotModelSpec.freeze_gc: after everything is built
            gc.collect()
            gc.freeze()

    async def _batch(self, items: list) -> list:
        t0 = time.time()
        out = await self.infer(items) if self.is_async else await asyncio.to_thread(self.infer, items)
        t1 = time.time()
        self.log.write(f"{len(items)},{t0:.6f},{t1:.6f}\n")
        return [(y, len(items), t0, t1) for y in out]

    def _write_metrics(self) -> None:
        tmp = self.metrics_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**dataclasses.asdict(self.pilot.metrics), "events": self.events.lines()}, f, default=float)
        os.replace(tmp, self.metrics_file)

    def _write_loop(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self._write_metrics()
            except Exception as exc:  # noqa: BLE001 - metrics are best effort; serving goes on
                print(f"autopilot metrics not written: {exc!r}", file=sys.stderr, flush=True)

    async def _one(self, request) -> None:
        import triton_python_backend_utils as pb_utils

        t_in, t1 = time.time(), None
        sender = request.get_response_sender()
        try:
            x = _as_array(pb_utils.get_input_tensor_by_name(request, "x"))
            y, b, t0, t1 = await self.batched(x)
            info = np.array([b, t0, t1, t_in, time.time()], dtype=np.float64)  # t_in, t_out: the server's view
            tensors = [pb_utils.Tensor.from_dlpack("y", np.ascontiguousarray(np.asarray(y, np.float32).ravel())),
                       pb_utils.Tensor.from_dlpack("info", info)]
            resp = pb_utils.InferenceResponse(output_tensors=tensors)
        except Exception as exc:  # noqa: BLE001 - the request gets an error answer
            resp = pb_utils.InferenceResponse(error=pb_utils.TritonError(repr(exc)[:300]))
        sender.send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if self.tell is not None:  # the server's record, entry → answer sent: the Autopilot's responses; beside it
            t_out = time.time()  # the batcher's view (entry → batch end): the outside delay it learns per load
            self.tell((t_out - t_in) * 1e3, batch_ms=None if t1 is None else (t1 - t_in) * 1e3)

    async def _all(self, requests) -> None:
        await asyncio.gather(*(self._one(r) for r in requests))

    def _native(self, requests) -> list:
        import triton_python_backend_utils as pb_utils

        xs = [_as_array(pb_utils.get_input_tensor_by_name(r, "x")).reshape(-1) for r in requests]
        t0 = time.time()
        out = self.infer(xs)
        t1 = time.time()
        b = len(requests)
        self.log.write(f"{b},{t0:.6f},{t1:.6f}\n")
        info = np.array([[b, t0, t1]], dtype=np.float64)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor.from_dlpack("y", np.ascontiguousarray(np.asarray(y, np.float32).reshape(1, -1))),
            pb_utils.Tensor.from_dlpack("info", info)]) for y in out]

    def execute(self, requests):
        """Decoupled: a coroutine (the stub runs it in the background; responses go through each sender).
        With Triton's batcher: the batch's responses."""
        return self._native(requests) if self.native else self._all(requests)

    def finalize(self):
        self.stop.set()
        try:
            if hasattr(self.pilot, "metrics"):
                if self.writer.is_alive():  # its last write first: two writers would race for the one temporary file
                    self.writer.join(10.0)
                self.pilot.join(10.0)
                self._write_metrics()
        finally:
            self.log.close()
