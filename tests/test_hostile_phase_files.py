"""Hostile phase tables (schema_version 2): missing or broken digests, declared shapes far beyond any table,
and stored values that contradict the stored decisions.

Each crafted file must be refused fast, with bounded memory, as one PolicyFileError naming the file —
through read_phase_policy, PhasePolicy.load and the CLI (``show``, ``simulate --policy``: exit 2, one
``smdp-batch: error:`` line).  The consistency cases re-sign the file (a digest anyone can recompute), so
only the content checks stand between the file and the batcher.
"""

from __future__ import annotations

import os
import shutil
import time
import tracemalloc

import h5py
import numpy as np
import pytest

from smdp_batch.cli import main
from smdp_batch.errors import InputError, PolicyFileError
from smdp_batch.export.hdf5 import write_phase_policy
from smdp_batch.limits import PHASE_TABLE_STATE_LIMIT, PHASE_TABLE_VALUES_LIMIT
from smdp_batch.model.arrivals import MAP
from smdp_batch.runtime import PhasePolicy, read_phase_policy
from smdp_batch.specs.mapcheck import check_map
from smdp_batch.runtime.phase_file import phase_digest
from smdp_batch.solvers.map_solution import map_problem, solve_map

BURSTY = MAP.mmpp([0.6, 2.4], [0.02, 0.02])


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A valid phase table (2 phases, sizes 1, 2, 4, 8; converged up to R < s_max)."""
    sol = solve_map(map_problem(BURSTY, w2=1.0, batch_sizes=(1, 2, 4, 8)), BURSTY)
    assert sol.converged_upto is not None and sol.converged_upto < sol.s_max
    return str(write_phase_policy(sol, tmp_path_factory.mktemp("phase") / "good.h5"))


def crafted(good, tmp_path, edit, sign=False, name="x.h5"):
    """A copy of the good table changed by ``edit(h5py.File)``; ``sign``: then given a matching digest."""
    path = tmp_path / name
    shutil.copy(good, path)
    with h5py.File(path, "a") as f:
        edit(f)
        if sign:
            resign(f)
    return str(path)


def resign(f) -> None:
    """content_sha256 recomputed from the file's arrays, as the writer computes it."""
    gi, gs = f["inputs"], f["solution"]
    inputs = {k: float(gi.attrs[k]) for k in ("lam", "rho", "w1", "w2")}
    inputs.update({k: str(gi.attrs[k]) for k in ("service", "latency", "energy")})
    D0, D1 = f["arrivals/D0"][()], f["arrivals/D1"][()]
    try:
        D0, D1, _, _ = check_map(D0, D1)  # the reader digests D0 with its diagonal made exact
    except InputError:
        pass
    qv, acts = gs["qvalues"][()], gs["actions"][()]
    feas = acts[None, None, :] <= np.arange(qv.shape[0])[:, None, None]
    f.attrs["content_sha256"] = phase_digest(
        f["policy"][()], D0, D1, np.where(feas, qv, 0.0), gi["batch_sizes"][()], gi["latency_ms"][()],
        gi["energy_mj"][()], gs["relative_values"][()], inputs, int(f["truncation"].attrs["s_max"]))


def refused(capsys, path, *match) -> str:
    """Refused by both loaders and by ``show`` and ``simulate --policy``: one line naming the file and ``match``."""
    for load in (read_phase_policy, PhasePolicy.load):
        with pytest.raises(PolicyFileError) as e:
            load(path)
        msg = str(e.value)
        assert repr(str(path)) in msg and "\n" not in msg, msg
        for m in match:
            assert m in msg, (m, msg)
    for args in (["show", path], ["simulate", "--policy", path, "--requests", "2000"]):
        capsys.readouterr()
        rc = main(args)
        out, err = capsys.readouterr()
        assert rc == 2, (args, out, err)
        assert err.startswith("smdp-batch: error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err and out == "", err
        assert "written before checksums" not in err
    return msg


def test_the_good_table_loads_and_says_its_checksums(good, tmp_path, capsys):
    pf = read_phase_policy(good)
    assert pf.integrity == "fletcher32+sha256"
    assert main(["show", good]) == 0
    assert "fletcher32+sha256 checksums verified" in capsys.readouterr().out
    # re-signing an untouched file changes nothing: the helper computes what the writer computes
    with h5py.File(good, "r") as f:
        before = f.attrs["content_sha256"]
    copy = crafted(good, tmp_path, lambda f: None, sign=True)
    with h5py.File(copy, "r") as f:
        assert f.attrs["content_sha256"] == before


# ----------------------------------------------------------------------------------------- the digest
def _drop(f):
    del f.attrs["content_sha256"]


def _set(value, dtype=None):
    def edit(f):
        del f.attrs["content_sha256"]
        if dtype is None:
            f.attrs["content_sha256"] = value
        else:
            f.attrs.create("content_sha256", value, dtype=dtype)
    return edit


def _moved(f):
    d = f.attrs["content_sha256"]
    del f.attrs["content_sha256"]
    f["solution"].attrs["content_sha256"] = d


@pytest.mark.parametrize("edit,match", [
    (_drop, "content_sha256 is missing"),
    (_moved, "content_sha256 is missing"),
    (_set(12345), "expected a string"),
    (_set(np.array(["a" * 64, "b" * 64], dtype=h5py.string_dtype())), "expected a scalar"),
    (_set(""), "64 lowercase hex digits"),
    (_set("ab" * 16), "64 lowercase hex digits"),
    (_set("z" * 64), "64 lowercase hex digits"),
    (_set(np.void(b"\xff" * 64)), "expected a string"),
    (_set(b"\xff" * 64, h5py.string_dtype("ascii", 64)), "not UTF-8"),
    (_set("0" * 64), "checksum mismatch"),
], ids=["removed", "moved", "int", "array", "empty", "short", "not-hex", "opaque", "bad-utf8", "other-digest"])
def test_a_phase_table_without_a_good_digest_is_refused(good, tmp_path, capsys, edit, match):
    refused(capsys, crafted(good, tmp_path, edit), match)


def test_an_uppercase_digest_is_not_a_match(good, tmp_path, capsys):
    def edit(f):
        f.attrs["content_sha256"] = str(f.attrs["content_sha256"]).upper()
    refused(capsys, crafted(good, tmp_path, edit), "64 lowercase hex digits")


# ----------------------------------------------------------------------------------------- declared shapes
def _grow(f, name, shape, dtype):
    """Replace dataset ``name`` by an unwritten, chunked, compressed one of ``shape``: a few bytes on disk."""
    del f[name]
    chunks = tuple(min(s, 64) for s in shape)
    f.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, compression="gzip")


