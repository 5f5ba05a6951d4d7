"""The Autopilot's hooks never raise: a batcher calls them on its serving path, where an exception would fail requests.

:func:`never_raises` wraps a hook: whatever its body raises is counted (the metrics' ``rejected_inputs``, from the
Autopilot's ``_hook_errors``) and logged as one JSON line, and serving goes on with the live plan.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable

__all__ = ["never_raises", "served_hook"]


def served_hook(policy: Any) -> tuple[Callable[..., None] | None, bool]:
    """``(tell, pairs)``: ``tell(ms, batch_ms=None)`` passes end-to-end times (ms) to the policy's ``observe_served``
    (None without one), with the batcher's view beside them where given and where the hook takes it; ``pairs``:
    whether it does (the Autopilot's, which learns the outside delay from the pair; a user's one-argument hook is
    told the times alone)."""
    hook = getattr(policy, "observe_served", None)
    if hook is None:
        return None, False
    if "batch_ms" not in inspect.signature(hook).parameters:
        return lambda ms, batch_ms=None: hook(ms), False

    def tell(ms: Any, batch_ms: Any = None) -> None:
        if batch_ms is None:
            hook(ms)
        else:
            hook(ms, batch_ms=batch_ms)

    return tell, True


def never_raises(hook: Callable[..., None]) -> Callable[..., None]:
    """An Autopilot hook that never raises: whatever its body raises is counted (``rejected_inputs``) and logged."""

    @functools.wraps(hook)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a hook never stops serving
            with self._lock:
                self._hook_errors += 1
            self._count(None, "hook-error", logging.WARNING, hook=hook.__name__, error=repr(exc)[:200])

    return wrapper
