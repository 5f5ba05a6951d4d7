"""The CLI's consistency: output formats follow (or refuse) the extension, conflicting options are refused,
long commands show progress on a terminal only, pareto lists its baselines, figures mark the SLO and the pick,
``--current`` prices your own setting, and measure's next step plans with the profile it wrote."""

from __future__ import annotations

import csv
import json
import sys

import pytest

from smdp_batch.cli import main
from test_files import one_error, run  # the CLI runner and the one-line-error check

FAST = ["--bmax", "4"]  # a scenario that solves in milliseconds
SIM = ["--requests", "2000"]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command reaches its solve, sweep or simulation."""
    import smdp_batch.analysis.pareto as pareto
    import smdp_batch.analysis.simulate as simulate
    import smdp_batch.cli.solve as solve_mod

    def boom(*a, **k):
        raise AssertionError("work ran before the output was refused")

    for mod, name in ((solve_mod, "solve"), (pareto, "sweep_fronts"), (simulate, "simulate")):
        monkeypatch.setattr(mod, name, boom)


@pytest.fixture
def policy(tmp_path, capsys):
    path = tmp_path / "pol.h5"
    assert main(["solve", *FAST, "-o", str(path)]) == 0
    capsys.readouterr()
    return path


# ------------------------------------------------------------------------------ 1. formats and extensions
@pytest.mark.parametrize("args,needles", [
    (["solve", *FAST, "-o", "t.json"], ("-o t.json", ".json", "HDF5", ".h5, .hdf5")),
    (["pareto", *FAST, "--csv", "x.h5"], ("--csv x.h5", ".h5", "CSV", ".csv")),
    (["pareto", *FAST, "--plot", "fig.csv"], ("--plot fig.csv", ".csv", ".png, .svg, .pdf")),
    (["pareto", *FAST, "--slo-mean-ms", "9", "-o", "chosen.csv"], ("-o chosen.csv", ".csv", ".h5, .hdf5")),
    (["tables", *FAST, "--w2-grid", "1", "--plot", "fig.json"], ("--plot fig.json", ".json", ".png, .svg, .pdf")),
    (["tables", *FAST, "--w2-grid", "1", "--plot", "fig"], ("--plot fig", ".png, .svg, .pdf")),
    (["llm", "--plot", "fig.h5"], ("--plot fig.h5", ".h5", ".png, .svg, .pdf")),
    (["measure", "math:fsum", "-o", "prof.h5"], ("-o prof.h5", ".h5", ".csv")),
])
def test_an_extension_naming_another_format_is_refused_before_work(tmp_path, monkeypatch, capsys, no_work, args,
                                                                   needles):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(args, capsys)
    one_error(rc, err, *needles)
    assert out == "" and list(tmp_path.iterdir()) == []


def test_fit_and_export_outputs_take_their_format(tmp_path, policy, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("t\n" + "\n".join(str(i) for i in range(300)) + "\n")
    one_error(*run(["fit-arrivals", trace, "-o", tmp_path / "fit.csv"], capsys)[::2], "fit.csv", ".csv", ".json")
    one_error(*run(["export", policy, "--to", "ray", "-o", tmp_path / "c.json"], capsys)[::2], ".json", ".py, .txt")
    one_error(*run(["export", policy, "--to", "triton", "-o", tmp_path / "c.h5"], capsys)[::2], ".h5", ".pbtxt, .txt")
    rc, _, err = run(["export", policy, "--to", "torchserve", "--requests", "2000", "-o", tmp_path / "c.json"], capsys)
    assert rc == 0, err
    assert json.loads((tmp_path / "c.json").read_text())["models"]


@pytest.mark.parametrize("ext,magic", [(".png", b"\x89PNG"), (".svg", b"<svg"), (".pdf", b"%PDF")])
def test_a_figure_follows_its_extension(tmp_path, capsys, ext, magic):
    pytest.importorskip("matplotlib")
    fig = tmp_path / f"fig{ext}"
    rc, _, err = run(["tables", *FAST, "--w2-grid", "1", "--plot", fig], capsys)
    assert rc == 0, err
    assert magic in fig.read_bytes()[:400]


def test_hdf5_and_extensionless_tables_are_written(tmp_path, capsys):
    for name in ("t.hdf5", "t"):
        rc, _, err = run(["solve", *FAST, "-o", tmp_path / name], capsys)
        assert rc == 0, err
        assert (tmp_path / name).read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"


# ------------------------------------------------------------------------------ 2. conflicting options
@pytest.mark.parametrize("args,needles", [
    (["solve", "--bmax", "16", "--batch-sizes", "1,2,4,8,32"], ("--bmax 16", "--batch-sizes 1,2,4,8,32", "32")),
    (["solve", "--bmin", "2", "--batch-sizes", "1,2,4"], ("--bmin 2", "--batch-sizes 1,2,4", "smallest")),
    (["simulate", "--policy", "greedy", "--bmax", "8", "--batch-sizes", "1,2,4"], ("--bmax 8",)),
    (["pareto", *FAST, "--w2", "3"], ("--w2 3", "pareto sweeps w2")),
    (["compare", *FAST, "--slo-p99-ms", "20", "--w2", "1"], ("--w2 1", "compare searches")),
    (["compare", *FAST, "--slo-p99-ms", "20", "--w1", "2"], ("--w1 2", "compare searches")),
    (["tables", *FAST, "--w2-grid", "1", "--w2", "2"], ("--w2 2", "--w2-grid")),
    (["simulate", *FAST, "--policy", "greedy", "--w2", "2"], ("--w2 2", "smdp:w2=X")),
    (["solve", "--rps", "800", "--lam", "1"], ("--rps", "--lam")),
    (["solve", "--rps", "800", "--rho", "0.5"], ("--rps", "--rho")),
    (["measure", "math:fsum", "--rps", "800", "--lam", "1", "-o", "p.csv"], ("--rps", "--lam")),
])
def test_conflicting_options_are_refused(tmp_path, monkeypatch, capsys, no_work, args, needles):
    monkeypatch.chdir(tmp_path)
    one_error(*run(args, capsys)[::2], *needles)


def test_agreeing_bounds_and_rps_are_accepted(capsys):
    rc, out, err = run(["solve", "--bmax", "8", "--bmin", "2", "--batch-sizes", "2,4,8", "--rps", "800", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["batch_sizes"] == [2, 4, 8] and d["lam"] == pytest.approx(0.8)


# ------------------------------------------------------------------------------ 3. progress on a terminal only
LONG = {
    "compare": ["compare", *FAST, "--slo-p99-ms", "20", "--requests", "1000"],
    "pareto": ["pareto", *FAST, *SIM, "--no-timeouts"],
    "tables": ["tables", *FAST, "--w2-grid", "0.5,1"],
    "simulate": ["simulate", *FAST, "--policy", "greedy", *SIM],
}
MODULE = {"compare": "smdp_batch.cli.simulate", "pareto": "smdp_batch.cli.pareto", "tables": "smdp_batch.cli.solve"}


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("cmd", sorted(LONG))
def test_progress_only_on_a_terminal(monkeypatch, capsys, cmd, tty):
    import smdp_batch.cli.options as options

    monkeypatch.setattr(options, "PROGRESS_AFTER_S", 0.0)  # show it at once
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    calls = []
    if cmd in MODULE:
        mod = sys.modules[MODULE[cmd]]
        real = mod.progress_line

        def spy(enabled, *a, **k):
            tick, finish = real(enabled, *a, **k)
            calls.append(enabled)
            return (None if tick is None else lambda n: (calls.append("tick"), tick(n))), finish

        monkeypatch.setattr(mod, "progress_line", spy)
    rc, out, err = run(LONG[cmd], capsys)
    assert rc == 0, err
    if tty:
        assert ("done" in err or "simulating" in err), err
        if cmd in MODULE:
            assert calls[0] is True and "tick" in calls
    else:
        assert err == ""
        if cmd in MODULE:
            assert calls == [False]


def test_fit_arrivals_auto_reports_progress(tmp_path, monkeypatch, capsys):
    pytest.importorskip("hmmlearn")
    import numpy as np
    import smdp_batch.cli.options as options

    t = np.cumsum(np.random.default_rng(0).exponential(1.0, 400))
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_ms\n" + "\n".join(f"{x:.6f}" for x in t) + "\n")
    monkeypatch.setattr(options, "PROGRESS_AFTER_S", 0.0)
    for tty in (False, True):
        monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)  # noqa: B023 - replaced each iteration
        rc, _, err = run(["fit-arrivals", trace, "--phases", "auto"], capsys)
        assert rc == 0, err
        assert ("phase counts fitted: 4/4 done" in err) == tty, err


def test_measure_progress_bar_only_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    from smdp_batch.measure.run import _progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert _progress(10, None) is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = _progress(10, None)
    assert bar is not None
    bar.close()


# ------------------------------------------------------------------------------ 4. pareto lists its baselines
def test_pareto_text_lists_every_baseline(capsys):
    rc, out, err = run(["pareto", *FAST, *SIM, "--json"], capsys)
    assert rc == 0, err
    baselines = json.loads(out)["fronts"][0]["baselines"]
    assert {b["family"] for b in baselines} >= {"greedy", "static", "triton", "ray"}
    rc, text, err = run(["pareto", *FAST, *SIM], capsys)
    assert "setting" in text and "W̄ ms" in text and "P̄ W" in text
    for b in baselines:
        line = next(x for x in text.splitlines() if x.strip().startswith(b["setting"] + " "))
        assert f"{b['mean_latency_ms']:.4g}" in line and f"{b['mean_power_w']:.4g}" in line


# ------------------------------------------------------------------------------ 5. figures: SLO line, pick
def _legend_texts(fig) -> list[str]:
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is not None:
            out += [t.get_text() for t in leg.get_texts()]
    return out + [t.get_text() for leg in fig.legends for t in leg.get_texts()]


@pytest.mark.parametrize("kind,slo,label", [
    ("percentiles", ["--slo-p99-ms", "20"], "SLO p99 ≤ 20 ms"),
    ("tradeoff", ["--slo-mean-ms", "8"], "SLO W̄ ≤ 8 ms"),
])
def test_pareto_figure_draws_the_slo_and_marks_the_pick_and_yours(tmp_path, monkeypatch, capsys, kind, slo, label):
    pytest.importorskip("matplotlib")
    import smdp_batch.analysis.plots as plots

    figs = []
    real = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: (figs.append(fig), real(fig, path))[1])
    png = tmp_path / "p.png"
    rc, _, err = run(["pareto", *FAST, *SIM, "--no-timeouts", *slo, "--plot-kind", kind, "--plot", png,
                      "--current", "static:2"], capsys)
    assert rc == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"
    texts = _legend_texts(figs[0])
    assert label in texts and f"{label}: least power" in texts and "your setting static:2" in texts
    gids = {line.get_gid() for ax in figs[0].axes for line in ax.get_lines()}
    assert {"slo-pick", "current-setting"} <= gids


# ------------------------------------------------------------------------------ 6. --current
def test_compare_prices_your_setting(capsys):
    from tests.test_json_contract import undocumented

    args = ["compare", *FAST, "--slo-p99-ms", "20", "--requests", "2000", "--current", "triton:max=4,delay_us=1000"]
    rc, text, err = run(args, capsys)
    assert rc == 0, err
    line = next(x for x in text.splitlines() if x.strip().startswith("your setting"))
    assert "triton:max=4,delay_us=1000" in line and "P̄ " in line and "p99 " in line and "req/s" in line
    assert ("meets the SLO" in line) != ("breaks the SLO" in line)
    assert "the recommendation draws" in line or "it is the recommendation" in line
    rc, out, err = run([*args, "--json"], capsys)
    d = json.loads(out)
    cur = d["current"]
    assert cur["setting"] == "triton:max=4,delay_us=1000" and cur["knobs"] == {"current": True}
    assert cur["versus"]["power_w"] == pytest.approx(cur["mean_power_w"])
    assert undocumented("compare", d) == []


def test_compare_current_that_cannot_carry_the_load(capsys):
    rc, text, err = run(["compare", *FAST, "--rho", "0.9", "--slo-p99-ms", "40", "--requests", "2000",
                         "--current", "static:1"], capsys)
    assert rc == 0, err
    line = next(x for x in text.splitlines() if x.strip().startswith("your setting"))
    assert "cannot carry" in line and "breaks the SLO" in line


@pytest.mark.parametrize("bad,needle", [("triton:max=64,delay_us=10", "executes batch size"), ("nonsense:3", "nonsense")])
def test_a_bad_current_is_refused_before_work(capsys, no_work, bad, needle):
    one_error(*run(["compare", *FAST, "--slo-p99-ms", "20", "--current", bad], capsys)[::2], needle)
    one_error(*run(["pareto", *FAST, "--current", bad], capsys)[::2], needle)


def test_pareto_marks_your_setting_in_text_csv_and_json(tmp_path, capsys):
    from tests.test_json_contract import undocumented

    table = tmp_path / "p.csv"
    args = ["pareto", *FAST, *SIM, "--no-timeouts", "--slo-p99-ms", "20", "--current", "ray:max=4,timeout_s=0.001",
            "--csv", table]
    rc, text, err = run(args, capsys)
    assert rc == 0, err
    mine = [x for x in text.splitlines() if x.strip().startswith("your setting ray:max=4,timeout_s=0.001")]
    assert len(mine) == 2  # on the front, and in the SLO answer
    assert "W̄ " in mine[0] and "the front draws" in mine[0]
    rows = [r for r in csv.DictReader(table.open()) if r["kind"] == "current"]
    assert len(rows) == 1 and rows[0]["setting"] == "ray:max=4,timeout_s=0.001" and rows[0]["family"] == "ray"
    rc, out, err = run([*args, "--json"], capsys)
    d = json.loads(out)
    front = d["fronts"][0]
    assert front["current"]["setting"] == "ray:max=4,timeout_s=0.001" and "margin_w" in front["current"]
    assert front["slo_answer"]["current"]["setting"] == "ray:max=4,timeout_s=0.001"
    assert undocumented("pareto", d) == []


# ------------------------------------------------------------------------------ 7. measure's next step
def _next_line(text: str) -> str:
    return next(x for x in text.splitlines() if x.strip().startswith("next"))


def test_measure_next_step_plans_with_the_profile(tmp_path, monkeypatch, capsys):
    from tests.test_json_contract import undocumented

    monkeypatch.chdir(tmp_path)
    base = ["measure", "math:fsum", "--sizes", "1,2,4", "--repeats", "2", "--warmup", "0"]
    rc, text, err = run([*base, "-o", "a.csv"], capsys)  # no energy counter here, no load
    assert rc == 0, err
    line = _next_line(text)
    # without a load it plans at ρ = 0.5, so that the line runs as printed, and says how to give the load
    assert "solve --latency csv:a.csv --batch-sizes 1,2,4 --rho 0.5" in line and "--energy" not in line
    assert "for your load give --rps" in text and "--power" in text
    rc, _, err = run(line.partition("; ")[2].split()[1:], capsys)
    assert rc == 0, err
    rc, text, err = run([*base, "--power-w", "70", "--rps", "800", "-o", "b.csv"], capsys)
    assert rc == 0, err
    line = _next_line(text)
    assert "solve --latency csv:b.csv --energy csv:b.csv --batch-sizes 1,2,4 --rps 800" in line
    assert "YOUR_LOAD" not in text
    rc, out, err = run([*base, "--power-w", "70", "--lam", "0.8", "-o", "c.csv", "--json"], capsys)
    d = json.loads(out)
    assert d["next"].endswith("--batch-sizes 1,2,4 --lam 0.8") and "--energy csv:c.csv" in d["next"]
    assert undocumented("measure", d) == []
    # the printed command runs, on the profile's own l(b) and ζ(b)
    rc, out, err = run(d["next"].split()[1:] + ["--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["batch_sizes"] == [1, 2, 4] and s["lam"] == pytest.approx(0.8)


def test_a_percentile_slo_on_the_tradeoff_figure_says_where_its_bound_is(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc, _, err = run(["pareto", *FAST, *SIM, "--no-timeouts", "--slo-p99-ms", "20", "--plot", tmp_path / "t.png"], capsys)
    assert rc == 0, err
    assert "p99 bound is drawn by --plot-kind percentiles" in err


@pytest.mark.parametrize("spec", ["poisson:", " Poisson ", "poisson :"])
def test_every_poisson_spelling_solves_as_poisson(spec, capsys):
    """parse_arrivals reads these as Poisson; solve routes them so (it once sent them down the MAP path and
    ended in an internal error)."""
    from smdp_batch.cli import main

    assert main(["solve", "--arrivals", spec, "--json"]) == 0
    plain = capsys.readouterr().out
    assert main(["solve", "--json"]) == 0
    assert json.loads(plain)["policy"] == json.loads(capsys.readouterr().out)["policy"]