def _levels(s_max):
    def edit(f):
        f["truncation"].attrs["s_max"] = s_max
        f["truncation"].attrs["converged_upto"] = -1
        _grow(f, "policy", (s_max + 2, 2), "i4")
        _grow(f, "solution/relative_values", (s_max + 2, 2), "f8")
        _grow(f, "solution/qvalues", (s_max + 1, 2, 5), "f8")
    return edit


def _phases(m):
    def edit(f):
        _grow(f, "arrivals/D0", (m, m), "f8")
        _grow(f, "arrivals/D1", (m, m), "f8")
    return edit


def _sizes(nb):
    def edit(f):
        for name in ("inputs/batch_sizes", "inputs/latency_ms", "inputs/energy_mj"):
            _grow(f, name, (nb,), "i4" if name.endswith("sizes") else "f8")
        _grow(f, "solution/actions", (nb + 1,), "i4")
    return edit


def _values(f):
    """Within the state limit, but (R+1) × m × A stored action values beyond the value limit."""
    s_max, m, nb = PHASE_TABLE_STATE_LIMIT // 8 - 2, 8, 4096
    assert (s_max + 2) * m <= PHASE_TABLE_STATE_LIMIT and (s_max + 1) * m * (nb + 1) > PHASE_TABLE_VALUES_LIMIT
    f["truncation"].attrs["s_max"] = s_max
    f["truncation"].attrs["converged_upto"] = s_max
    _phases(m)(f)
    _sizes(nb)(f)
    _grow(f, "solution/qvalues", (s_max + 1, m, nb + 1), "f8")


def _mismatch(name, shape):
    def edit(f):
        _grow(f, name, shape, "f8" if "values" in name or "arrivals" in name else "i4")
    return edit


