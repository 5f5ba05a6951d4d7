"""Writing HDF5 policy tables and λ-banks (schema and reader: :mod:`smdp_batch.runtime.schema`).

Files are written to a temporary file in the target folder and renamed into place, so a reader
never sees a half-written table.  Every dataset carries HDF5 fletcher32 checksums and every table
its ``content_sha256`` (:func:`~smdp_batch.runtime.schema.table_digest`), so the reader refuses a
damaged file instead of serving from it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import h5py
import numpy as np

from ..errors import InputError
from ..files import atomic_output
from ..runtime.phase_file import phase_digest
from ..runtime.table import control_limit
from ..runtime.schema import BANK_FORMAT, FORMAT, PHASE_SCHEMA_VERSION, SCHEMA_VERSION, table_digest

__all__ = ["write_policy", "write_bank", "write_phase_policy", "write_instances_policy"]


def _creator() -> str:
    from .. import __version__

    return f"smdp-batch {__version__}"


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


def _dataset(group, name: str, data) -> None:
    """A dataset with HDF5 fletcher32 checksums (h5py chunks it): a damaged chunk fails to read."""
    group.create_dataset(name, data=data, fletcher32=True)


def _write_inputs(f, p, idle_power_w: float = 0.0):
    """The /inputs group of a problem; returns (scalar inputs, batch sizes, l(b), ζ(b)) for the digest."""
    sizes = np.asarray(p.batch_sizes, dtype=np.int32)
    latency, energy = np.asarray(p.latency_ms(), dtype=np.float64), np.asarray(p.energy_mj(), dtype=np.float64)
    inputs = {"lam": float(p.lam), "rho": float(p.rho), "w1": float(p.w1), "w2": float(p.w2),
              "service": p.service.spec(), "latency": p.latency.spec(), "energy": p.energy.spec()}
    if p.instances > 1 or idle_power_w:  # a c-server table (absent: one instance, no idle power)
        inputs.update(instances=int(p.instances), idle_power_w=float(idle_power_w))
        if p.contention is not None and p.instances > 1:  # absent: instances that do not slow each other
            inputs["contention"] = p.contention.spec()
    g = f.create_group("inputs")
    g.attrs.update(inputs)
    _dataset(g, "batch_sizes", sizes)
    _dataset(g, "latency_ms", latency)
    _dataset(g, "energy_mj", energy)
    return inputs, sizes, latency, energy


def _fill_table(f, solution) -> None:
    """Write one solution's policy, inputs, truncation and solution into the HDF5 group ``f``."""
    p, r, m = solution.problem, solution.result, solution.model
    d = solution.to_dict()
    policy = np.asarray(solution.policy, dtype=np.int32)
    values = np.asarray(r.relative_values, dtype=np.float64)
    _dataset(f, "policy", policy)
    inputs, sizes, latency, energy = _write_inputs(f, p)
    t = f.create_group("truncation")
    t.attrs.update(
        {"s_max": m.s_max, "s_max_auto": solution.s_max_auto, "abstract_cost": m.abstract_cost,
         "delta": solution.evaluation.delta, "tol_delta": solution.tol_delta, "s_max_rule": solution.rule,
         "converged_upto": -1 if solution.converged_upto is None else solution.converged_upto,
         "boundary": m.boundary}
    )
    if solution.verified_against is not None:  # the exponential rule's pair
        t.attrs["verified_against"] = int(solution.verified_against)
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
    _dataset(s, "relative_values", values)
    f.attrs["content_sha256"] = table_digest(policy, sizes, latency, energy, values, inputs, m.s_max)


