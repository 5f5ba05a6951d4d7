"""Two instances of the example ONNX model on a real Triton (PyTriton's binary), against the model with contention.

1. **Measure** the example MLP (``examples/onnx_mlp.py``, ONNX Runtime on the CPU, one thread per instance), made
   ``--depth`` hidden layers deep (default 24 of width 2 048: l(32) ≈ 45 ms, so that the few hundred requests per
   second a 2-core machine can send over gRPC load it; the example's own 2 layers take 6 ms at b = 32, where
   Triton's per-request time would dominate), at the sizes 1, 2, 4, 8, 16, 32: each size alone, then in two
   processes at once (what two instances on one machine do); printed for reference.
2. **Calibrate** inside Triton on two runs of their own (ρ 0.5, :func:`calibrate`): l(b), S₂, and the server's
   own times (an instance's gap after a batch while requests wait, the return leg to the client).
3. **Run** Triton with ``instance_group { count: 2 }``: its dynamic batcher's one queue feeds two Python-backend
   instances, each running the ONNX model on the batch (``ModelSpec.onnx_path``, real time: scale 1).  Two loads
   (ρ 0.5 and 0.8 per instance, ρ counting S₂), two settings each (a 2 ms delay, and the delay tuned on 2
   contending instances for p99 ≤ 4·l(32)), ``--requests`` per run on 127.0.0.1.
4. **Compare** with the simulator on two instances sharing one queue, on the very arrival times sent: without
   the contention, with it (``--contention 2:S₂``), and with it and the server's own times.

    python benchmarks/bench_instances_onnx.py [--requests 800] [--json]

Needs ``pip install -e ".[dev,triton]"`` and PyTriton (README); bounded; about 40 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from smdp_batch import BatchingProblem  # noqa: E402
from smdp_batch.analysis.simulate import poisson_arrivals  # noqa: E402
from smdp_batch.analysis.slo import optimise  # noqa: E402
from smdp_batch.baselines.servers import triton  # noqa: E402
from smdp_batch.integrations.loadgen import compare, instance_gap  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)
C = 2


def _time_sizes(path: str, repeats: int, barrier, out) -> None:
    """One process: an ONNX Runtime session (one thread), each size ``repeats`` times back to back (ms)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((max(SIZES), s.get_inputs()[0].shape[1])).astype(np.float32)
    for b in SIZES:
        for _ in range(3):
            s.run(None, {"x": x[:b]})
    if barrier is not None:
        barrier.wait()
    res = {}
    for b in SIZES:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            s.run(None, {"x": x[:b]})
            ts.append((time.perf_counter() - t0) * 1e3)
        res[b] = float(np.median(ts))
    out.put(res)


def measure(path: str, repeats: int) -> tuple[dict, dict]:
    """Median time (ms) per size alone, and beside a second process doing the same."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_time_sizes, args=(path, repeats, None, q))
    p.start()
    alone = q.get(timeout=300)
    p.join()
    bar = ctx.Barrier(2)
    ps = [ctx.Process(target=_time_sizes, args=(path, repeats, bar, q)) for _ in range(2)]
    for p in ps:
        p.start()
    pair = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    both = {b: float(np.mean([r[b] for r in pair])) for b in SIZES}
    return alone, both


def overlap(batches) -> list[tuple[int, float, float]]:
    """(size, duration ms, share of its time another batch ran) of each batch in a server's log."""
    out = []
    for i, (b, _, t0, t1) in enumerate(batches):
        ov = sum(max(0.0, min(t1, u1) - max(t0, u0)) for j, (_, _, u0, u1) in enumerate(batches) if j != i)
        out.append((int(b), (t1 - t0) * 1e3, ov / max(t1 - t0, 1e-12)))
    return out


