"""Every example in the package's docstrings runs and prints what it shows (``>>>`` lines)."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "smdp_batch"
MODULES = sorted(
    "smdp_batch." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
    for p in PACKAGE.rglob("*.py")
    if ">>> " in p.read_text(encoding="utf-8")
)


def test_there_are_examples():
    assert len(MODULES) >= 5, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} fail (run doctest on it)"
