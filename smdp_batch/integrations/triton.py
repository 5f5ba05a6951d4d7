"""A real Triton Inference Server (the binary that PyTriton ships) serving a time-scaled stub model.

What runs: ``tritonserver`` from the ``nvidia-pytriton`` wheel (``pip install -e ".[triton]"``), with a
model repository written here: one model per batching setting, each with Triton's own dynamic batcher
configured by ``max_batch_size`` / ``dynamic_batching { preferred_batch_size, max_queue_delay_microseconds }``
exactly as ``smdp-batch export --to triton`` writes them (the delay multiplied by the time scale), one
CPU instance or several (``ModelSpec.instances``), and the Python-backend stub of :mod:`smdp_batch.integrations.triton_stub_model`: a batch of b
sleeps l(b)·scale and reports its size and start/end times.

Why not ``pytriton.Triton.bind``: PyTriton's proxy builds its outputs with ``pb_utils.Tensor(name, ndarray)``
inside the Python-backend stub, which is compiled against numpy 1.x; under numpy 2 (which JAX ≥ 0.8 needs)
every output arrives empty (measured with PyTriton 0.7.0 and 0.5.7: ``binary_data_size: 0``; 0.7.0 pins
numpy < 2 for that reason, and pip then backtracks to 0.5.7, which does not pin it).  Our stub writes its
outputs through DLPack, and talks to Triton directly (no second hop through PyTriton's proxy process).

Two set-up steps the project does itself, so that nothing is done by hand on a fresh machine:

* ``LD_LIBRARY_PATH`` for the Triton process starts with this interpreter's ``sysconfig`` LIBDIR.  The
  backend stub loads the first ``libpython3.X.so`` on the loader path; a system libpython of the same minor
  version but another build fails in the stub with ``'_thread.RLock' object has no attribute
  '_recursion_count'`` (seen here: pyenv 3.11.7 against Debian's /usr/lib libpython3.11).
* the backend directory is a temporary folder with PyTriton's ``libtriton_python.so`` and the stub built for
  this Python version (PyTriton ships one per 3.8–3.13), linked, not copied.

The server binds 127.0.0.1 only (HTTP and gRPC on free ports, metrics off) and is stopped with SIGINT, then
killed after ``exit_timeout_s``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..extras import require

__all__ = ["TritonDistribution", "find_distribution", "ModelSpec", "model_config", "TritonServer", "loader_path"]

_STUB = Path(__file__).with_name("triton_stub_model.py")


@dataclass(frozen=True)
class TritonDistribution:
    """Where the pieces of PyTriton's Triton build are."""

    server: Path
    libs: Path
    python_backend: Path
    stub: Path
    version: str


def find_distribution() -> TritonDistribution:
    """The Triton binary, its libraries and the Python-backend stub for this interpreter, from PyTriton."""
    pytriton = require("pytriton", "the real Triton server")
    root = Path(pytriton.__file__).parent  # type: ignore[arg-type]  # a package's __file__ is set
    dist = root / "tritonserver"
    libs = root.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        libs = dist / "external_libs"
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = TritonDistribution(dist / "bin" / "tritonserver", libs, dist / "backends" / "python",
                             dist / "python_backend_stubs" / ver / "triton_python_backend_stub", ver)
    for p in (out.server, out.python_backend / "libtriton_python.so", out.stub):
        if not p.exists():
            raise InputError(f"PyTriton's Triton build has no {p} (Python {ver}); reinstall nvidia-pytriton")
    return out


def loader_path(dist: TritonDistribution, env: dict | None = None) -> str:
    """LD_LIBRARY_PATH for the Triton process: this interpreter's LIBDIR first (its own libpython), then
    PyTriton's libraries, then whatever was set."""
    parts = [sysconfig.get_config_var("LIBDIR") or "", str(dist.libs), (env or os.environ).get("LD_LIBRARY_PATH", "")]
    return ":".join(p for p in parts if p)


