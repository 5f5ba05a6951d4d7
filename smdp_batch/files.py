"""Atomic output files: write beside the target, rename into place, leave nothing half-written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from .errors import InputError

__all__ = ["atomic_output"]


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary path in ``path``'s folder; rename it onto ``path`` on success, remove it on error."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"output folder {folder!r} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
