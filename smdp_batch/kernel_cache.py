"""numba's on-disk cache, made safe across edits of the kernels: every kernel module imports ``njit`` from here.

numba keys a cached kernel by its *own* source file's stamp, but the machine code it stores also holds the
kernels it calls or inlines from other files (``banded.evaluate_policy_banded`` calls
``kernels.policy_residual``; ``rvi.rvi_loop`` inlines ``kernels.expected_next``).  After an edit of one
kernel file alone — a ``git pull`` into the editable install the README recommends — numba would load the
callers' stale code, built against the old callee: wrong numbers or an out-of-bounds read.  numba's
documentation names the limit ("changes in other files are not detected").

So the stamp of every smdp-batch kernel also carries one digest of the source of *all* the package's
kernel modules (:data:`KERNEL_MODULES`): an edit of any of them makes every smdp-batch kernel compile
once more (a few seconds on the next run), and other packages' caches are untouched.  This is done by
putting, in front of numba's cache locators, subclasses that add the digest and take only this
package's functions.  Where numba's cache internals are not as expected, nothing is changed (numba's own
behaviour).

One more rule keeps a kernel's *last bits* from depending on the cache's history.  A kernel that calls another
one compiled separately links the callee's machine code when the callee came from the cache, and inlines its
fresh IR when the callee was compiled in the same process; with fast-math flags on the caller's side (LLVM
applies them to what it inlines) or the callee's (its reductions vectorised one way or another), the two give
other round-off — measured: ĝ of one policy moved in its 16th digit depending on which process had compiled the
stationary-law kernels.  So a fast-math kernel calls only kernels inlined at numba's IR level
(``inline="always"``), and a fast-math kernel that other kernels call is itself inlined there
(``tests/test_jit.py`` checks both over every kernel module).
"""

from __future__ import annotations

import hashlib
import os

from numba import njit
from numba.core import caching

__all__ = ["KERNEL_MODULES", "kernel_digest", "njit"]

#: The modules (relative to the package folder) that hold numba kernels; tests check the list is complete.
KERNEL_MODULES = (
    "analysis/power_floor.py", "analysis/quantiles.py", "analysis/sim_kernels.py", "analysis/sim_replicas.py", "llm/binsim.py", "model/arrivals.py", "model/map_likelihood.py", "model/map_truncation.py",
    "solvers/banded.py", "solvers/geometric.py", "solvers/geometric_sums.py", "solvers/kernels.py", "solvers/map_pi.py", "solvers/pi_compiled.py",
    "solvers/rvi.py",
)

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def kernel_digest(package_dir: str = _PACKAGE) -> str:
    """SHA-256 of the kernel modules' bytes under ``package_dir`` (a missing file counts as empty)."""
    h = hashlib.sha256()
    for rel in KERNEL_MODULES:
        h.update(rel.encode())
        try:
            with open(os.path.join(package_dir, rel), "rb") as fh:
                h.update(fh.read())
        except OSError:
            h.update(b"\0missing")
    return h.hexdigest()


def _install() -> None:
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if not isinstance(classes, list) or any(getattr(c, "_smdp_batch", False) for c in classes):
        return
    digest = kernel_digest()
    ours = []
    for base in classes:
        if not (hasattr(base, "get_source_stamp") and hasattr(base, "from_function")):
            return

        def get_source_stamp(self, _base=base):
            return (_base.get_source_stamp(self), digest)

        def from_function(cls, py_func, py_file, _base=base):
            if not str(getattr(py_func, "__module__", "")).startswith("smdp_batch."):
                return None
            return _base.from_function.__func__(cls, py_func, py_file)

        ours.append(type(f"SmdpBatch{base.__name__}", (base,), {
            "_smdp_batch": True, "get_source_stamp": get_source_stamp, "from_function": classmethod(from_function)}))
    classes[:0] = ours


_install()
