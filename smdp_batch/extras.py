"""Optional dependencies: :func:`require` imports one or says, in one line, which extra installs it.

The core install (numpy, scipy, numba, h5py, click, threadpoolctl) runs solve, evaluate, simulate,
compare, pareto, tables, export, show and profile.  Everything else is an extra (pyproject.toml), and every
optional import goes through here, so a missing one is an :class:`~smdp_batch.errors.InputError`
("fit-arrivals needs hmmlearn: pip install 'smdp-batch[bursty]'"; the CLI prints it and exits 2).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import InputError

__all__ = ["EXTRAS", "missing", "require"]

#: top-level module → (the package that provides it, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "hmmlearn": ("hmmlearn", "bursty"),
    "matplotlib": ("matplotlib", "plot"),
    "jax": ("JAX", "jax"),
    "dask": ("dask[distributed]", "dask"),
    "ray": ("ray[serve]", "ray"),
    "tritonclient": ("tritonclient", "triton"),
    "pytriton": ("nvidia-pytriton", "triton"),
    "pynvml": ("nvidia-ml-py", "measure"),
    "zeus": ("zeus", "measure"),
    "tqdm": ("tqdm", "measure"),
    "prometheus_client": ("prometheus_client", "metrics"),
    "httpx": ("httpx", "calibrate"),
}

#: PyTriton is installed apart from its extra (its numpy<2 pin cannot be met beside jax>=0.8)
_AFTER = {"pytriton": ' && pip install --no-deps "nvidia-pytriton==0.7.0"'}


def missing(module: str, what: str) -> InputError:
    """The one-line error for ``what`` (a command or feature) without ``module``."""
    top = module.split(".")[0]
    package, extra = EXTRAS.get(top, (top, "all"))
    return InputError(f"{what} needs {package}: pip install 'smdp-batch[{extra}]'{_AFTER.get(top, '')}")


def require(module: str, what: str) -> ModuleType:
    """``module`` imported, or :func:`missing`'s InputError when it (or one of its own imports) is absent."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise missing(module, what) from None
