"""``@batched``: a function of a list of items served one request at a time by a DynamicBatcher, like Ray
Serve's ``@serve.batch``."""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any, Awaitable, Callable

from .batcher import DynamicBatcher
from .table import PolicyTable

__all__ = ["batched"]


def batched(table: PolicyTable | str | os.PathLike | Callable[[int], int], max_wait_ms: float | str | None = "auto", *,
            lam: float | None = None, short_batch: str = "serve", pad_item: Any = None,
            batch_timeout_s: float | str | None = "default", infer_thread: bool = True, instances: int = 1):
    """Decorator like Ray Serve's ``@serve.batch``: ``async def f(items: list) -> list`` becomes
    ``async def f(item) -> result`` served by a :class:`DynamicBatcher` following ``table``, with the
    same options (``max_wait_ms`` default ``"auto"``, ``lam``, ``short_batch``, ``pad_item``,
    ``batch_timeout_s``, ``infer_thread``, ``instances``).

    One batcher per event loop (created on first call); ``f.batcher`` is the latest one.
    """
    if isinstance(table, (str, os.PathLike)):
        table = PolicyTable.load(table)
    opts = dict(lam=lam, short_batch=short_batch, pad_item=pad_item, batch_timeout_s=batch_timeout_s,
                infer_thread=infer_thread, instances=instances)
    DynamicBatcher(lambda items: items, table, max_wait_ms, **opts)  # validate the options now, not at the first request

    def wrap(func: Callable[[list], Awaitable[list]]):
        batchers: dict[int, tuple[asyncio.AbstractEventLoop, DynamicBatcher]] = {}

        @functools.wraps(func)
        async def single(item):
            loop = asyncio.get_running_loop()
            hit = batchers.get(id(loop))
            if hit is None or hit[0] is not loop:
                for key in [k for k, (lp, _) in batchers.items() if lp.is_closed()]:
                    del batchers[key]
                bt = DynamicBatcher(func, table, max_wait_ms, **opts)
                hit = batchers[id(loop)] = (loop, bt)
                single.batcher = bt
            return await hit[1].submit(item)

        single.batcher = None  # type: ignore[attr-defined]  # a function attribute
        return single

    return wrap
