"""A real model to measure: a small ONNX Runtime MLP built in code (random weights, seeded; no downloads).

    smdp-batch measure examples.onnx_mlp:infer --make-batch examples.onnx_mlp:make_batch \\
        --sizes 1,2,4,8,16,32 --repeats 20 -o mlp.csv          # from the repository root

* :func:`build_model` — the ONNX graph: x[N, 256] → Gemm 2048 → Relu → Gemm 2048 → Relu → Gemm 10,
  float32, weights from ``numpy.random.default_rng(seed)``; writes it to ``path`` when given.
* :func:`infer` — one batch through an ``onnxruntime.InferenceSession`` on the CPU (built on first
  use, one intra-op thread so that timings on a shared machine stay steady).  Takes an array
  [b, 256] (what :func:`make_batch` builds) or a list of b vectors (what ``DynamicBatcher`` passes)
  and returns the logits as an array, or as a list of rows for a list.
* :func:`infer_async` — the same for ``DynamicBatcher`` in a thread (ONNX Runtime releases the GIL,
  so requests keep arriving on the event loop while a batch runs).
* :func:`make_batch` — b random inputs (seeded by b).
"""

from __future__ import annotations

import asyncio

import numpy as np

DIM, HIDDEN, CLASSES = 256, (2048, 2048), 10
_SESSION = None


def build_model(path: str | None = None, seed: int = 0, threads: int = 1, copies: int = 1):
    """The MLP as an ``onnx.ModelProto`` (checked); written to ``path`` when one is given.  ``copies`` > 1: that many
    MLPs with weights of their own (seeds ``seed``, ``seed`` + 1, …) on the same input, their logits summed — the
    work of running the MLP ``copies`` times, as the Autopilot benchmark's heavy variant does (``copies=4``), in one
    model a server can load."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be a whole number ≥ 1, got {copies!r}")
    widths = (DIM, *HIDDEN, CLASSES)
    nodes, inits, outs = [], [], []
    for c in range(int(copies)):
        rng, prev, tag = np.random.default_rng(seed + c), "x", "" if copies == 1 else f"_{c}"
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
            w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
            b = (0.01 * rng.standard_normal(n_out)).astype(np.float32)
            inits += [numpy_helper.from_array(w, f"W{i}{tag}"), numpy_helper.from_array(b, f"B{i}{tag}")]
            last = i == len(widths) - 2
            out = f"logits{tag}" if last else f"h{i}{tag}"
            nodes.append(helper.make_node("Gemm", [prev, f"W{i}{tag}", f"B{i}{tag}"], [out if last else f"g{i}{tag}"]))
            if not last:
                nodes.append(helper.make_node("Relu", [f"g{i}{tag}"], [out]))
            prev = out
        outs.append(prev)
    if copies > 1:
        nodes.append(helper.make_node("Sum", outs, ["logits"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DIM])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="smdp-batch example")
    model.ir_version = min(model.ir_version, 9)  # loadable by older onnxruntime releases too
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, path)
    return model


def session(threads: int = 1):
    """The ONNX Runtime CPU session of :func:`build_model` (built once per process)."""
    global _SESSION
    if _SESSION is None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads
        _SESSION = ort.InferenceSession(build_model().SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return _SESSION


def make_batch(b: int) -> np.ndarray:
    """b inputs of dimension 256 (float32), seeded by b."""
    return np.random.default_rng(b).standard_normal((b, DIM), dtype=np.float32)


def infer(batch):
    """Logits of a batch: an array [b, 256] → array [b, 10]; a list of b vectors → a list of b rows."""
    x = np.asarray(batch, dtype=np.float32).reshape(-1, DIM)
    y = session().run(["logits"], {"x": x})[0]
    return list(y) if isinstance(batch, list) else y


async def infer_async(items: list) -> list:
    """:func:`infer` in a worker thread, for ``DynamicBatcher(infer_async, table)``."""
    return await asyncio.to_thread(infer, items)