def calibrate(path: str, l32: float, requests: int, seed: int) -> dict:
    """l(b), S₂ and the server's own times inside Triton, from two calibration runs (ρ 0.5; not the runs compared
    later): a one-instance model's batches (alone) give the affine l(b); a two-instance model's batches that ran
    beside another for over 90 % of their time give S₂ = median(duration / l(b)); both runs give the gap an
    instance stays unavailable after a batch while requests wait (:func:`instance_gap`) and the return leg
    (batch end → client answered)."""
    from smdp_batch.integrations.triton import ModelSpec, TritonServer, run_load

    warm = {b: 0.0 for b in SIZES}
    models = {"one": ModelSpec(32, 2000.0, (), warm, instances=1, onnx_path=path),
              "two": ModelSpec(32, 2000.0, (), warm, instances=C, onnx_path=path)}
    with TritonServer(models, 1.0, start_timeout_s=120.0) as srv:
        rng = np.random.default_rng(seed)
        r1 = run_load(srv, "one", poisson_arrivals(0.5 * 32 / l32, requests, rng))
        r2 = run_load(srv, "two", poisson_arrivals(0.5 * C * 32 / l32, requests, rng))
        one, two = overlap(srv.batches("one")), overlap(srv.batches("two"))
    gaps = [instance_gap(r, 2.0) for r in (r1, r2)]
    pairs = sum(g["pairs"] for g in gaps)
    gap = sum(g["gap_ms"] * g["pairs"] for g in gaps if g["pairs"]) / pairs if pairs else 0.0
    back = float(np.median(np.concatenate([return_legs(r) for r in (r1, r2)])))
    b1 = np.array([r[0] for r in one], dtype=float)
    d1 = np.array([r[1] for r in one])
    slope, icpt = np.polyfit(b1, d1, 1)
    full = [r for r in two if r[2] > 0.9]
    s2 = float(np.median([d / (icpt + slope * b) for b, d, _ in full])) if full else 1.0
    return {"latency": f"affine:{slope:.6g},{max(icpt, 1e-3):.6g}", "s2": max(1.0, min(s2, 2.0)),
            "batches_alone": len(one), "batches_beside": len(full), "gap_ms": gap, "gap_pairs": pairs,
            "return_ms": back}


def return_legs(run) -> np.ndarray:
    """Per answered request, batch end → client answered (ms)."""
    k = run.batch_of
    ok = (k >= 0) & np.isfinite(run.latency_ms)
    ends = np.array([run.batch_times[int(j)][1] for j in k[ok]])
    return run.latency_ms[ok] - (ends - run.arrival_ms[ok])


