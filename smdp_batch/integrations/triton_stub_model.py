"""The stub model that Triton's Python backend runs (copied into the model repository as ``1/model.py``).

Loaded by Triton's own ``triton_python_backend_stub`` process; smdp-batch never uses it in-process.  A batch
of b requests (the list Triton's dynamic batcher hands to ``execute``) sleeps l(pad(b))·scale ms, or, when the
config names an ONNX model (``onnx_path``), runs it on pad(b) rows with ONNX Runtime on the CPU (one thread per
instance: each instance is its own stub process, so instances contend for the cores as real ones do); each
request gets back ``info`` = [b, batch start, batch end, its position in the batch] (times ``time.time()`` s;
positions 0 … b − 1 in the order Triton handed the requests over, the order their responses are returned).  One line ``b,size,start,end,pid``
per batch is appended to the log file named in the config's parameters (pid: the instance that ran it).

Outputs are built with ``Tensor.from_dlpack``: the Python backend stub shipped with PyTriton (Triton 2.51)
is compiled against numpy 1.x, and ``pb_utils.Tensor(name, ndarray)`` under numpy 2 sends empty tensors
(measured: ``binary_data_size: 0``); DLPack does not go through numpy's C layout.
"""

import json
import os
import time

import numpy as np
try:
    import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend
except ImportError:  # imported outside Triton (docs, architecture checks): nothing to serve
    pb_utils = None


def onnx_session(path: str, sizes):
    """(session, input name, rows): ONNX Runtime on the CPU with one thread (each instance its own process or
    worker, so instances contend for the cores as real ones do), seeded random input rows for the largest of
    ``sizes``, and each size run once to warm it.  Shared with the Ray Serve stand-in
    (:func:`smdp_batch.integrations.ray_serve.stub_deployment`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    rows = np.random.default_rng(0).standard_normal((max([*sizes, 1]), int(inp.shape[1]))).astype(np.float32)
    for size in sorted(sizes):  # warm each executed size
        session.run(None, {inp.name: rows[:size]})
    return session, inp.name, rows


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        get = lambda k: params[k]["string_value"]  # noqa: E731
        self.latency_ms = {int(k): float(v) for k, v in json.loads(get("latency_ms")).items()}
        self.pad = {int(k): int(v) for k, v in json.loads(get("pad_to")).items()}
        self.scale = float(get("scale"))
        self.log = open(get("batch_log"), "a", buffering=1)
        self.session = None
        path = params.get("onnx_path", {}).get("string_value", "")
        if path:
            self.session, self.input_name, self.rows = onnx_session(path, set(self.pad.values()) | set(self.latency_ms))

    def execute(self, requests):
        b = len(requests)
        size = self.pad.get(b, b)
        t0 = time.time()
        if self.session is not None:
            self.session.run(None, {self.input_name: self.rows[:size]})
        else:
            time.sleep(self.latency_ms[size] * self.scale / 1000.0)
        t1 = time.time()
        self.log.write(f"{b},{size},{t0:.6f},{t1:.6f},{os.getpid()}\n")
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor.from_dlpack("info", np.array([[b, t0, t1, k]], dtype=np.float64))]) for k in range(b)]

    def finalize(self):
        self.log.close()
