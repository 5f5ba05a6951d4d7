"""The stub model that Triton's Python backend runs (copied into the model repository as ``1/model.py``).

Loaded by Triton's own ``triton_python_backend_stub`` process; smdp-batch never uses it in-process.  A batch
of b requests (the list Triton's dynamic batcher hands to ``execute``) sleeps l(pad(b))·scale ms and books
ζ(pad(b)); each request gets back ``info`` = [b, batch start, batch end] (``time.time()`` s).  One
line ``b,start,end`` per batch is appended to the log file named in the config's parameters.

Outputs are built with ``Tensor.from_dlpack``: the Python backend stub shipped with PyTriton (Triton 2.51)
is compiled against numpy 1.x, and ``pb_utils.Tensor(name, ndarray)`` under numpy 2 sends empty tensors
(measured: ``binary_data_size: 0``); DLPack does not go through numpy's C layout.
"""

import json
import time

import numpy as np
try:
    import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend
except ImportError:  # imported outside Triton (docs, architecture checks): nothing to serve
    pb_utils = None


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        get = lambda k: params[k]["string_value"]  # noqa: E731
        self.latency_ms = {int(k): float(v) for k, v in json.loads(get("latency_ms")).items()}
        self.pad = {int(k): int(v) for k, v in json.loads(get("pad_to")).items()}
        self.scale = float(get("scale"))
        self.log = open(get("batch_log"), "a", buffering=1)

    def execute(self, requests):
        b = len(requests)
        size = self.pad.get(b, b)
        t0 = time.time()
        time.sleep(self.latency_ms[size] * self.scale / 1000.0)
        t1 = time.time()
        self.log.write(f"{b},{size},{t0:.6f},{t1:.6f}\n")
        info = np.array([[b, t0, t1]], dtype=np.float64)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor.from_dlpack("info", info)]) for _ in requests]

    def finalize(self):
        self.log.close()
