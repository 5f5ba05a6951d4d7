"""The HDF5 policy-table schema (version 1) and its one reader.  numpy and h5py only.

Both sides of the file format live here: the writer (:mod:`smdp_batch.export.hdf5`) takes the
format names and version from this module, and every reader — :class:`~smdp_batch.runtime.PolicyTable`,
:class:`~smdp_batch.runtime.PolicyBank`, the CLI's ``show``/``evaluate``/``export``, the
simulator's ``FILE.h5`` policies — goes through :func:`read_policy` / :func:`read_bank`.

Layout (DESIGN.md §4)::

    /                attrs: format="smdp-batch-policy", schema_version=1, creator, created (ISO 8601),
                            units_time="ms", units_energy="mJ", units_power="W", units_rate="1/ms"
    /policy          int32 (s_max+2,): batch size per queue length 0..s_max, then S_o;
                     for n > s_max serve policy[s_max] (paper 004 eq. 30, :func:`eq30`)
    /inputs          attrs: lam, rho, w1, w2, service, latency, energy (model specs)
    /inputs/batch_sizes   int32;  /inputs/latency_ms, /inputs/energy_mj  float64 per batch size
    /truncation      attrs: s_max, s_max_auto, abstract_cost, delta, tol_delta
                     (files written before 0.2 say smax, smax_auto: read as s_max, s_max_auto)
    /solution        attrs: avg_cost, solver, iterations, converged, eps, eta, span, gain_lo, gain_hi,
                            mean_latency_ms, mean_power_w, throughput, mean_batch_size, objective,
                            control_limit (-1 = none), solve_seconds
    /solution/relative_values  float64 (s_max+2,)

A policy bank (``format="smdp-batch-policy-bank"``) holds ``/lams`` (float64, ascending) and one
such table per rate under ``/tables/000``, ``/tables/001``, …
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field

import h5py
import numpy as np

from ..errors import InputError, PolicyFileError

FORMAT = "smdp-batch-policy"
BANK_FORMAT = "smdp-batch-policy-bank"
SCHEMA_VERSION = 1

__all__ = ["FORMAT", "BANK_FORMAT", "SCHEMA_VERSION", "PolicyFile", "eq30", "read_policy", "read_bank"]


def eq30(policy: np.ndarray, s_max: int, n: int) -> int:
    """Batch size for queue length n: policy[min(n, s_max)] (paper 004 eq. 30).

    A queue length is an integer (``int`` or a numpy integer) ≥ 0.  Floats — even integral ones
    like 3.0 — NaN, bools and negatives raise :class:`InputError`; nothing is rounded.
    """
    if type(n) is not int:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
            raise InputError(f"a queue length must be an integer ≥ 0, got {n!r} ({type(n).__name__})")
        n = int(n)
    if n < 0:
        raise InputError(f"a queue length must be an integer ≥ 0, got {n}")
    return int(policy[n if n < s_max else s_max])


@dataclass(frozen=True)
class PolicyFile:
    """A loaded policy table: the policy array and every stored attribute."""

    policy: np.ndarray
    inputs: dict
    truncation: dict
    solution: dict
    meta: dict = field(default_factory=dict)
    path: str | None = None

    @property
    def s_max(self) -> int:
        return self.policy.size - 2

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(int(b) for b in self.inputs["batch_sizes"])

    def decide(self, n: int) -> int:
        """Batch size for queue length n ≥ 0 (n > s_max uses the s_max action, eq. 30)."""
        return eq30(self.policy, self.s_max, n)


def _attrs(group) -> dict:
    out = {}
    for k, v in group.attrs.items():
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out


def _open(path: str, fmt: str):
    """Open an smdp-batch HDF5 file and check its format and schema version."""
    if not os.path.isfile(path):
        raise PolicyFileError(f"policy file {path!r} does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise PolicyFileError(f"{path!r} is not an HDF5 file (expected a {fmt} file written by smdp-batch)") from None
    meta = _attrs(f)
    if meta.get("format") != fmt:
        f.close()
        names = {FORMAT: "smdp-batch policy table", BANK_FORMAT: "smdp-batch policy bank"}
        hint = {FORMAT: "; it is a policy table (use read_policy / PolicyTable.load)",
                BANK_FORMAT: "; it is a policy bank (use read_bank / PolicyBank.load)"}
        raise PolicyFileError(
            f"{path!r} is not a {names[fmt]} (format={meta.get('format')!r}, expected {fmt!r})"
            f"{hint.get(meta.get('format'), '')}"
        )
    version = meta.get("schema_version")
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        f.close()
        raise PolicyFileError(
            f"{path!r} has schema_version={version!r}; this smdp-batch reads versions 1..{SCHEMA_VERSION} "
            "(upgrade smdp-batch to read newer tables)"
        )
    return f, meta


_OLD_TRUNCATION_NAMES = {"smax": "s_max", "smax_auto": "s_max_auto"}


def _renamed(attrs: dict, names: dict) -> dict:
    """``attrs`` with old attribute names mapped to the current ones (old files keep loading)."""
    return {names.get(k, k): v for k, v in attrs.items()}


def _load_table(g, path: str, meta: dict) -> PolicyFile:
    try:
        policy = np.asarray(g["policy"][()], dtype=np.int64)
        inputs = _attrs(g["inputs"])
        for name in ("batch_sizes", "latency_ms", "energy_mj"):
            inputs[name] = g["inputs"][name][()]
        truncation = _renamed(_attrs(g["truncation"]), _OLD_TRUNCATION_NAMES)
        solution = _attrs(g["solution"])
        solution["relative_values"] = g["solution"]["relative_values"][()]
    except KeyError as e:
        raise PolicyFileError(f"{path!r} is missing {e.args[0]!r}: a damaged policy table") from None
    if policy.ndim != 1 or policy.size < 3 or np.any(policy < 0):
        raise PolicyFileError(f"{path!r}: the policy dataset must be a 1-D array of batch sizes ≥ 0")
    allowed = set(int(b) for b in inputs["batch_sizes"]) | {0}
    if not set(int(a) for a in policy) <= allowed:
        raise PolicyFileError(f"{path!r}: the policy uses batch sizes outside its stored batch-size set")
    return PolicyFile(policy, inputs, truncation, solution, meta, path)


def read_policy(path: str | os.PathLike) -> PolicyFile:
    """Load and validate a policy table; refuses other formats and newer schema versions."""
    path = str(path)
    f, meta = _open(path, FORMAT)
    with f:
        return _load_table(f, path, meta)


def read_bank(path: str | os.PathLike) -> list[PolicyFile]:
    """Load a policy bank: its tables, λ ascending."""
    path = str(path)
    f, meta = _open(path, BANK_FORMAT)
    with f:
        if "tables" not in f:
            raise PolicyFileError(f"{path!r} is missing 'tables': a damaged policy bank")
        tables = [_load_table(f["tables"][k], path, meta) for k in sorted(f["tables"])]
    lams = [t.inputs["lam"] for t in tables]
    if not tables or any(b <= a for a, b in zip(lams, lams[1:])):
        raise PolicyFileError(f"{path!r}: a policy bank needs tables with increasing λ")
    return tables
