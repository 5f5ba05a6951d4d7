"""Typed CLI options (smdp_batch/cli/types.py), one vocabulary, old spellings kept with one deprecation line,
and --help that shows every default the same way and whole command summaries."""

import json
import re
import warnings
from pathlib import Path

import pytest

from smdp_batch import BatchingProblem
from smdp_batch.cli import cli, main
from smdp_batch.runtime import read_policy
from smdp_batch.solvers import solve, solve_batch

POLICIES = Path(__file__).resolve().parent.parent / "policies"


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------------------ bad values
BAD = [
    (["solve", "--rho", "abc"], "--rho must be a number, got 'abc'"),
    (["solve", "--bmax", "3.5"], "--bmax must be an integer, got '3.5'"),
    (["solve", "--s-max", "many"], "--s-max must be auto, minimal or an integer ≥ Bmax, got 'many'"),
    (["solve", "--eps", "inf"], "--eps must be finite"),
    (["solve", "--rho-grid", "0.1,x"], "--rho-grid values must be a number, got 'x'"),
    (["solve", "--rho-grid", ","], "--rho-grid needs comma-separated numbers"),
    (["solve", "-o", "/no/such/dir/t.h5"], "output folder '/no/such/dir' does not exist"),
    (["solve", "--solver"], "requires an argument"),
    (["simulate", "--policy", "greedy", "--seed", "-1"], "--seed must be ≥ 0, got '-1'"),
    (["show", "/no/such/file.h5"], "does not exist"),
    (["export", "/no/such/file.h5", "--to", "ray"], "does not exist"),
    (["llm", "--mem-gib", "0"], "--mem-gib must be > 0, got '0'"),
    (["multibin", "--bins", "0"], "--bins must be ≥ 1, got '0'"),
    (["multibin", "--slo-within-time", "-3"], "--slo-within-time must be > 0"),
    (["tables", "--rho-grid", "0.3", "--w2-grid", "1", "--plot", "x.gif"], "must end in one of .png, .svg, .pdf"),
    (["pareto", "--requests", "10"], "--requests must be ≥ 1000, got '10'"),
    (["pareto", "--plot-kind", "pie"], "unknown --plot-kind 'pie'; valid: tradeoff, percentiles, scenarios"),
    (["pareto", "--ftol", "0.5"], "--ftol must be ≤ 0.0999"),
    (["pareto", "--ftol", "-1e-3"], "--ftol must be ≥ 0"),
]


