"""Hostile MAP inputs: ``--arrivals map:FILE.json`` (devices, FIFOs, huge or malformed JSON, broken matrices,
reducible phase processes), ``mmpp:`` spellings, and the Python constructors.

Each is refused as one InputError line — through read_map_file / parse_arrivals and through the CLI
(``smdp_batch.cli.main`` returns 2 with one ``smdp-batch: error:`` line) — never a hang, a traceback or
a memory blow-up.  Positive switching rates, however small, are irreducible.
"""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.limits import JSON_DEPTH_LIMIT, MAP_FILE_BYTES_LIMIT, SWITCH_RATIO_MIN
from smdp_batch.model.arrivals import MAP, parse_arrivals, read_map_file
from smdp_batch.specs.mapcheck import _stationary, _unreachable

from _threads import returns_within

GOOD = {"D0": [[-3.0, 1.0], [0.5, -2.0]], "D1": [[1.5, 0.5], [0.5, 1.0]]}


def within(seconds: float, fn):
    """fn() in a daemon thread; fails if it has not returned within ``seconds`` (a blocking read)."""
    return returns_within(fn, seconds)


def refused(capsys, path, *match, timeout: float = 20.0) -> str:
    """``map:path`` refused by read_map_file, parse_arrivals and ``solve --arrivals``: one line naming the file."""
    for load in (read_map_file, lambda p: parse_arrivals(f"map:{p}")):
        with pytest.raises(InputError) as e:
            within(timeout, lambda: load(str(path)))  # noqa: B023 - called in this iteration
        msg = str(e.value)
        assert "\n" not in msg and repr(str(path)) in msg, msg
        for m in match:
            assert m in msg, (m, msg)
    cli(capsys, ["solve", "--arrivals", f"map:{path}"], *match, timeout=timeout)
    return msg


def cli(capsys, args, *match, timeout: float = 20.0) -> str:
    capsys.readouterr()
    rc = within(timeout, lambda: main(list(args)))
    out, err = capsys.readouterr()
    assert rc == 2, (args, out, err)
    assert err.startswith("smdp-batch: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == "", err
    for m in match:
        assert m in err, (m, err)
    return err


def write(tmp_path, content, name="map.json") -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------------------------------- valid files
def test_valid_files_still_load(tmp_path):
    a = read_map_file(write(tmp_path, GOOD))
    assert np.allclose(a.D0, GOOD["D0"]) and a.phases == 2
    fitted = {"rates": [1.0, 4.0], "generator": [[-0.01, 0.01], [0.02, -0.02]], "fit": {"bic": 1.0, "notes": ["x"]}}
    b = read_map_file(write(tmp_path, fitted, "fit.json"))
    assert b.rate == pytest.approx(MAP.mmpp([1.0, 4.0], [0.01, 0.02]).rate, rel=1e-14)
    bom = write(tmp_path, b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), "bom.json")
    assert read_map_file(bom).phases == 2
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "map.json")
    assert parse_arrivals(f"map:{link}").phases == 2


