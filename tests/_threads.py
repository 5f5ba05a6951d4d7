"""Calls that might never return, run so that a test fails instead of hanging."""

from __future__ import annotations

import asyncio
import threading


def returns_within(fn, timeout: float = 5.0, what: str = "the call"):
    """``fn()`` in a daemon thread: its value or exception, or a failure (not a hang) after ``timeout`` s."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"{what} did not finish within {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def loop_within(coro_fn, timeout: float = 10.0):
    """``asyncio.run(coro_fn())`` through :func:`returns_within`."""
    return returns_within(lambda: asyncio.run(coro_fn()), timeout, "the event loop")