def with_server_times(p, rule, run, cal: dict) -> dict:
    """The model with the server's own times calibrated: each batch holds its instance ``gap_ms`` longer (in the
    simulator's l(b)), and each answer reaches the client ``return_ms`` after its batch ends (added to W̄)."""
    slope, icpt = (float(x) for x in cal["latency"].split(":", 1)[1].split(","))
    out = compare(p.replace(latency=f"affine:{slope:.6g},{icpt + cal['gap_ms']:.6g}"), rule, run)
    w = out["model"]["mean_latency_ms"] - cal["gap_ms"] + cal["return_ms"]
    return {"mean_latency_ms": w, "mean_batch_size": out["model"]["mean_batch_size"],
            "latency_ratio": out["measured"]["mean_latency_ms"] / w, "batch_size_ratio": out["batch_size_ratio"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=int, default=24, help="hidden layers of width 2048 (the example has 2)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import examples.onnx_mlp as mlp
    from smdp_batch.integrations.triton import ModelSpec, TritonServer, run_load

    mlp.HIDDEN = (mlp.HIDDEN[0],) * a.depth
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="smdp-onnx-")
    path = os.path.join(tmp, "mlp.onnx")
    mlp.build_model(path)
    alone, both = measure(path, a.repeats)
    ratios = {b: both[b] / alone[b] for b in SIZES}
    cal = calibrate(path, alone[32], a.requests, a.seed + 100)
    lat, spec = cal["latency"], f"2:{cal['s2']:.4g}"
    runs = []
    for rho in (0.5, 0.8):
        p = BatchingProblem.from_rho(rho, latency=lat, service="det", instances=C, contention=spec)
        slo = 4.0 * float(p.latency_ms()[-1])
        best = optimise(p, {"p99": slo}, families=("triton",), requests=50_000, defaults=False).best["triton"]
        rules = [("delay 2 ms", triton(32, 2000))]
        if best is not None:
            rules.append((f"tuned, p99 ≤ {slo:.0f} ms", triton(32, best.knobs["delay_us"])))
        runs += [(rho, p, label, rule) for label, rule in rules]
    models = {f"m{i}": ModelSpec(rule.maxb, rule.delay * 1000.0, (), {b: 0.0 for b in SIZES}, instances=C,
                                 onnx_path=path) for i, (_, _, _, rule) in enumerate(runs)}
    rows = []
    with TritonServer(models, 1.0, start_timeout_s=120.0) as srv:
        for i, (rho, p, label, rule) in enumerate(runs):
            run = run_load(srv, f"m{i}", poisson_arrivals(p.lam, a.requests, np.random.default_rng(a.seed)))
            with_c = compare(p, rule, run)
            without = compare(p.replace(contention=None), rule, run)
            rows.append({"rho": rho, "setting": label, "rule": rule.spec, "errors": run.errors,
                         "measured": with_c["measured"], "model": with_c["model"],
                         "model_with_server_times": with_server_times(p, rule, run, cal),
                         "model_without_contention": without["model"],
                         "ratios": {k: v for k, v in with_c.items() if k.endswith("ratio")},
                         "ratios_without_contention": {k: v for k, v in without.items() if k.endswith("ratio")}})
    out = {"alone_ms": alone, "beside_ms": both, "ratios": ratios, "calibration": cal, "contention": spec,
           "latency": lat, "runs": rows, "seconds": time.time() - t0}
    if a.json:
        print(json.dumps(out, indent=1, default=float))
        return
    print(f"ONNX MLP ({a.depth} hidden layers of {mlp.HIDDEN[0]}) on the CPU, one thread per instance "
          f"({time.time() - t0:.0f} s in all)")
    print("  outside the server: size " + "".join(f"{b:>8}" for b in SIZES))
    print("  alone ms                 " + "".join(f"{alone[b]:>8.2f}" for b in SIZES))
    print("  beside another ms        " + "".join(f"{both[b]:>8.2f}" for b in SIZES))
    print("  ratio                    " + "".join(f"{ratios[b]:>8.3f}" for b in SIZES))
    print(f"  inside Triton: l(b) = {lat} ms ({cal['batches_alone']} batches on one instance); contention {spec} "
          f"(median over {cal['batches_beside']} batches that ran beside another); an instance's gap after a batch "
          f"{cal['gap_ms']:.2f} ms ({cal['gap_pairs']} pairs), return leg {cal['return_ms']:.2f} ms")
    print(f"\nreal Triton, instance_group count {C}, ONNX model, vs the simulator on {C} instances (same arrivals, "
          f"{a.requests} requests per run)")
    print(f"  {'ρ':>4} {'setting':<22} {'W̄ meas':>8} {'no-cont':>8} {'ratio':>6} {'model':>8} {'ratio':>6} "
          f"{'+server':>8} {'ratio':>6} {'batch meas':>10} {'model':>7} {'+server':>8}")
    for r in rows:
        m, s, s0, st = r["measured"], r["model"], r["model_without_contention"], r["model_with_server_times"]
        q, q0 = r["ratios"], r["ratios_without_contention"]
        print(f"  {r['rho']:>4} {r['setting']:<22} {m['mean_latency_ms']:>8.2f} {s0['mean_latency_ms']:>8.2f} "
              f"{q0['latency_ratio']:>6.3f} {s['mean_latency_ms']:>8.2f} {q['latency_ratio']:>6.3f} "
              f"{st['mean_latency_ms']:>8.2f} {st['latency_ratio']:>6.3f} {m['mean_batch_size']:>10.2f} "
              f"{s['mean_batch_size']:>7.2f} {st['mean_batch_size']:>8.2f}"
              + ("" if r["errors"] == 0 else f"  ({r['errors']} errors)"))
    print("  (no-cont: the model without the contention; model: with S₂; +server: with S₂, the instance's gap after a "
          "batch and the return leg, all calibrated before these runs)")


if __name__ == "__main__":
    main()