# ----------------------------------------------------------------------------------------- not a regular file
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_devices_are_refused_before_reading(capsys, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    refused(capsys, device, "not a regular file", "character device", timeout=10.0)


def test_a_link_to_a_device_is_refused(tmp_path, capsys):
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    refused(capsys, link, "not a regular file", timeout=10.0)


def test_a_fifo_does_not_block(tmp_path, capsys):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    refused(capsys, fifo, "not a regular file", "FIFO", timeout=10.0)


def test_a_directory_and_a_missing_file_are_refused(tmp_path, capsys):
    refused(capsys, tmp_path, "not a regular file", "directory")
    refused(capsys, tmp_path / "missing.json", "cannot read")


@pytest.mark.parametrize("size", [MAP_FILE_BYTES_LIMIT + 1, 8 << 30])
def test_huge_files_are_refused_by_size(tmp_path, capsys, size):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: nothing is written
        f.truncate(size)
    refused(capsys, path, f"a MAP file has at most {MAP_FILE_BYTES_LIMIT}")


def test_a_file_at_the_limit_is_parsed(tmp_path):
    """Exactly at the limit: read, then judged on its content (valid JSON padded with spaces)."""
    text = json.dumps(GOOD)
    path = write(tmp_path, text + " " * (MAP_FILE_BYTES_LIMIT - len(text)))
    assert os.path.getsize(path) == MAP_FILE_BYTES_LIMIT
    assert read_map_file(path).phases == 2


# ----------------------------------------------------------------------------------------- malformed JSON
@pytest.mark.parametrize("content,match", [
    ('{"D0": "[[-1]]", "D1": [[1]]}', "D0 is a string"),
    ('{"D0": {"a": 1}, "D1": [[1]]}', "D0 is an object"),
    ('{"D0": [[-1]], "D1": [[true]]}', "D1[0][0] is true"),
    ('{"D0": [[false]], "D1": [[1]]}', "D0[0][0] is false"),
    ('{"D0": [[-1]], "D1": [[null]]}', "D1[0][0] is null"),
    ('{"D0": [[-1]], "D1": [["1"]]}', "D1[0][0] is a string"),
    ('{"D0": [[-1]], "D1": [[[1]]]}', "D1[0][0] is a list"),
    ('{"D0": [[-1]], "D1": [[NaN]]}', "NaN is not a number"),
    ('{"D0": [[-Infinity]], "D1": [[1]]}', "-Infinity is not a number"),
    ('{"D0": [[-1]], "D1": [[Infinity]]}', "Infinity is not a number"),
    ('{"D0": [[-1e999]], "D1": [[1]]}', "is not a finite number"),
    ('{"D0": [[-1]], "D1": [[' + "9" * 5000 + ']]}', "not readable JSON"),
    ('{"D0": [[-2, 1], [1]], "D1": [[1, 0], [0, 1]]}', "D0[1] has 1 entries; expected 2"),
    ('{"D0": [[-2, 1, 0], [1, -2, 0]], "D1": [[1, 0], [0, 1]]}', "D0[0] has 3 entries; expected 2"),
    ('{"D0": [[-2, 1], [1, -2]], "D1": [[1]]}', "D1 has 1 rows; expected 2"),
    ('{"D0": [], "D1": []}', "D0 has 0 rows"),
    ('{"D0": [-1], "D1": [1]}', "D0[0] is a number"),
    ('{"D0": -1, "D1": 1}', "D0 is a number"),
    (json.dumps({"D0": (-np.eye(9)).tolist(), "D1": np.eye(9).tolist()}), "D0 has 9 rows; expected 1..8"),
    ('{"D0": [[-1]], "D0": [[-2]], "D1": [[1]]}', "key 'D0' appears twice"),
    ('{"D0": [[-1]]}', "needs both D0 and D1"),
    ('{"D0": [[-1]], "D1": [[1]], "rates": [1], "generator": [[0]]}', "give one MAP"),
    ('{"rates": [1, 2]}', "needs both rates and generator"),
    ('{"d0": [[-1]], "d1": [[1]]}', "needs keys D0 and D1"),
    ('[[-1], [1]]', "holds a list"),
    ('17', "holds a number"),
    ('', "is not valid JSON"),
    ('{"D0": [[-1]], "D1": [[1]]', "is not valid JSON"),
    (b'{"D0": [[-1]], "D1": [[1\xff]]}', "is not UTF-8"),
    (b'\x00\x01\x02', "is not valid JSON"),
    ('{"rates": "1,2", "generator": [[-1, 1], [1, -1]]}', "rates is a string"),
    ('{"rates": [1, true], "generator": [[-1, 1], [1, -1]]}', "rates[1] is true"),
    ('{"rates": [1, 2, 3], "generator": [[-1, 1], [1, -1]]}', "rates has 3 entries; expected 2"),
    ('{"rates": [1, 2], "generator": [[-1, 1], [1]]}', "generator[1] has 1 entries"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 30 else None)
def test_malformed_json_is_refused(tmp_path, capsys, content, match):
    refused(capsys, write(tmp_path, content), match)


@pytest.mark.parametrize("depth", [JSON_DEPTH_LIMIT + 1, 1000, 100_000])
@pytest.mark.parametrize("where", ["D1", "fit"])
def test_deep_nesting_is_refused_without_recursion(tmp_path, capsys, depth, where):
    deep = "[" * depth + "1" + "]" * depth
    text = '{"D0": [[-1]], "D1": [[1]], "fit": %s}' % deep if where == "fit" else '{"D0": [[-1]], "D1": %s}' % deep
    refused(capsys, write(tmp_path, text), f"nests arrays/objects {depth + 1} deep")


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    path = write(tmp_path, {**GOOD, "fit": {"note": "[" * 5000 + "{" * 5000}})
    assert read_map_file(path).phases == 2


# ----------------------------------------------------------------------------------------- MAP rules
REDUCIBLE = [
    # two closed classes, both with arrivals: π is not unique (the old numerical test accepted this)
    ({"D0": [[-2, 1, 0, 0], [1, -2, 0, 0], [0, 0, -2, 1], [0, 0, 1, -2]], "D1": np.eye(4).tolist()},
     "phase 2 cannot be reached from phase 0"),
    # a transient phase (0 leads to 1, nothing leads back)
    ({"D0": [[-2, 1], [0, -1]], "D1": [[1, 0], [0, 1]]}, "phase 0 cannot be reached from phase 1"),
    # arrivals that change the phase count as paths; here they only go one way round
    ({"D0": [[-1, 0, 0], [0, -1, 0], [0, 0, -1]], "D1": [[0, 1, 0], [0, 0, 1], [0, 1, 0]]},
     "phase 0 cannot be reached from phase 1"),
    ({"rates": [1, 2, 3], "generator": [[-1, 1, 0], [1, -1, 0], [0, 0, 0]]}, "phase 2 cannot be reached from phase 0"),
]


@pytest.mark.parametrize("content,match", REDUCIBLE)
def test_reducible_phase_processes_are_refused(tmp_path, capsys, content, match):
    refused(capsys, write(tmp_path, content), "not irreducible", match)


@pytest.mark.parametrize("content,match", [
    ({"D0": [[3.0, 1.0], [0.5, -2.0]], "D1": [[1.5, 0.5], [0.5, 1.0]]}, "D0[0][0] = 3.0 must be < 0"),
    ({"D0": [[0, 0], [0.5, -2.0]], "D1": [[0, 0], [0.5, 1.0]]}, "D0[0][0] = 0.0 must be < 0"),
    ({"D0": [[-5.0, 1.0], [0.5, -2.0]], "D1": [[1.5, 0.5], [0.5, 1.0]]}, "row 0 of D0 + D1 must sum to 0"),
    ({"D0": [[-3.0, 1.0], [0.5, -2.0]], "D1": [[2.5, -0.5], [0.5, 1.0]]}, "D1[0,1] = -0.5 must be ≥ 0"),
    ({"D0": [[-3.0, -1.0], [0.5, -2.0]], "D1": [[3.5, 0.5], [0.5, 1.0]]}, "D0[0,1] = -1.0 must be ≥ 0"),
    ({"D0": [[-1e13]], "D1": [[1e13]]}, "MAP rates must lie in"),
    ({"rates": [1, 2], "generator": [[5, 1], [1, 7]]}, "generator[0][0] = 5.0 must be -1.0"),
    ({"rates": [1, 2], "generator": [[0, 1], [1, 0]]}, "generator[0][0] = 0.0 must be -1.0"),
    ({"rates": [1, 2], "generator": [[-3, 1], [1, -1]]}, "generator[0][0] = -3.0 must be -1.0"),
    ({"rates": [1, 2], "generator": [[1, -1], [1, -1]]}, "generator[0][1] = -1.0 must be ≥ 0"),
    ({"rates": [-1, 2], "generator": [[-1, 1], [1, -1]]}, "MMPP rates must be finite and ≥ 0"),
    ({"rates": [0, 0], "generator": [[-1, 1], [1, -1]]}, "no arrivals"),
], ids=["D0-diag-positive", "D0-diag-zero", "row-sum", "D1-negative", "D0-off-negative", "rate-range",
        "gen-diag-positive", "gen-diag-zero", "gen-diag-wrong", "gen-off-negative", "rates-negative", "no-arrivals"])
def test_broken_matrices_are_refused(tmp_path, capsys, content, match):
    refused(capsys, write(tmp_path, content), match)


# ----------------------------------------------------------------------------------------- irreducibility
def test_the_graph_test_agrees_with_strong_connectivity():
    rng = np.random.default_rng(5)
    for _ in range(400):
        m = int(rng.integers(1, 9))
        support = (rng.random((m, m)) < rng.uniform(0.05, 0.6)) & ~np.eye(m, dtype=bool)
        n, _ = connected_components(support.astype(np.int8), directed=True, connection="strong")
        assert (_unreachable(support) is None) == (n == 1), support


def test_the_stationary_law_is_exact_across_rate_scales():
    """GTH elimination against a dense solve (moderate rates) and π·D = 0 componentwise (spread rates)."""
    rng = np.random.default_rng(9)
    for _ in range(50):
        m = int(rng.integers(2, 9))
        scale = 10.0 ** rng.uniform(-9, 3, size=(m, m))
        D = rng.random((m, m)) * scale
        np.fill_diagonal(D, 0.0)
        np.fill_diagonal(D, -D.sum(axis=1))
        pi = _stationary(D)
        assert np.all(pi > 0) and pi.sum() == pytest.approx(1.0, rel=1e-14)
        flow = pi[:, None] * np.abs(D)  # balance: inflow = outflow at every phase, each to 1e-12 relative
        np.fill_diagonal(flow, 0.0)
        assert np.allclose(flow.sum(axis=0), flow.sum(axis=1), rtol=1e-12, atol=0)
        if scale.max() / scale.min() < 1e3:
            A = np.vstack([D.T[:-1], np.ones(m)])
            assert np.allclose(pi, np.linalg.solve(A, np.eye(m)[-1]), rtol=1e-10)


@pytest.mark.parametrize("spec", ["mmpp:1,1,1e-9,1e-9", "mmpp:1,2,1e-12,1e-12", "mmpp:0.5,4,1e-6,1e-12",
                                  "mmpp:1e-12,1,1,1"])
def test_tiny_positive_switching_rates_are_irreducible(spec):
    a = parse_arrivals(spec)
    rates = [float(x) for x in spec.split(":")[1].split(",")]
    assert np.all(a.stationary > 0)
    assert a.stationary[0] == pytest.approx(rates[3] / (rates[2] + rates[3]), rel=1e-12)  # π of a 2-phase chain
    assert a.rate == pytest.approx(a.stationary @ rates[:2], rel=1e-12)


@pytest.mark.parametrize("spec", ["mmpp:0.9,1.1,1e-9,1e-9", "mmpp:0.5,1.5,1e-10,1e-10", "mmpp:1,2,1e-7,1"])
def test_solving_with_tiny_switching_rates_names_the_conditioning(capsys, spec):
    """The solve would lose its digits (measured: a negative W̄ at 1e-10): refused with the numbers, not as reducible."""
    err = cli(capsys, ["solve", "--arrivals", spec], "ill-conditioned", f"< {SWITCH_RATIO_MIN:g}")
    assert "irreducible" not in err


def test_equal_phase_rates_with_tiny_switching_are_poisson(capsys):
    """Equal phase rates make the arrivals exactly Poisson, however slowly the phases change: solved as such."""
    assert main(["solve", "--arrivals", "mmpp:1,1,1e-9,1e-9", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["solve", "--lam", "1", "--json"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert got["avg_cost"] == pytest.approx(ref["avg_cost"], rel=1e-9)


# ----------------------------------------------------------------------------------------- mmpp: spellings
@pytest.mark.parametrize("spec,match", [
    ("mmpp:true,1,1,1", "'true' is not a finite decimal number"),
    ("mmpp:1,True,1,1", "'True' is not a finite decimal number"),
    ("mmpp:1,1,1_0,1", "'1_0' is not a finite decimal number"),
    ("mmpp:1,1,0x10,1", "'0x10' is not a finite decimal number"),
    ("mmpp:١,1,1,1", "is not a finite decimal number"),
    ("mmpp:nan,1,1,1", "'nan' is not a finite decimal number"),
    ("mmpp:1,inf,1,1", "'inf' is not a finite decimal number"),
    ("mmpp:1,1,1e999,1", "'1e999' is not a finite decimal number"),
    ("mmpp:1,1,,1", "'' is not a finite decimal number"),
    ("mmpp:1,1,1,1,", "'' is not a finite decimal number"),
    ("mmpp:1,1,1", "mmpp needs L1,L2,R12,R21"),
    ("mmpp:1,1,0,1", "switching rates R12, R21 must be > 0"),
    ("mmpp:0,0,1,1", "not both 0"),
    ("mmpp:1,1,1e-13,1", "MMPP switching rate must lie in"),
    ("map:", "is not valid"),
], ids=lambda x: x if isinstance(x, str) and x.startswith("mmpp") else None)
def test_mmpp_spellings_accept_only_decimal_numbers(capsys, spec, match):
    with pytest.raises(InputError, match=match.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        parse_arrivals(spec)
    cli(capsys, ["solve", "--arrivals", spec], match)


def test_mmpp_spellings_that_are_numbers_still_parse():
    for spec in ("mmpp:1,2,.5,.5", "mmpp:+1,2E0,5e-1,0.5", " MMPP: 1. , 2 , 0.5 , 0.5 "):
        assert parse_arrivals(spec).rate == pytest.approx(1.5)


# ----------------------------------------------------------------------------------------- Python API
@pytest.mark.parametrize("make,match", [
    (lambda: MAP([[True]], [[1.0]]), "D0"),
    (lambda: MAP([[-1.0]], [[True]]), "D1"),
    (lambda: MAP([["-1"]], [[1.0]]), "D0"),
    (lambda: MAP([[-1.0, None]], [[1.0]]), "D0"),
    (lambda: MAP(np.array([[-1.0]]), np.array([[True]])), "D1"),
    (lambda: MAP([[-2.0, 1.0], [1.0]], [[1.0, 0.0], [0.0, 1.0]]), "D0"),
    (lambda: MAP([[[[-1.0]]]], [[1.0]]), "D0"),
    (lambda: MAP.mmpp([True, 2.0], [1.0, 1.0]), "MMPP rates"),
    (lambda: MAP.mmpp([1.0, 2.0], ["1", "1"]), "MMPP switching rates"),
    (lambda: MAP.mmpp([1.0, 2.0], [[5.0, 1.0], [1.0, 7.0]]), "must be -1.0"),
    (lambda: MAP.poisson(True), "Poisson rate"),
    (lambda: MAP.poisson(float("nan")), "Poisson rate"),
])
def test_python_constructors_refuse_what_numpy_would_coerce(make, match):
    with pytest.raises(InputError, match=match) as e:
        make()
    assert "\n" not in str(e.value)


def test_a_zero_diagonal_rate_matrix_is_still_an_mmpp_generator():
    a = MAP.mmpp([1.0, 2.0], [[0.0, 0.3], [0.1, 0.0]])
    assert np.allclose(a.D0 + a.D1, [[-0.3, 0.3], [0.1, -0.1]])


def test_the_reader_opens_nothing_else(tmp_path):
    """A path named inside a file is data, not a file to open."""
    path = write(tmp_path, {**GOOD, "include": "/dev/zero", "fit": {"trace": "/etc/passwd"}})
    assert read_map_file(path).phases == 2
    assert stat.S_ISREG(os.stat(path).st_mode)