def _fill_instances_table(f, sol, idle_power_w: float) -> None:
    """A c-server table (:class:`~smdp_batch.solvers.multi_pi.MultiSolution`) in the version-1 layout: its table
    n ↦ b for n = 0..N (s_max = N; above N every instance serves Bmax, the tail boundary, so the S_o entry
    repeats it), the table's exact metrics, and its relative values with every instance idle; where the solve
    kept one, its busy-aware rows too (``/policy_busy``; the metrics stay the table n ↦ b's)."""
    p, ev = sol.problem, sol.table_eval
    policy = np.append(sol.table, sol.table[-1]).astype(np.int32)
    values = np.append(sol.table_values, sol.table_values[-1]).astype(np.float64)
    _dataset(f, "policy", policy)
    inputs, sizes, latency, energy = _write_inputs(f, p, idle_power_w)
    inputs["phases"] = int(sol.phases)  # how it was solved: evaluate rebuilds the same model (in the digest)
    f["inputs"].attrs.update({"batch_time_model": sol.phase_law, "phases": int(sol.phases)})
    t = f.create_group("truncation")
    t.attrs.update({"s_max": sol.n_max, "s_max_auto": True, "abstract_cost": 0.0,
                    "delta": 0.0 if np.isnan(sol.delta) else sol.delta, "tol_delta": 1e-7, "s_max_rule": "auto",
                    "converged_upto": sol.agrees_upto, "boundary": "tail"})
    d = sol.to_dict()
    s = f.create_group("solution")
    cl = control_limit(sol.table, p.batch_sizes)
    s.attrs.update({
        "avg_cost": ev.avg_cost, "solver": "c-server policy iteration", "iterations": sol.iterations,
        "converged": sol.converged, "eps": np.nan, "eta": np.nan, "span": np.nan, "gain_lo": np.nan,
        "gain_hi": np.nan, "mean_latency_ms": ev.mean_latency_ms, "mean_power_w": ev.mean_power_w,
        "throughput": ev.throughput, "mean_batch_size": ev.mean_batch, "objective": ev.avg_cost,
        "control_limit": -1 if cl is None else cl, "solve_seconds": sol.solve_time_s,
        "summary_json": json.dumps({k: v for k, v in d.items() if k not in ("table", "busy_table")}),
    })
    _dataset(s, "relative_values", values)
    busy = None
    if sol.busy_table is not None and sol.busy_eval is not None:  # the rows a runtime that counts its batches follows
        busy = np.concatenate([sol.busy_table, sol.busy_table[:, -1:]], axis=1).astype(np.int32)
        _dataset(f, "policy_busy", busy)
        b = sol.busy_eval
        s.attrs.update({"busy_avg_cost": b.avg_cost, "busy_mean_latency_ms": b.mean_latency_ms,
                        "busy_mean_power_w": b.mean_power_w})
    f.attrs["content_sha256"] = table_digest(policy, sizes, latency, energy, values, inputs, sol.n_max, busy)


def write_instances_policy(solution, path: str | os.PathLike, idle_power_w: float = 0.0) -> Path:
    """Write a c-server table (:func:`~smdp_batch.solvers.multi_pi.solve_instances`) as an HDF5 policy table,
    atomically: ``inputs@instances`` names the count it was solved for (the readers run it on that many)."""
    return _write_atomically(path, FORMAT, lambda f: _fill_instances_table(f, solution, idle_power_w))


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
        _dataset(f, "lams", np.asarray(lams, dtype=np.float64))
        for i, s in enumerate(sols):
            _fill_table(f.create_group(f"tables/{i:03d}"), s)

    return _write_atomically(path, BANK_FORMAT, fill)


def write_phase_policy(solution, path: str | os.PathLike) -> Path:
    """Write a :class:`~smdp_batch.solvers.map_solution.MapSolution` as a phase table (schema_version 2), atomically."""
    def fill(f):
        f.attrs["schema_version"] = PHASE_SCHEMA_VERSION
        p, r, m = solution.problem, solution.result, solution.model
        d = solution.to_dict()
        R = solution.stored_range
        policy = np.asarray(solution.table, dtype=np.int32)
        values = np.asarray(r.relative_values, dtype=np.float64)
        qv = np.asarray(solution.qvalues[: R + 1], dtype=np.float64)
        _dataset(f, "policy", policy)
        inputs, sizes, latency, energy = _write_inputs(f, p)
        a = f.create_group("arrivals")
        a.attrs.update({"spec": solution.arrivals.spec(), "rate": solution.arrivals.rate})
        _dataset(a, "D0", solution.arrivals.D0)
        _dataset(a, "D1", solution.arrivals.D1)
        t = f.create_group("truncation")
        t.attrs.update({"s_max": m.s_max, "s_max_auto": solution.rule == "auto", "abstract_cost": m.abstract_cost,
                        "delta": solution.evaluation.delta, "tol_delta": solution.tol_delta, "s_max_rule": solution.rule,
                        "converged_upto": -1 if solution.converged_upto is None else solution.converged_upto})
        s = f.create_group("solution")
        s.attrs.update({"avg_cost": d["avg_cost"], "iterations": r.iterations, "converged": r.converged,
                        "mean_latency_ms": d["mean_latency_ms"], "mean_power_w": d["mean_power_w"],
                        "objective": d["objective"], "solve_seconds": d["solve_seconds"],
                        "summary_json": json.dumps({k: v for k, v in d.items() if k != "policy"})})
        _dataset(s, "relative_values", values)
        _dataset(s, "qvalues", qv)
        _dataset(s, "actions", np.asarray(m.actions, dtype=np.int32))
        feas = m.actions[None, None, :] <= np.arange(R + 1)[:, None, None]
        f.attrs["content_sha256"] = phase_digest(policy, solution.arrivals.D0, solution.arrivals.D1,
                                                 np.where(feas, qv, 0.0), sizes, latency, energy, values, inputs, m.s_max)
    return _write_atomically(path, FORMAT, fill)