@dataclass
class ModelSpec:
    """One stub model: its Triton batching settings (model units) and its l(b) (ms), in real time × scale.

    ``pad_to[b]`` is the size the model executes for a batch of b requests (TensorRT-style profiles: a batch
    of 3 runs as 4); by default every b runs as itself.  ``instances``: Triton's ``instance_group`` count (each
    instance a stub process; the dynamic batcher's one queue feeds them all).  ``onnx_path``: an ONNX model each
    instance runs on the CPU instead of sleeping (its input [N, D] float32; run the server at scale 1, and list
    the sizes to warm in ``latency_ms``).
    """

    max_batch_size: int
    max_queue_delay_us: float = 0.0
    preferred: tuple[int, ...] = ()
    latency_ms: dict = field(default_factory=dict)
    pad_to: dict = field(default_factory=dict)
    instances: int = 1
    onnx_path: str = ""


def model_config(name: str, spec: ModelSpec, scale: float, batch_log: str) -> str:
    """config.pbtxt: the export's batching block (delay × scale) plus the stub's inputs, outputs and parameters."""
    pref = sorted(int(p) for p in spec.preferred)
    us = int(round(float(spec.max_queue_delay_us) * scale))
    block = (f"max_batch_size: {int(spec.max_batch_size)}\ndynamic_batching {{\n"
             + (f"  preferred_batch_size: [ {', '.join(map(str, pref))} ]\n" if pref else "")
             + f"  max_queue_delay_microseconds: {us}\n}}\n")
    params = {"latency_ms": json.dumps({str(k): float(v) for k, v in spec.latency_ms.items()}),
              "pad_to": json.dumps({str(k): int(v) for k, v in spec.pad_to.items()}),
              "scale": repr(float(scale)), "batch_log": batch_log, "onnx_path": str(spec.onnx_path)}
    return (
        f'name: "{name}"\nbackend: "python"\n' + block
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        + 'output [ { name: "info" data_type: TYPE_FP64 dims: [ 4 ] } ]\n'
        + f"instance_group [ {{ count: {int(spec.instances)} kind: KIND_CPU }} ]\n"
        + "".join(f'parameters: {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}\n' for k, v in params.items())
    )


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1: the sockets are held together while the OS picks them (one at a
    time, a closed socket's port can be handed out again at once, so HTTP and gRPC got the same one)."""
    held = [socket.socket() for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


#: What tritonserver's log says when a port it was given was taken in the meantime (another process bound it
#: between our choice and the server's start): the start is tried again on fresh ports.
_PORT_TAKEN = ("cannot listen", "already in use", "Address in use", "failed to start HTTP", "failed to start GRPC")


class TritonServer:
    """``with TritonServer({"name": ModelSpec, …}, scale) as srv:`` — a running Triton on 127.0.0.1.

    ``model_control="explicit"``: Triton's explicit model-control mode (every model loaded at the start), so that
    :meth:`retime` can change a model's batching delay by reloading it.

    ``srv.grpc_url`` / ``srv.http_url``; ``srv.batches(name)`` reads the batches a model has run
    (b, executed size, start s, end s), ``srv.batch_log(name)`` the same with the instance that ran each.
    Start-up waits for readiness (``start_timeout_s``).
    """

    def __init__(self, models: dict, scale: float, start_timeout_s: float = 60.0, exit_timeout_s: int = 3,
                 log_file: str | None = None, model_control: str = "none"):
        if not models:
            raise InputError("TritonServer needs at least one model")
        if not (scale > 0):
            raise InputError(f"time scale must be > 0, got {scale!r}")
        if model_control not in ("none", "explicit"):
            raise InputError(f"model_control must be 'none' or 'explicit', got {model_control!r}")
        self.models, self.scale, self.model_control = dict(models), float(scale), model_control
        self.start_timeout_s, self.exit_timeout_s, self.log_file = start_timeout_s, int(exit_timeout_s), log_file
        self.dist = find_distribution()
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None

    # ------------------------------------------------------------------ set-up
    def _layout(self) -> list[str]:
        tmp = Path(self.tmp)  # type: ignore[arg-type]  # set by start() before the layout
        backend = tmp / "backends" / "python"
        backend.mkdir(parents=True)
        for src in (self.dist.python_backend / "libtriton_python.so", self.dist.python_backend / "triton_python_backend_utils.py"):
            os.symlink(src, backend / src.name)
        os.symlink(self.dist.stub, backend / "triton_python_backend_stub")
        repo = tmp / "models"
        for name, spec in self.models.items():
            (repo / name / "1").mkdir(parents=True)
            shutil.copy(_STUB, repo / name / "1" / "model.py")
            (repo / name / "config.pbtxt").write_text(model_config(name, spec, self.scale, self._log(name)))
        return [str(self.dist.server), f"--model-repository={repo}", f"--backend-directory={tmp / 'backends'}",
                "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--allow-metrics=false", "--allow-gpu-metrics=false",
                f"--exit-timeout-secs={self.exit_timeout_s}", "--strict-readiness=true", "--log-verbose=0",
                f"--cache-directory={tmp / 'caches'}"] + \
            (["--model-control-mode=explicit", "--load-model=*"] if self.model_control == "explicit" else [])

    def retime(self, name: str, delay_us: float, preferred: tuple[int, ...] | None = None) -> float:
        """Set model ``name``'s ``max_queue_delay_microseconds`` (model µs, × the time scale) and, when given, its
        preferred batch sizes, through Triton's model-management API: a reload of the model with the changed
        config (``model_control="explicit"`` only; Triton reads its batcher's settings when a model loads).
        Returns the seconds the load call took."""
        if self.model_control != "explicit":
            raise InputError("retime needs TritonServer(..., model_control='explicit'): Triton reads the batcher's "
                             "settings only when a model loads, and loads on request only in that mode")
        us = float(delay_us) if isinstance(delay_us, (int, float)) and not isinstance(delay_us, bool) else math.nan
        if not (math.isfinite(us) and 0.0 <= us * self.scale <= 3.6e9):
            raise InputError(f"delay_us must be a number of µs in 0..3.6e9 (an hour), got {delay_us!r}")
        if name not in self.models:
            raise InputError(f"no model {name!r} on this server; it serves {', '.join(sorted(self.models))}")
        mb = int(self.models[name].max_batch_size)
        if preferred is not None and not all(isinstance(b, int) and 1 <= b <= mb for b in preferred):
            raise InputError(f"preferred sizes must be whole numbers in 1..{mb} (the model's max batch), got {preferred!r}")
        http = require("tritonclient.http", "retiming a Triton model")
        client = http.InferenceServerClient(self.http_url)
        try:
            cfg = client.get_model_config(name)
            block = cfg.setdefault("dynamic_batching", {})
            block["max_queue_delay_microseconds"] = int(round(us * self.scale))
            if preferred is not None:
                block["preferred_batch_size"] = sorted(int(b) for b in preferred)
            t0 = time.perf_counter()
            client.load_model(name, config=json.dumps(cfg))
            return time.perf_counter() - t0
        finally:
            client.close()

    def _log(self, name: str) -> str:
        return str(Path(self.tmp) / f"{name}.batches.csv")  # type: ignore[arg-type]  # set by start()

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> "TritonServer":
        self.tmp = tempfile.mkdtemp(prefix="smdp-triton-")
        layout = self._layout()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = loader_path(self.dist, env)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the stub's interpreter prefix
        deadline = time.monotonic() + self.start_timeout_s
        for attempt in range(3):
            self.http_port, self.grpc_port = _free_ports(2)
            argv = layout + [f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}"]
            out = open(self.log_file or os.path.join(self.tmp, "tritonserver.log"), "w")
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            out.close()
            if self._wait_ready(deadline, last=attempt == 2):
                return self
        raise AssertionError("unreachable: the last attempt raises")

    def _wait_ready(self, deadline: float, last: bool) -> bool:
        """Wait for the server's readiness: True when ready; False when it exited because a port was taken (and
        ``last`` is False: the caller tries fresh ports); RuntimeError otherwise."""
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                if not last and any(m in tail for m in _PORT_TAKEN):
                    return False
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode} during start-up:\n{tail}")
            try:
                with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return True
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"tritonserver was not ready after {self.start_timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        path = self.log_file or (os.path.join(self.tmp, "tritonserver.log") if self.tmp else None)
        try:
            return Path(path).read_text(errors="replace")[-chars:]  # type: ignore[arg-type]  # None: TypeError, caught
        except (OSError, TypeError):
            return ""

    def batch_log(self, name: str) -> list[tuple[int, int, float, float, int]]:
        """(requests b, executed size, start, end, instance) of every batch the model ran, start/end in
        time.time() s, the instance its stub process's id."""
        try:
            lines = Path(self._log(name)).read_text().split()
        except FileNotFoundError:
            return []
        out = []
        for ln in lines:
            b, s, t0, t1, pid = ln.split(",")
            out.append((int(b), int(s), float(t0), float(t1), int(pid)))
        return out

    def batches(self, name: str) -> list[tuple[int, int, float, float]]:
        """(requests b, executed size, start, end) of every batch the model ran, start/end in time.time() s."""
        return [x[:4] for x in self.batch_log(name)]

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=self.exit_timeout_s + 5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cleanup(self) -> None:
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()


def run_load(server: TritonServer, name: str, arrivals_ms, max_seconds: float = 60.0):
    """Replay ``arrivals_ms`` (model ms) against model ``name`` over gRPC; a :class:`~.loadgen.Run` in model ms.

    Latency is the client's (sent → answered), so it includes two gRPC legs on 127.0.0.1; the run's
    ``notes["overhead_ms"]`` is the mean of (answered − batch end) in model ms, the return leg alone, and
    ``notes["instance"]`` maps each batch id to the instance that ran it, ``notes["position"]`` holds each
    request's place in its batch (−1: unanswered) and ``notes["lag_ms"]`` how late each was sent against its
    schedule (real ms).
    """
    import asyncio

    import numpy as np
    grpcclient = require("tritonclient.grpc.aio", "replaying to Triton")

    from .loadgen import Run, replay, send_lag_ms

    scale = server.scale

    async def main():
        async with grpcclient.InferenceServerClient(server.grpc_url) as client:
            x = np.zeros((1, 1), dtype=np.float32)

            async def send(i: int):
                inp = grpcclient.InferInput("x", [1, 1], "FP32")
                inp.set_data_from_numpy(x)
                r = await client.infer(name, [inp])
                info = r.as_numpy("info")[0]
                return int(info[0]), (float(info[1]), float(info[2])), int(info[3])

            t0 = time.perf_counter()
            out = await replay(send, arrivals_ms, scale, max_seconds)
            return out + (time.perf_counter() - t0,)

    sent, done, results, errors, wall = asyncio.run(main())
    n = sent.size
    t_first = sent[0]
    to_ms = lambda t: (t - t_first) * 1000.0 / scale  # noqa: E731
    batch_key: dict = {}
    batch_of = np.full(n, -1, dtype=np.int64)
    back = []
    position = np.full(n, -1, dtype=np.int64)
    for i, r in enumerate(results):
        if r is None:
            continue
        b, (t0, t1), position[i] = r
        k = batch_key.setdefault(round(t0, 6), len(batch_key))
        batch_of[i] = k
        back.append(done[i] - t1)
    logged = {round(x[2], 6): x for x in server.batch_log(name)}
    batches, times, instance = {}, {}, {}
    for key, k in batch_key.items():
        b, s, t0, t1, i = logged[key]
        batches[k] = (b, s)
        times[k] = (to_ms(t0), to_ms(t1))
        instance[k] = i
    run = Run(to_ms(sent), (done - sent) * 1000.0 / scale, batch_of, batches, errors=errors, wall_s=wall,
              batch_times=times)
    run.notes["overhead_ms"] = float(np.mean(back) * 1000.0 / scale) if back else float("nan")
    run.notes["instance"] = instance
    run.notes["position"] = position
    run.notes["lag_ms"] = send_lag_ms(sent, arrivals_ms, scale)
    return run
