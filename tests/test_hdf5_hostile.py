"""Hostile policy files (issue 17 item 7, "readers trust what they read").

Every file here is crafted with h5py.  Each must be refused fast, with bounded memory, as one
PolicyFileError naming the file and the object at fault — through read_policy / PolicyTable.load /
PolicyBank.load and through the CLI (one ``smdp-batch: error: …`` line, exit 2, no traceback) — and
no command may open a path recorded inside a file.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from smdp_batch import BatchingProblem, PolicyFileError, solve
from smdp_batch.cli import main
from smdp_batch.export import write_policy
from smdp_batch.export.hdf5 import write_bank
from smdp_batch.runtime import PolicyBank, PolicyTable, read_bank, read_policy

ROOT = Path(__file__).resolve().parent.parent
POLICIES = sorted((ROOT / "policies").glob("*.h5"))
#: Tables shipped by 0.1 (no checksums, no s_max_rule): kept to show old files still load.
LEGACY = sorted((ROOT / "tests" / "data").glob("legacy_0.1_*.h5"))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A valid table and bank (Bmax = 8) written by this version: fletcher32 + content_sha256."""
    tmp = tmp_path_factory.mktemp("hostile")
    a = solve(BatchingProblem.basic(rho=0.3, w2=1.0, batch_sizes=range(1, 9)))
    b = solve(BatchingProblem.basic(rho=0.6, w2=1.0, batch_sizes=range(1, 9)))
    return {"table": str(write_policy(a, tmp / "t.h5")), "bank": str(write_bank([a, b], tmp / "b.h5"))}


def crafted(good, tmp_path, edit, kind="table", name="x.h5"):
    """A copy of the good file, changed by ``edit(h5py.File)``."""
    path = tmp_path / name
    shutil.copy(good[kind], path)
    with h5py.File(path, "a") as f:
        edit(f)
    return str(path)


def replace(group, name, **kw):
    del group[name]
    return group.create_dataset(name, **kw)


def refused(path, *match, bank=False):
    """Refused by the readers and by ``show``: one PolicyFileError naming the file and each ``match``."""
    loaders = (read_bank, PolicyBank.load) if bank else (read_policy, PolicyTable.load)
    for load in loaders:
        with pytest.raises(PolicyFileError) as e:
            load(path)
        msg = str(e.value)
        assert repr(str(path)) in msg and "\n" not in msg, msg
        for m in match:
            assert m in msg, (m, msg)
    return msg