@pytest.mark.parametrize("args, message", BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_bad_typed_value_is_one_line_exit_2(args, message, capsys):
    rc, out, err = run(args, capsys)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smdp-batch: error: ") and message in lines[0], err
    assert "Traceback" not in err and "Usage:" not in err and "Try " not in err


def test_console_script_usage_error_is_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "smdp_batch", "solve", "--rho", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--rho must be a number" in r.stderr


# ------------------------------------------------------------------------------------ renamed options
def test_s_max_option_and_json_key(capsys):
    rc, out, err = run(["solve", "--rho", "0.9", "--s-max", "70", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and err == "" and d["s_max"] == 70 and d["s_max_auto"] is False and "smax" not in d
    assert d["throughput_per_s"] == pytest.approx(1e3 * d["throughput"])


def test_old_smax_spelling_works_with_one_deprecation_line(capsys):
    rc, out, err = run(["solve", "--rho", "0.9", "--smax", "70", "--json"], capsys)
    assert rc == 0 and json.loads(out)["s_max"] == 70
    assert err.splitlines() == ["smdp-batch: warning: --smax is deprecated; use --s-max"]


def test_old_spelling_on_an_error_stays_one_line(capsys):
    rc, _, err = run(["solve", "--smax", "10"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "s_max must be an integer ≥ Bmax = 32" in err and "--smax is deprecated; use --s-max" in err


def test_pareto_requests_and_old_spellings(capsys):
    small = ["pareto", "--rho", "0.3", "--w2-max", "3", "--points", "4", "--rtol", "0.2", "--extend", "0",
             "--no-timeouts", "--statics", "8", "--json"]
    rc, out, err = run(small + ["--requests", "2000", "--percentiles"], capsys)
    assert rc == 0 and err == ""
    f = json.loads(out)["fronts"][0]
    assert all("p95_ms" in p and "efficiency_req_per_j" in p for p in f["points"])
    rc, out2, err = run(small + ["--simulate", "2000"], capsys)
    assert rc == 0 and json.loads(out2)["fronts"][0]["points"] == f["points"]  # same count, same seed: same numbers
    assert err.splitlines() == ["smdp-batch: warning: --simulate is deprecated; use --requests N --percentiles"]
    rc, _, err = run(small + ["--baseline-requests", "5000"], capsys)
    assert rc == 0 and err.splitlines() == ["smdp-batch: warning: --baseline-requests is deprecated; use --requests"]


def test_pareto_efficiency_is_requests_per_joule(capsys):
    rc, out, _ = run(["pareto", "--rho", "0.3", "--w2-max", "3", "--points", "4", "--rtol", "0.2", "--extend", "0",
                      "--no-timeouts", "--no-baselines", "--json"], capsys)
    p = json.loads(out)["fronts"][0]["points"][0]
    lam = json.loads(out)["fronts"][0]["lam"]  # all served: throughput = λ (1/ms); P̄ in W = mJ/ms
    assert p["efficiency_req_per_j"] == pytest.approx(1e3 * lam / p["mean_power_w"], rel=1e-6)


def test_multibin_and_llm_slo_options(capsys):
    base = ["multibin", "--lam-grid", "2", "--requests", "3000", "--no-smdp", "--max-waits", "20", "--json"]
    rc, out, err = run(base + ["--slo-within-time", "60"], capsys)
    new = json.loads(out)["rows"]
    assert rc == 0 and err == "" and all("slo_attainment" in r for r in new)
    rc, out, err = run(base + ["--slo", "60"], capsys)
    assert rc == 0 and json.loads(out)["rows"] == new
    assert err.splitlines() == ["smdp-batch: warning: --slo is deprecated; use --slo-within-time"]
    base = ["llm", "--lam-grid", "1", "--requests", "40", "--schemes", "static", "--json"]
    rc, out, err = run(base + ["--slo-within-s", "5"], capsys)
    new = json.loads(out)["rows"]
    assert rc == 0 and err == ""
    rc, out, err = run(base + ["--slo", "5"], capsys)
    assert rc == 0 and json.loads(out)["rows"] == new
    assert err.splitlines() == ["smdp-batch: warning: --slo is deprecated; use --slo-within-s"]


def test_simulate_reports_the_same_throughput_keys_as_solve(capsys):
    rc, out, _ = run(["simulate", "--policy", "greedy", "--requests", "2000", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["throughput_per_s"] == pytest.approx(1e3 * d["throughput"])


def test_solve_and_evaluate_name_the_cost_alike(capsys):
    _, solved, _ = run(["solve"], capsys)
    _, evaluated, _ = run(["evaluate", "--policy", "greedy"], capsys)
    assert re.search(r"cost +ĝ = \S+ per ms \(w1·W̄ \+ w2·P̄, truncated model", solved)
    assert re.search(r"cost +ĝ = \S+ per ms \(w1·W̄ \+ w2·P̄, exact", evaluated)


# ----------------------------------------------------------------------------------------- Python API
def test_python_keyword_s_max_and_deprecated_smax():
    p = BatchingProblem.basic(rho=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = solve(p, s_max=70)
        (b,) = solve_batch([p], s_max=70)
    with pytest.warns(DeprecationWarning, match=r"solve\(smax=...\) is deprecated; use s_max"):
        old = solve(p, smax=70)
    with pytest.warns(DeprecationWarning, match=r"solve_batch\(smax=...\) is deprecated"):
        (ob,) = solve_batch([p], smax=70)
    assert new.s_max == old.s_max == b.s_max == ob.s_max == 70
    assert new.to_dict()["s_max"] == 70 and "smax" not in new.to_dict()
    with pytest.raises(TypeError, match="unexpected keyword argument 'smx'"):
        solve(p, smx=70)


def test_old_table_files_read_with_new_names(tmp_path, capsys):
    old = sorted(POLICIES.glob("*.h5"))[0]
    pf = read_policy(old)  # written before the rename: attrs smax, smax_auto
    assert {"s_max", "s_max_auto"} <= pf.truncation.keys() and "smax" not in pf.truncation
    new = tmp_path / "t.h5"
    assert main(["solve", "-o", str(new)]) == 0
    import h5py

    with h5py.File(new) as f:
        assert {"s_max", "s_max_auto"} <= set(f["truncation"].attrs)
    capsys.readouterr()
    rc, out, _ = run(["show", str(old), "--json"], capsys)
    assert rc == 0 and json.loads(out)["truncation"]["s_max"] == pf.truncation["s_max"]


# ---------------------------------------------------------------------------------------------- help
def _help(args):
    import click

    ctx = click.Context(cli, info_name="smdp-batch", max_content_width=110)
    if not args:
        return cli.get_help(ctx)
    cmd = cli.get_command(ctx, args[0])
    return cmd.get_help(click.Context(cmd, info_name=args[0], parent=ctx, max_content_width=110))


def test_top_level_help_shows_whole_sentences():
    text = " ".join(_help([]).split())
    for name, cmd in cli.commands.items():
        assert cmd.short_help and cmd.short_help.endswith("."), name
        assert f"{name} {cmd.short_help}" in text, name
    assert "..." not in text.split("Commands:", 1)[1]  # click's mark of a cut summary


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_default_shown_once_the_same_way(name):
    text = " ".join(_help([name]).split())
    assert "[default " not in text and "[1]" not in text and "[det]" not in text  # the old hand-written forms
    assert "[default: (" not in text  # click's bracketed form of described defaults
    for flag in ("--requests", "--seed", "--rho", "--s-max", "--w2-min", "--lam-grid", "--mem-gib"):
        if flag in text and f"{flag} " in text:
            seg = text.split(f"{flag} ", 1)[1].split(" --", 1)[0]
            assert seg.count("[default:") <= 1, (flag, seg)
    assert "--smax" not in text and "--simulate" not in text and "--baseline-requests" not in text  # hidden aliases
