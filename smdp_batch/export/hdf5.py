"""HDF5 policy tables, schema 1 (DESIGN.md §4). Reading needs numpy and h5py only.

Layout::

    /                attrs: format="smdp-batch-policy", schema_version=1, creator, created (ISO 8601),
                            units_time="ms", units_energy="mJ", units_power="W", units_rate="1/ms"
    /policy          int32 (s_max+2,): batch size per queue length 0..s_max, then S_o;
                     for n > s_max serve policy[s_max] (paper 004 eq. 30)
    /inputs          attrs: lam, rho, w1, w2, service, latency, energy (model specs)
    /inputs/batch_sizes   int32;  /inputs/latency_ms, /inputs/energy_mj  float64 per batch size
    /truncation      attrs: smax, smax_auto, abstract_cost, delta, tol_delta
    /solution        attrs: avg_cost, solver, iterations, converged, eps, eta, span, gain_lo, gain_hi,
                            mean_latency_ms, mean_power_w, throughput, mean_batch_size, objective,
                            control_limit (-1 = none), solve_seconds
    /solution/relative_values  float64 (s_max+2,)

Files are written to a temporary file in the target folder and renamed into place, so a reader
never sees a half-written table.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from ..files import atomic_output
from ..errors import InputError, PolicyFileError

FORMAT = "smdp-batch-policy"
BANK_FORMAT = "smdp-batch-policy-bank"
SCHEMA_VERSION = 1

__all__ = ["FORMAT", "BANK_FORMAT", "SCHEMA_VERSION", "PolicyFile", "read_policy", "write_policy", "read_bank",
           "write_bank"]


def _creator() -> str:
    from .. import __version__

    return f"smdp-batch {__version__}"


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
        from ..runtime.table import eq30

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


def _write_atomically(path: str | os.PathLike, fmt: str, fill) -> Path:
    """Create an HDF5 file with the root attributes of ``fmt``, let ``fill(file)`` write it, rename into place."""
    with atomic_output(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs.update(
                {
                    "format": fmt,
                    "schema_version": SCHEMA_VERSION,
                    "creator": _creator(),
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "units_time": "ms",
                    "units_energy": "mJ",
                    "units_power": "W",
                    "units_rate": "1/ms",
                }
            )
            fill(f)
    return Path(path)


def _fill_table(f, solution) -> None:
    """Write one solution's policy, inputs, truncation and solution into the HDF5 group ``f``."""
    p, r, m = solution.problem, solution.result, solution.model
    d = solution.to_dict()
    f.create_dataset("policy", data=np.asarray(r.policy, dtype=np.int32))
    g = f.create_group("inputs")
    g.attrs.update(
        {"lam": p.lam, "rho": p.rho, "w1": p.w1, "w2": p.w2, "service": p.service.spec(),
         "latency": p.latency.spec(), "energy": p.energy.spec()}
    )
    g.create_dataset("batch_sizes", data=np.asarray(p.batch_sizes, dtype=np.int32))
    g.create_dataset("latency_ms", data=p.latency_ms())
    g.create_dataset("energy_mj", data=p.energy_mj())
    t = f.create_group("truncation")
    t.attrs.update(
        {"smax": m.s_max, "smax_auto": solution.smax_auto, "abstract_cost": m.abstract_cost,
         "delta": solution.evaluation.delta, "tol_delta": solution.tol_delta}
    )
    s = f.create_group("solution")
    cl = solution.control_limit
    s.attrs.update(
        {
            "avg_cost": d["avg_cost"], "solver": r.solver, "iterations": r.iterations,
            "converged": r.converged, "eps": np.nan if r.eps is None else r.eps,
            "eta": np.nan if r.eta is None else r.eta, "span": r.span,
            "gain_lo": r.gain_bracket[0], "gain_hi": r.gain_bracket[1],
            "mean_latency_ms": d["mean_latency_ms"], "mean_power_w": d["mean_power_w"],
            "throughput": d["throughput"], "mean_batch_size": d["mean_batch_size"],
            "objective": d["objective"], "control_limit": -1 if cl is None else cl,
            "solve_seconds": d["solve_seconds"], "summary_json": json.dumps(
                {k: v for k, v in d.items() if k != "policy"}),
        }
    )
    s.create_dataset("relative_values", data=np.asarray(r.relative_values, dtype=np.float64))


def write_policy(solution, path: str | os.PathLike) -> Path:
    """Write a :class:`~smdp_batch.solvers.Solution` as an HDF5 policy table, atomically."""
    return _write_atomically(path, FORMAT, lambda f: _fill_table(f, solution))


def write_bank(solutions, path: str | os.PathLike) -> Path:
    """Write solutions of one scenario over a grid of λ as a policy bank (``/tables/NNN``, λ ascending)."""
    sols = sorted(solutions, key=lambda s: s.problem.lam)
    if not sols:
        raise InputError("a policy bank needs at least one solution")
    lams = [s.problem.lam for s in sols]
    if len(set(lams)) != len(lams):
        raise InputError(f"a policy bank needs distinct arrival rates, got {lams}")
    ref = sols[0].problem.describe()
    for s in sols[1:]:
        other = s.problem.describe()
        diff = [k for k in ("batch_sizes", "latency", "energy", "service", "w1", "w2") if other[k] != ref[k]]
        if diff:
            raise InputError(f"the tables of a bank must differ only in λ; they also differ in {diff[0]}")

    def fill(f):
        f.create_dataset("lams", data=np.asarray(lams, dtype=np.float64))
        for i, s in enumerate(sols):
            _fill_table(f.create_group(f"tables/{i:03d}"), s)

    return _write_atomically(path, BANK_FORMAT, fill)


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


def _load_table(g, path: str, meta: dict) -> PolicyFile:
    try:
        policy = np.asarray(g["policy"][()], dtype=np.int64)
        inputs = _attrs(g["inputs"])
        for name in ("batch_sizes", "latency_ms", "energy_mj"):
            inputs[name] = g["inputs"][name][()]
        truncation = _attrs(g["truncation"])
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