def cli_error(capsys, *args):
    """The CLI's answer to a bad file: exit 2, one stderr line, no traceback."""
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert rc == 2, (args, out, err)
    assert err.startswith("smdp-batch: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    return err


def run_limited(code: str, timeout: float):
    """Run ``code`` in a fresh interpreter with 1 GiB of address space; (rc, stdout, stderr, seconds)."""
    prog = "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n" + code
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - t0


# ----------------------------------------------------------------------------- declared sizes
def _huge_sparse_policy(f, s_max=None):
    d = replace(f, "policy", shape=(2**29,), dtype=np.int32, chunks=(2**16,), compression="gzip")
    d[:4] = [0, 1, 2, 3]  # one chunk written: the file stays ~20 KB
    if s_max is not None:
        f["truncation"].attrs["s_max"] = s_max


@pytest.mark.parametrize("s_max", [None, 2**29 - 2], ids=["length-vs-s_max", "s_max-huge"])
def test_declared_huge_sparse_policy_is_refused_fast_in_bounded_memory(good, tmp_path, s_max):
    path = crafted(good, tmp_path, lambda f: _huge_sparse_policy(f, s_max))
    assert os.path.getsize(path) < 200_000
    code = (
        "import sys\nfrom smdp_batch.errors import PolicyFileError\nfrom smdp_batch.runtime import PolicyTable\n"
        f"try:\n    PolicyTable.load({path!r})\nexcept PolicyFileError as e:\n    print('REFUSED', e)\n"
    )
    rc, out, err, secs = run_limited(code, timeout=30)
    assert rc == 0 and out.startswith("REFUSED"), (out, err)
    assert ("/policy" in out and "(536870912,)" in out) if s_max is None else "s_max" in out
    assert secs < 15 and "MemoryError" not in err
    rc, out, err, secs = run_limited(f"import sys\nfrom smdp_batch.cli import main\nsys.exit(main(['show', {path!r}]))",
                                     timeout=60)
    assert rc == 2 and err.startswith("smdp-batch: error: ") and err.count("\n") == 1, (rc, out, err)
    assert "MemoryError" not in err and "Traceback" not in err


def test_the_largest_table_a_file_may_declare_loads_in_bounded_memory(good, tmp_path):
    """s_max = 10⁷ (the limit), sparse chunks filled with 1: a valid table read within 1 GiB, in seconds."""
    n = 10_000_000 + 2

    def edit(f):
        f["truncation"].attrs["s_max"] = n - 2
        replace(f, "policy", shape=(n,), dtype=np.int32, chunks=(2**18,), compression="gzip", fillvalue=1)[0] = 0
        replace(f["solution"], "relative_values", shape=(n,), dtype=np.float64, chunks=(2**17,), compression="gzip")
        del f.attrs["content_sha256"]

    path = crafted(good, tmp_path, edit)
    assert os.path.getsize(path) < 200_000
    rc, out, err, secs = run_limited(f"from smdp_batch.runtime import PolicyTable\nprint(PolicyTable.load({path!r}).s_max)",
                                     timeout=60)
    assert rc == 0 and out.strip() == str(n - 2), (out, err)
    assert secs < 30


def test_declared_huge_chunk_is_refused(good, tmp_path):
    def edit(f):
        n = f["policy"].shape[0]
        data = f["policy"][()]
        replace(f, "policy", shape=(n,), maxshape=(None,), chunks=(2**27,), dtype=np.int32, data=data)

    refused(crafted(good, tmp_path, edit), "/policy", "chunks")


def test_declared_huge_batch_size_set_is_refused(good, tmp_path):
    path = crafted(good, tmp_path, lambda f: replace(f["inputs"], "batch_sizes", shape=(2**28,), dtype=np.int32,
                                                     chunks=(2**16,), compression="gzip"))
    refused(path, "/inputs/batch_sizes", "shape")


# ----------------------------------------------------------------------------- dtypes and kinds
@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.bool_, "S4", h5py.string_dtype()],
                         ids=["float", "complex", "bool", "bytes", "vlen-str"])
def test_policy_of_a_wrong_dtype_is_refused(good, tmp_path, dtype):
    def edit(f):
        p = f["policy"][()]
        if isinstance(dtype, np.dtype) and h5py.check_string_dtype(dtype):
            data = np.array([str(x) for x in p], dtype=object)
        else:
            data = p.astype(dtype)
        replace(f, "policy", data=data, dtype=dtype)

    refused(crafted(good, tmp_path, edit), "/policy", "dtype")


def test_policy_compound_and_2d_are_refused(good, tmp_path):
    def compound(f):
        p = f["policy"][()]
        replace(f, "policy", data=np.array([(x, x) for x in p], dtype=[("a", "i4"), ("b", "i4")]))

    refused(crafted(good, tmp_path, compound, name="c.h5"), "/policy", "dtype")
    two_d = crafted(good, tmp_path, lambda f: replace(f, "policy", data=np.stack([f["policy"][()]] * 2)), name="d.h5")
    refused(two_d, "/policy", "shape")


def test_policy_as_a_group_or_link_is_refused(good, tmp_path):
    def group(f):
        del f["policy"]
        f.create_group("policy")

    refused(crafted(good, tmp_path, group, name="g.h5"), "/policy", "Group")

    def external(f):
        del f["policy"]
        f["policy"] = h5py.ExternalLink(good["table"], "/policy")

    refused(crafted(good, tmp_path, external, name="e.h5"), "/policy", "ExternalLink")

    def soft(f):
        f["inputs"].create_dataset("p2", data=f["policy"][()])
        del f["policy"]
        f["policy"] = h5py.SoftLink("/inputs/p2")

    refused(crafted(good, tmp_path, soft, name="s.h5"), "/policy", "SoftLink")


def test_dataset_stored_in_an_external_file_is_refused(good, tmp_path):
    raw = tmp_path / "raw.bin"
    with h5py.File(good["table"], "r") as f:
        p = f["policy"][()]
    raw.write_bytes(p.astype("<i4").tobytes())

    def edit(f):
        replace(f, "policy", shape=p.shape, dtype="<i4", external=[(str(raw), 0, p.size * 4)])

    refused(crafted(good, tmp_path, edit), "/policy", "other files")


def test_policy_of_the_wrong_length_is_refused(good, tmp_path):
    path = crafted(good, tmp_path, lambda f: replace(f, "policy", data=f["policy"][:-3]))
    refused(path, "/policy", "shape", "s_max + 2")


