"""One BLAS thread for the solver kernels (threadpoolctl).

The kernels' BLAS calls are small (an A × band product per policy improvement, banded LAPACK
solves).  OpenBLAS wakes its threads for them anyway, and on the 2-core development machine that
costs more than it saves: policy iteration on the basic scenario at s_max = 512 took ~30 ms with
OpenBLAS's 2 threads against 3 ms with one, and 62 ms against 53 ms at s_max = 4 096 (measured
side by side in one process).  :func:`single_blas` limits BLAS to one thread for the duration of a
solve; the limit is process-wide while it holds and is restored afterwards.

threadpoolctl's own ``limit`` context re-reads every library's state on entry (~11 µs), a third of a
small solve's time (policy iteration at Bmax 32, s_max 70: ~0.3 ms); the context here asks each BLAS
library found once for its thread count and sets only those above one (~1 µs).
"""

from __future__ import annotations

__all__ = ["single_blas"]

_libraries: list | None = None  # threadpoolctl's controllers of the BLAS libraries loaded (found once)


class _OneThread:
    """BLAS at one thread inside the ``with`` block; each library's count is restored on exit."""

    __slots__ = ("_restore",)

    def __enter__(self) -> "_OneThread":
        self._restore = []
        for lib in _libraries or ():
            n = lib.num_threads
            if n != 1:
                lib.set_num_threads(1)
                self._restore.append((lib, n))
        return self

    def __exit__(self, *exc) -> None:
        for lib, n in self._restore:
            lib.set_num_threads(n)


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
