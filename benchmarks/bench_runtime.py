"""PolicyTable: load an HDF5 table and decide for 10^6 queue lengths (issue target: < 50 ms together).

    python benchmarks/bench_runtime.py
"""

from __future__ import annotations

import os
import sys
import tempfile


def main() -> None:
    from smdp_batch import BatchingProblem, solve
    from smdp_batch.export.hdf5 import write_policy

    path = os.path.join(tempfile.mkdtemp(), "basic.h5")
    write_policy(solve(BatchingProblem.basic(rho=0.7, w2=1.6)), path)
    code = f"""
import time, numpy as np
t0 = time.perf_counter()
import smdp_batch.runtime as rt
t1 = time.perf_counter()
q = np.random.default_rng(0).integers(0, 200, 1_000_000)
best = []
for _ in range(5):
    t = time.perf_counter(); table = rt.PolicyTable.load({path!r}); b = table.decide_many(q); best.append(time.perf_counter() - t)
print(f"import smdp_batch.runtime: {{(t1 - t0) * 1e3:.1f}} ms (fresh interpreter)")
print(f"PolicyTable.load + decide_many(10^6): {{min(best) * 1e3:.2f}} ms (best of 5; target < 50 ms)")
t = time.perf_counter(); [table.decide(int(n)) for n in q[:100_000]]; d = time.perf_counter() - t
print(f"decide(n) one at a time: {{d / 1e5 * 1e9:.0f}} ns per call")
"""
    os.execv(sys.executable, [sys.executable, "-c", code])


if __name__ == "__main__":
    main()
