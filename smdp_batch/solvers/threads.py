"""One BLAS thread for the solver kernels (threadpoolctl).

The kernels' BLAS calls are small (an A × band product per policy improvement, banded LAPACK
solves).  OpenBLAS wakes its threads for them anyway, and on the 2-core development machine that
costs more than it saves: policy iteration on the basic scenario at s_max = 512 took ~30 ms with
OpenBLAS's 2 threads against 3 ms with one, and 62 ms against 53 ms at s_max = 4 096 (measured
side by side in one process).  :func:`single_blas` limits BLAS to one thread for the duration of a
solve; the limit is process-wide while it holds and is restored afterwards.
"""

from __future__ import annotations

import contextlib

__all__ = ["single_blas"]

_controller = None


def single_blas():
    """Context manager: BLAS limited to one thread (a no-op without threadpoolctl)."""
    global _controller
    try:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        return _controller.limit(limits=1, user_api="blas")
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return contextlib.nullcontext()