def test_policy_entries_must_be_allowed_sizes_at_most_n(good, tmp_path):
    def outside(f):
        p = f["policy"][()]
        p[-2] = 9  # Bmax is 8
        f["policy"][...] = p

    refused(crafted(good, tmp_path, outside, name="o.h5"), "/policy", "= 9")

    def more_than_n(f):
        p = f["policy"][()]
        p[1] = 8  # serve 8 with 1 waiting
        f["policy"][...] = p

    refused(crafted(good, tmp_path, more_than_n, name="n.h5"), "/policy[1] = 8", "at most n")


def test_batch_sizes_of_strings_or_not_increasing_are_refused(good, tmp_path):
    def strings(f):
        replace(f["inputs"], "batch_sizes", data=np.array([str(b) for b in range(1, 9)], dtype=object),
                dtype=h5py.string_dtype())

    refused(crafted(good, tmp_path, strings, name="s.h5"), "/inputs/batch_sizes", "dtype")

    def decreasing(f):
        f["inputs"]["batch_sizes"][...] = np.arange(8, 0, -1)

    refused(crafted(good, tmp_path, decreasing, name="d.h5"), "/inputs/batch_sizes", "increasing")


@pytest.mark.parametrize("value", [np.nan, np.inf, -1.0, 0.0], ids=["nan", "inf", "negative", "zero"])
def test_latency_values_must_be_finite_positive(good, tmp_path, value):
    def edit(f):
        f["inputs"]["latency_ms"][3] = value

    refused(crafted(good, tmp_path, edit), "/inputs/latency_ms")


# ----------------------------------------------------------------------------- attributes
@pytest.mark.parametrize(
    "group,name,value,match",
    [
        ("inputs", "lam", np.nan, "finite"),
        ("inputs", "lam", np.inf, "finite"),
        ("inputs", "lam", -1.0, "> 0"),
        ("inputs", "rho", 1.5, "(0, 1)"),
        ("inputs", "w2", -0.5, "≥ 0"),
        ("inputs", "w1", "1", "dtype"),
        ("inputs", "lam", np.array([1.0, 2.0]), "shape"),
        ("inputs", "service", 3, "string"),
        ("truncation", "s_max", np.nan, "dtype"),
        ("truncation", "s_max", 3.0, "dtype"),
        ("truncation", "s_max", "32", "dtype"),
        ("truncation", "s_max", -5, "≥ 1"),
        ("truncation", "s_max", 10**12, "≤"),
        ("truncation", "delta", np.inf, "finite"),
        ("solution", "mean_latency_ms", np.nan, "finite"),
        ("solution", "converged", 7, "boolean"),
        ("/", "schema_version", True, "schema_version"),
    ],
)
def test_bad_attributes_are_refused(good, tmp_path, group, name, value, match):
    def edit(f):
        f[group].attrs[name] = value

    where = f"{group if group != '/' else ''}@{name}" if name != "schema_version" else "schema_version"
    refused(crafted(good, tmp_path, edit), match, *([where] if group != "/" else []))


def test_an_s_max_below_bmax_is_refused(good, tmp_path):
    """Eq. 19's table needs s_max ≥ Bmax; a tail-boundary table may be shorter (the probable-range table),
    but not shorter than its own stored range and policy."""
    def overflow(f):
        f["truncation"].attrs["s_max"] = 4
        f["truncation"].attrs["boundary"] = "overflow"

    refused(crafted(good, tmp_path, overflow), "≥ Bmax", "truncation@s_max")

    def tail(f):
        f["truncation"].attrs["s_max"] = 4

    refused(crafted(good, tmp_path, tail, name="y.h5"), "expected ≤ 4")


@pytest.mark.parametrize("group,name", [("inputs", "lam"), ("inputs", "service"), ("truncation", "s_max"),
                                        ("truncation", "abstract_cost"), ("solution", "avg_cost")])
def test_missing_attributes_are_refused_not_keyerror(good, tmp_path, group, name, capsys):
    def edit(f):
        del f[group].attrs[name]

    path = crafted(good, tmp_path, edit)
    refused(path, f"@{name}", "missing")
    assert "missing" in cli_error(capsys, "show", path)


def test_rho_must_agree_with_lambda(good, tmp_path):
    def edit(f):
        f["inputs"].attrs["lam"] = f["inputs"].attrs["lam"] * 1.5

    refused(crafted(good, tmp_path, edit), "@rho", "disagrees")


