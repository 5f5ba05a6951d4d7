"""One BLAS thread for the solver kernels (threadpoolctl).

The kernels' BLAS calls are small (an A × band product per policy improvement, banded LAPACK
solves).  OpenBLAS wakes its threads for them anyway, and on the 2-core development machine that
costs more than it saves: policy iteration on the basic scenario at s_max = 512 took ~30 ms with
OpenBLAS's 2 threads against 3 ms with one, and 62 ms against 53 ms at s_max = 4 096 (measured
side by side in one process).  :func:`single_blas` limits BLAS to one thread for the duration of a
solve; the limit is process-wide while it holds and is restored afterwards.

The limit is process-wide, and solves run on several threads at once (the SLO search solves a capped front
while it searches another family's settings), so the contexts are counted: each entry sets one thread
where a library reads more, the count from before the first is kept, and the last to leave restores it.
Saving and restoring per context let one solve's exit give BLAS its threads back under another solve still
running (before, each context saved and restored the counts on its own).

Set it from the thread that starts the work: with the OpenBLAS builds NumPy and SciPy ship (0.3.30–0.3.31,
pthreads), a count set on a worker thread did not hold the BLAS calls there to one core (measured: 400 × 400
products on a worker took 1.7 s of CPU per second of wall time after the worker set one thread, 1.0 after the
main thread did).  So the long-running searches (the SLO search) hold one BLAS thread for their whole run from
the thread that called them.

threadpoolctl's own ``limit`` context re-reads every library's state on entry (~11 µs), a third of a
small solve's time (policy iteration at Bmax 32, s_max 70: ~0.3 ms); the context here asks each BLAS
library found once for its thread count and sets only those above one (~1 µs).
"""

from __future__ import annotations

import threading

__all__ = ["single_blas"]

_libraries: list | None = None  # threadpoolctl's controllers of the BLAS libraries loaded (found once)
_lock = threading.Lock()
_depth = 0  # the contexts open now, on any thread
_restore: dict[int, tuple] = {}  # id(library) → (library, the thread count it had before the first context)


class _OneThread:
    """BLAS at one thread while any such ``with`` block is open; each library's count is restored when the last
    one closes (module doc).  Every entry sets one thread where a library reads more (a count set on another
    thread may not have held), and keeps the count it had before the first."""

    __slots__ = ()

    def __enter__(self) -> "_OneThread":
        global _depth
        with _lock:
            for lib in _libraries or ():
                n = lib.num_threads
                if n != 1:
                    lib.set_num_threads(1)
                    _restore.setdefault(id(lib), (lib, n))
            _depth += 1
        return self

    def __exit__(self, *exc) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0:
                for lib, n in _restore.values():
                    lib.set_num_threads(n)
                _restore.clear()


def single_blas() -> _OneThread:
    """Context manager: BLAS limited to one thread (a no-op without threadpoolctl).

    The libraries are those loaded at the first call (the solvers' modules load NumPy's and SciPy's on
    import)."""
    global _libraries
    if _libraries is None:
        try:
            from threadpoolctl import ThreadpoolController

            _libraries = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            _libraries = []
    return _OneThread()
