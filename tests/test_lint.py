"""Lint and types: ``ruff check .`` and ``mypy`` (their settings are in pyproject.toml) pass on the tree.

Both tools come with the dev extra; a missing one fails here rather than skipping.  mypy keeps its cache in
``.mypy_cache`` at the repository root (it writes its own .gitignore there): ~10 s cold, under 1 s warm.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float) -> None:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


def test_ruff_is_clean():
    _run("ruff", "check", ".", timeout=120)


def test_mypy_is_clean():
    _run("mypy", timeout=600)