def test_unknown_huge_attribute_is_never_read(good, tmp_path):
    def edit(f):
        f["inputs"].attrs.create("junk", np.zeros(4000))  # an attribute no reader knows: never read

    assert read_policy(crafted(good, tmp_path, edit)).inputs["lam"] > 0


# ----------------------------------------------------------------------------- banks
@pytest.mark.parametrize("lams", [[1.0, 0.5], [np.nan, 1.0], [1.0, 1.0], [-1.0, 1.0]],
                         ids=["decreasing", "nan", "equal", "negative"])
def test_bank_rates_must_be_finite_positive_increasing(good, tmp_path, lams):
    def edit(f):
        f["lams"][...] = lams

    refused(crafted(good, tmp_path, edit, kind="bank"), "/lams", bank=True)


def test_bank_table_rate_nan_is_refused(good, tmp_path):
    def edit(f):
        f["tables/001/inputs"].attrs["lam"] = np.nan

    refused(crafted(good, tmp_path, edit, kind="bank"), "/tables/001/inputs@lam", "finite", bank=True)


def test_bank_lams_must_match_its_tables(good, tmp_path):
    def edit(f):
        f["lams"][...] = f["lams"][()] * [1.0, 1.01]

    refused(crafted(good, tmp_path, edit, kind="bank"), "disagrees", bank=True)


def test_bank_without_lams_or_with_odd_members_is_refused(good, tmp_path):
    refused(crafted(good, tmp_path, lambda f: f.__delitem__("lams"), kind="bank", name="a.h5"), "/lams", bank=True)
    refused(crafted(good, tmp_path, lambda f: f["tables"].create_group("evil"), kind="bank", name="b.h5"),
            "/tables", bank=True)


# ----------------------------------------------------------------------------- checksums
def test_a_flipped_byte_in_the_policy_is_refused_as_damaged(good, tmp_path, capsys):
    path = tmp_path / "flip.h5"
    shutil.copy(good["table"], path)
    with h5py.File(path, "r") as f:
        assert f["policy"].fletcher32
        info = f["policy"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 8)
        b = fh.read(1)
        fh.seek(info.byte_offset + 8)
        fh.write(bytes([b[0] ^ 0x01]))
    msg = refused(path, "checksum mismatch in /policy", "damaged")
    assert "checksum" in msg
    assert "checksum mismatch" in cli_error(capsys, "show", str(path))
    assert "checksum mismatch" in cli_error(capsys, "evaluate", "--policy", str(path))


def test_a_rewritten_valid_policy_fails_the_content_digest(good, tmp_path):
    def edit(f):  # h5py recomputes fletcher32; content_sha256 still catches the change
        p = f["policy"][()]
        i = int(np.nonzero(p[:-1] > 1)[0][0])
        p[i] = 1
        f["policy"][...] = p

    refused(crafted(good, tmp_path, edit), "content checksum mismatch")