@pytest.mark.parametrize("edit,match", [
    (_levels(10 ** 7), "a phase table holds at most"),
    (_levels(PHASE_TABLE_STATE_LIMIT // 2), "a phase table holds at most"),
    (_phases(9), "1..8 phases"),
    (_phases(100_000), "1..8 phases"),
    (_sizes(10 ** 6), "1 ≤ B ≤ 4096"),
    (_values, "values; a phase table holds at most"),
    (_mismatch("policy", (10 ** 6, 2)), "/policy has shape"),
    (_mismatch("solution/qvalues", (10 ** 6, 2, 5)), "/solution/qvalues has shape"),
    (_mismatch("solution/relative_values", (258, 3)), "/solution/relative_values has shape"),
    (_mismatch("arrivals/D1", (2, 3)), "/arrivals/D1 has shape"),
    (_mismatch("arrivals/D0", (2, 3)), "expected a square matrix"),
], ids=["1e7-levels", "2^15-levels", "9-phases", "1e5-phases", "1e6-sizes", "values", "policy-rows", "qvalue-rows",
        "value-phases", "D1", "D0"])
def test_oversized_declared_shapes_are_refused_before_reading(good, tmp_path, capsys, edit, match):
    path = crafted(good, tmp_path, edit, name="big.h5")
    assert os.path.getsize(path) < 2 << 20  # a small file that declares a huge table
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(PolicyFileError) as e:
            read_phase_policy(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert match in str(e.value), str(e.value)
    assert peak < 16 << 20, peak  # nothing of the declared size was allocated
    assert time.perf_counter() - t0 < 5.0
    refused(capsys, path, match)


# ----------------------------------------------------------------------------------------- contradictions
def _stored(good):
    with h5py.File(good, "r") as f:
        return (f["policy"][()].astype(np.int64), f["solution/qvalues"][()], f["solution/actions"][()].astype(np.int64),
                int(f["truncation"].attrs["converged_upto"]))


def _worse_choice(good, seed):
    """(n, i, a): a feasible batch size a ≠ policy[n, i] at a stored level with a clearly larger Q."""
    policy, qv, acts, R = _stored(good)
    rng = np.random.default_rng(seed)
    while True:
        n, i = int(rng.integers(1, R + 1)), int(rng.integers(0, 2))
        cur = qv[n, i, np.searchsorted(acts, policy[n, i])]
        options = [a for k, a in enumerate(acts) if 0 < a <= n and a != policy[n, i] and qv[n, i, k] > cur + 1e-6 * (1 + abs(cur))]
        if options:
            return n, i, int(rng.choice(options))


@pytest.mark.parametrize("seed", range(6))
def test_a_policy_that_contradicts_its_values_is_refused(good, tmp_path, capsys, seed):
    n, i, a = _worse_choice(good, seed)

    def edit(f):
        f["policy"][n, i] = a
    refused(capsys, crafted(good, tmp_path, edit, sign=True), f"/policy[{n},{i}]", "contradicts /solution/qvalues")


@pytest.mark.parametrize("seed", range(4))
def test_values_that_contradict_the_policy_are_refused(good, tmp_path, capsys, seed):
    """Another action made the cheapest in the stored values: the belief rule would act on it."""
    n, i, a = _worse_choice(good, 100 + seed)
    _, qv, acts, _ = _stored(good)

    def edit(f):
        q = f["solution/qvalues"][()]
        q[n, i, np.searchsorted(acts, a)] = q[n, i][np.isfinite(q[n, i])].min() - 1.0
        f["solution/qvalues"][...] = q
    refused(capsys, crafted(good, tmp_path, edit, sign=True), f"/policy[{n},{i}]", "contradicts")


def test_swapped_phase_values_are_refused(good, tmp_path, capsys):
    """The phases' values swapped (here the decisions agree; the relative values then do not)."""
    def edit(f):
        f["solution/qvalues"][...] = f["solution/qvalues"][()][:, ::-1, :]
    refused(capsys, crafted(good, tmp_path, edit, sign=True), "contradicts")


@pytest.mark.parametrize("where,delta", [((0, 0), 1.0), ((3, 1), -50.0), ((-1, 0), 1e-3)])
def test_relative_values_that_contradict_the_action_values_are_refused(good, tmp_path, capsys, where, delta):
    _, _, _, R = _stored(good)
    n, i = (R if where[0] == -1 else where[0]), where[1]

    def edit(f):
        f["solution/relative_values"][n, i] += delta * (1 + abs(f["solution/relative_values"][n, i]))
    refused(capsys, crafted(good, tmp_path, edit, sign=True), f"/solution/relative_values[{n},{i}]")


def test_rows_above_the_converged_range_must_repeat_its_last_row(good, tmp_path, capsys):
    policy, _, _, R = _stored(good)
    other = 4 if policy[R + 20, 1] != 4 else 2

    def edit(f):
        f["policy"][R + 20, 1] = other
    refused(capsys, crafted(good, tmp_path, edit, sign=True), f"/policy[{R + 20},1]", "repeats row R")


def _huge_bmax(f):
    """Bmax = 10⁶ in a tail-boundary table (which may end below Bmax), ρ made consistent with it."""
    f["inputs/batch_sizes"][3] = 10 ** 6
    f["truncation"].attrs["boundary"] = "tail"
    gi = f["inputs"]
    gi.attrs["rho"] = gi.attrs["lam"] * gi["latency_ms"][-1] / 10 ** 6


@pytest.mark.parametrize("edit,match", [
    (lambda f: f["policy"].__setitem__((2, 0), 4), "serves at most n"),
    (lambda f: f["policy"].__setitem__((6, 1), 3), "expected 0 (wait) or a batch size"),
    (lambda f: f["policy"].__setitem__((5, 0), -1), "expected 0 (wait) or a batch size"),
    (lambda f: f["solution/actions"].__setitem__(2, 3), "must be 0 followed by inputs/batch_sizes"),
    (lambda f: f["arrivals"].attrs.__setitem__("rate", 7.0), "/arrivals@rate"),
    (lambda f: f["arrivals/D1"].__setitem__((1, 1), 5.0), "is not a valid MAP"),
    (lambda f: f["solution/qvalues"].__setitem__((1, 0, 1), np.nan), "NaN"),
    (lambda f: f["inputs/batch_sizes"].__setitem__(3, 10 ** 6), "expected ≥ Bmax = 1000000"),
    (_huge_bmax, "expected batch sizes ≤ 4096"),
], ids=["over-n", "not-a-size", "negative", "actions", "rate-attr", "D1", "nan", "huge-size", "huge-size-tail"])
def test_other_inconsistent_contents_are_refused(good, tmp_path, capsys, edit, match):
    refused(capsys, crafted(good, tmp_path, edit, sign=True), match)
