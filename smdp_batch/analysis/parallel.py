"""Where a sweep's independent jobs run: in this process, or on a Dask cluster.

A *mapper* is ``mapper(fn, *iterables) -> list``, with the semantics of ``list(map(fn, *iterables))``:
:func:`local_map` runs the jobs here in order, :func:`thread_mapper` on threads of this process (for jobs whose
kernels release the GIL, as the solvers' do), :func:`dask_mapper` on a Dask cluster.
Sweeps (:mod:`smdp_batch.pareto`) hand it one round of independent solves or simulations at a time;
their results do not depend on the mapper, because every job is deterministic (solves are exact and
simulations carry their own seed) and the rounds are the same whatever runs them.

Dask (the ``dask`` extra) runs jobs on a scheduler at an address, or on a LocalCluster started for
the duration of a ``with`` block::

    with dask_mapper("local") as mapper:             # or "tcp://scheduler:8786"
        fronts = sweep_fronts(problems, mapper=mapper)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ..errors import InputError
from ..extras import require

__all__ = ["Mapper", "local_map", "thread_mapper", "dask_mapper"]

Mapper = Callable[..., list]


def local_map(fn, *iterables) -> list:
    """Run the jobs here, in order."""
    return list(map(fn, *iterables))


@contextlib.contextmanager
def thread_mapper(workers: int) -> Iterator[Mapper]:
    """A mapper on ``workers`` threads of this process for the duration of a ``with`` block; the results come in
    the jobs' order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(int(workers), thread_name_prefix="sweep") as pool:
        yield lambda fn, *iterables: list(pool.map(fn, *iterables))


@contextlib.contextmanager
def dask_mapper(address: str = "local", workers: int | None = None) -> Iterator[Mapper]:
    """A mapper on Dask: ``address`` "local" starts a LocalCluster (``workers`` processes, one thread
    each; default: the CPU count), else it is a scheduler address such as ``tcp://host:8786``."""
    distributed = require("dask.distributed", "a Dask sweep (--dask)")
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    if workers is not None and int(workers) < 1:
        raise InputError(f"a LocalCluster needs at least 1 worker, got {workers!r}")
    if not isinstance(address, str) or not address.strip():
        raise InputError(f"the Dask address must be 'local' or a scheduler address like tcp://host:8786, got {address!r}")
    cluster = None
    try:
        if address == "local":
            try:
                cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
            except (RuntimeError, OSError) as e:
                raise InputError(f"could not start a Dask LocalCluster: {e}") from None
            client = Client(cluster)
        else:
            try:
                client = Client(address, timeout="10s")
            except (OSError, TimeoutError, ValueError) as e:
                raise InputError(f"cannot reach the Dask scheduler at {address!r}: {e}") from None
        with client:

            def mapper(fn, *iterables) -> list:
                args = [list(it) for it in iterables]
                if not args or not args[0]:
                    return []
                return client.gather(client.map(fn, *args, pure=False))

            yield mapper
    finally:
        if cluster is not None:
            cluster.close()