def test_new_files_are_checksummed_and_old_ones_still_load(good):
    assert read_policy(good["table"]).integrity == "fletcher32+sha256"
    assert {t.integrity for t in read_bank(good["bank"])} == {"fletcher32+sha256"}
    for path in LEGACY:  # 0.1's shipped tables: no checksums, still load
        pf = read_policy(path)
        assert pf.integrity == "none" and PolicyTable.load(path).s_max == pf.s_max
        assert pf.converged_upto is None and "s_max_rule" not in pf.truncation
    for path in POLICIES[:: max(1, len(POLICIES) // 6)]:  # today's shipped tables: checksummed and converged
        pf = read_policy(path)
        assert pf.integrity == "fletcher32+sha256" and pf.converged_upto is not None


# ----------------------------------------------------------------------------- paths inside files
SECRET = "TOP-SECRET-MARKER-1234"


def _with_paths(good, tmp_path, latency, energy, service="det", name="paths.h5"):
    def edit(f):
        f["inputs"].attrs.update({"latency": latency, "energy": energy, "service": service})
        del f.attrs["content_sha256"]  # as an older writer would have left it

    return crafted(good, tmp_path, edit, name=name)


def test_paths_recorded_in_a_file_are_never_opened(good, tmp_path, capsys, monkeypatch):
    secret = tmp_path / "secret.csv"
    secret.write_text(f"{SECRET},1,2\n1,2,3\n")
    path = _with_paths(good, tmp_path, f"csv:{secret}:affine", f"csv:{secret}")
    import builtins

    real_open = builtins.open

    def guarded(file, *a, **k):
        assert "secret" not in str(file), f"opened {file}"
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    for args in (["evaluate", "--policy", path, "--json"], ["show", path],
                 ["simulate", "--policy", path, "--requests", "2000", "--json"],
                 ["export", path, "--to", "triton", "--requests", "1000"]):
        capsys.readouterr()
        assert main(args) == 0, capsys.readouterr().err
        out, err = capsys.readouterr()
        assert SECRET not in out + err
    capsys.readouterr()
    main(["evaluate", "--policy", path, "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["latency"].startswith("table:1=")  # rebuilt from /inputs/latency_ms


def test_empirical_service_recorded_in_a_file_must_be_given_again(good, tmp_path, capsys):
    secret = tmp_path / "secret.csv"
    secret.write_text(f"{SECRET}\n")
    path = _with_paths(good, tmp_path, f"empirical:{secret}", "affine:19.899,19.603", f"empirical:{secret}")
    for args in (["evaluate", "--policy", path], ["simulate", "--policy", path, "--requests", "2000"],
                 ["export", path, "--to", "ray", "--requests", "1000"]):
        err = cli_error(capsys, *args)
        assert SECRET not in err and "never opens a path" in err
    assert "--service" in cli_error(capsys, "evaluate", "--policy", path)
    capsys.readouterr()
    assert main(["evaluate", "--policy", path, "--service", "exp"]) == 0
    assert SECRET not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["evaluate", "simulate"])
def test_a_fifo_named_in_a_file_is_never_opened(good, tmp_path, command):
    """Opening a FIFO with no writer blocks forever: finishing at all proves it was not opened."""
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    path = _with_paths(good, tmp_path, f"csv:{fifo}", f"csv:{fifo}:affine", "mix:1*det@1")
    args = ["evaluate", "--policy", path] if command == "evaluate" else \
        ["simulate", "--policy", path, "--requests", "2000"]
    rc, out, err, _ = run_limited(f"import sys\nfrom smdp_batch.cli import main\nsys.exit(main({args!r}))", timeout=120)
    assert rc == 0, (out, err)
    fifo2 = tmp_path / "fifo2.csv"
    os.mkfifo(fifo2)
    path = _with_paths(good, tmp_path, "affine:0.3051,1.0524", "affine:19.899,19.603", f"mix:1*empirical:{fifo2}@1",
                       name="mix.h5")
    args = [command, "--policy", path] + ([] if command == "evaluate" else ["--requests", "2000"])
    rc, out, err, _ = run_limited(f"import sys\nfrom smdp_batch.cli import main\nsys.exit(main({args!r}))",
                                  timeout=120)
    assert rc == 2 and "never opens a path" in err, (out, err)


def test_a_closed_form_spec_must_match_the_stored_values(good, tmp_path, capsys):
    path = _with_paths(good, tmp_path, "affine:0.5,1", "affine:19.899,19.603")
    assert "disagrees with the values stored in /inputs/latency_ms" in cli_error(capsys, "evaluate", "--policy", path)


# ----------------------------------------------------------------------------- strict JSON
def _no_nan(name):
    raise AssertionError(f"not strict JSON: {name}")


def test_show_json_is_strict(good, tmp_path, capsys):
    def edit(f):
        f["solution"].attrs["eps"] = np.nan
        f["solution"].attrs["eta"] = np.nan

    for path in (crafted(good, tmp_path, edit), good["bank"], str(LEGACY[0])):
        capsys.readouterr()
        assert main(["show", path, "--json"]) == 0
        d = json.loads(capsys.readouterr().out, parse_constant=_no_nan)
        if "solution" in d:
            assert d["solution"]["eps"] is None
    assert d["integrity"] == "none"


# ----------------------------------------------------------------------------- every reader, one line
def test_every_command_gives_one_line_for_a_hostile_file(good, tmp_path, capsys):
    path = crafted(good, tmp_path, lambda f: f["inputs"].attrs.__setitem__("lam", np.nan))
    for args in (["show", path], ["show", path, "--json"], ["evaluate", "--policy", path],
                 ["export", path, "--to", "triton"], ["simulate", "--policy", path, "--requests", "2000"]):
        err = cli_error(capsys, *args)
        assert "@lam" in err and path in err
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(2000))
    assert "not an HDF5 file" in cli_error(capsys, "show", str(junk))
    assert not math.isnan(read_policy(good["table"]).inputs["lam"])
