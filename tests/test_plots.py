"""Figures people keep (issue 19 item 5): structural checks on every figure, cheap (no solves).

Each figure is built from hand-made fronts and baselines, then read back: a legend on every panel
(or a colour bar, or the figure's shared legend), a unit in brackets or parentheses on every axis,
one colour and marker per rule family, the SLO pick and the current setting where asked, and
Fig. 3's wait cells blank as its legend says.
"""

import re

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from smdp_batch import BatchingProblem  # noqa: E402
from smdp_batch.analysis.pareto import BaselinePoint, Front, FrontPoint  # noqa: E402
from smdp_batch.analysis.plots import FAMILY_STYLE, plot_percentiles, plot_policies, plot_tradeoff  # noqa: E402
from smdp_batch.llm.sweep import plot_rows, scheme_style  # noqa: E402

UNIT = re.compile(r"\[[^\]]+\]|\([^)]+\)")
FAMILIES = ("greedy", "static", "triton", "tfserving", "ray", "torchserve")


def _front(rho, label="", scale=1.0):
    p = BatchingProblem.basic(rho=rho) if not label else BatchingProblem.preset(label, rho=rho)
    pts = []
    for j, (w, pw) in enumerate([(2.5, 28.0), (3.5, 23.0), (4.9, 21.1), (8.0, 19.8), (15.0, 18.8), (28.0, 18.2)]):
        pts.append(FrontPoint(w2_lo=0.0 if j == 0 else 0.3 * j, w2_hi=0.3 * j + 0.2, mean_latency_ms=w,
                              mean_power_w=scale * pw, throughput=p.lam, policy=[0, 1, 2], control_limit=1,
                              percentiles={"p50_ms": w, "p95_ms": 2 * w, "p99_ms": 3 * w},
                              within={10.0: min(1.0, 5.0 / w)}))
    return Front(p, pts, label)


def _baselines(scale=1.0):
    out = []
    for k, fam in enumerate(FAMILIES):
        for j in range(1 if fam == "greedy" else 3):
            w = 2.6 + 4 * j + 0.3 * k
            setting = {"greedy": "greedy", "static": f"static:{2 ** (j + 1)}"}.get(fam, f"{fam}:{j + 1}")
            out.append(BaselinePoint(fam, setting, w, scale * (30 - 2 * j - 0.1 * k), 0.1, fam in ("greedy", "static"),
                                     percentiles={"p95_ms": 2 * w}, within={10.0: min(1.0, 4.0 / w)}))
    return out


def _axes_with_legends_and_units(fig):
    panels = [ax for ax in fig.axes if ax.get_visible() and not hasattr(ax, "_colorbar")]
    cbars = [ax for ax in fig.axes if hasattr(ax, "_colorbar")]
    assert panels
    for ax in panels:
        twins = ax.get_shared_x_axes().get_siblings(ax)
        has = any(t.get_legend() is not None for t in twins) or fig.legends or (cbars and ax.images)
        assert has, f"panel {ax.get_title()!r} has no legend"
        twin = len(twins) > 1 and not ax.get_xlabel()  # a twinx panel labels its own y axis only
        for label in ([ax.get_ylabel()] if twin else [ax.get_xlabel(), ax.get_ylabel()]):
            assert UNIT.search(label), f"axis label {label!r} of {ax.get_title()!r} has no unit"
    return panels


def _gid(fig, gid):
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]


def test_family_styles_are_distinct():
    colours = [s["color"] for s in FAMILY_STYLE.values()]
    markers = [s["marker"] for s in FAMILY_STYLE.values()]
    assert len(set(colours)) == len(colours) == 7 and len(set(markers)) == len(markers)
    assert {"smdp", *FAMILIES} == set(FAMILY_STYLE)


def test_tradeoff_families_pick_current_legends_units():
    fronts = [_front(0.3), _front(0.7, scale=2.0)]
    base = {0: _baselines(), 1: _baselines(2.0)}
    fig = plot_tradeoff(fronts, base, chosen=[fronts[0].points[2], None], slo="W̄ ≤ 5 ms", slo_mean_ms=5.0,
                        current=(7.0, 22.0, "my Triton"))
    ax_p, ax_e = _axes_with_legends_and_units(fig)
    for ax in (ax_p, ax_e):
        drawn = {line.get_color() for line in ax.get_lines()}
        for fam in ("smdp", *FAMILIES):  # every family is drawn in its own colour, in both panels
            assert FAMILY_STYLE[fam]["color"] in drawn, fam
    legend_colours = {h.get_color(): h.get_marker() for h in ax_e.get_legend().legend_handles}
    assert len(legend_colours) == 7 and len(set(legend_colours.values())) == 7
    pick = _gid(fig, "slo-pick")
    assert len(pick) == 2 and pick[0].get_xdata()[0] == 4.9  # starred in both panels
    assert any("W̄ ≤ 5 ms" in t.get_text() for t in ax_p.get_legend().get_texts())
    assert any("21.1 W" in t.get_text() for t in ax_p.texts)  # …and labelled with its power and w2 range
    cur = _gid(fig, "current-setting")
    assert cur and cur[0].get_label() == "my Triton" and cur[0].get_marker() != pick[0].get_marker()


def test_tradeoff_without_slo_has_no_pick():
    fig = plot_tradeoff([_front(0.3)], {0: _baselines()})
    _axes_with_legends_and_units(fig)
    assert not _gid(fig, "slo-pick") and not _gid(fig, "current-setting")


@pytest.mark.parametrize("names", [("basic", "fig8-log-energy"), ("basic", "fig9-exp")])
def test_scenario_figures(names):
    fronts = [_front(r, n if n != "basic" else "", 1 + i) for i, n in enumerate(names) for r in (0.3,)]
    fig = plot_tradeoff(fronts, {i: _baselines() for i in range(len(fronts))}, model_panel=True)
    panels = _axes_with_legends_and_units(fig)
    assert len(panels) >= 3


def test_percentiles_legends_units_and_pick():
    front = _front(0.7)
    x = np.linspace(0, 30, 50)
    cdfs = {"greedy": (x, x / 30), "static:8": (x, x / 30), "SMDP w2 ∈ [1.4, 1.6] (chosen)": (x, x / 30)}
    fig = plot_percentiles(front, _baselines(), cdfs, 10.0, chosen=front.points[2], slo="p95 ≤ 10 ms", slo_ms=10.0)
    panels = _axes_with_legends_and_units(fig)
    assert len(panels) == 3 and all(ax.get_legend() is not None for ax in panels)
    assert len(_gid(fig, "slo-pick")) == 2  # percentile and satisfaction panels
    red_stars = [line for ax in panels for line in ax.get_lines() if line.get_color() == "C3"]
    assert not red_stars  # baselines take their family's colour, not one red for all
    fam_colours = {h.get_color() for h in panels[2].get_legend().legend_handles}
    assert all(FAMILY_STYLE[f]["color"] in fam_colours for f in FAMILIES)


def _grid(bmax, n):
    grid = {}
    for i, rho in enumerate((0.1, 0.5, 0.9)):
        for w2 in (0, 1, 5):
            q = min(bmax, 1 + i + int(3 * w2))
            grid[(rho, w2)] = (np.array([0 if k < q else min(k, bmax) for k in range(n)]), q)
    return grid


@pytest.mark.parametrize("bmax", [8, 64])
def test_policy_chart_wait_cells_blank(bmax):
    grid = _grid(bmax, 4 * bmax)
    fig = plot_policies(grid, range(1, bmax + 1))
    panels = _axes_with_legends_and_units(fig)
    assert any(hasattr(ax, "_colorbar") and UNIT.search(ax.get_ylabel()) for ax in fig.axes)
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any("blank: wait" in t for t in labels)
    w2s = sorted({w for _, w in grid})
    rhos = sorted({r for r, _ in grid})
    for ax, w2 in zip(panels, w2s):
        texts = ax.texts
        assert texts
        for t in texts:
            x, y = t.get_position()
            pol, q = grid[(rhos[int(round(y))], w2)]
            if bmax == 8:  # each cell's number is its action, never 0
                assert t.get_text() == str(int(pol[int(round(x))])) != "0"
            else:  # too narrow for numbers: only the control limit is named, beside its box
                assert t.get_text() == f"Q={q}, b={int(pol[q])}"


def test_llm_and_multibin_rows():
    rows = [dict(lam=lam, scheme=s, throughput_tok_s=100 * lam * (1 + j / 10), mean_latency_s=(1 + j) * lam,
                 slo_attainment=1 / (1 + j)) for lam in (0.5, 1, 2) for j, s in
            enumerate(["static B=16", "continuous B=64", "per-bin SMDP k=4", "multi-bin k=4 B=16", "SLA D=24 ms"])]
    fig = plot_rows(rows, [("throughput_tok_s", "throughput [tokens/s]"), ("mean_latency_s", "mean latency [s]"),
                           ("slo_attainment", "requests within 20 s [%]", 100.0)], "t",
                    xlabel="arrival rate λ [requests/s]")
    _axes_with_legends_and_units(fig)
    assert fig.legends  # one legend for the schemes, shared by the panels
    styles = {(st["color"], st["marker"], str(st["linestyle"])) for st in
              (scheme_style(s, j) for j, s in enumerate({r["scheme"] for r in rows}))}
    assert len(styles) == 5
    assert scheme_style("per-bin SMDP")["color"] == FAMILY_STYLE["smdp"]["color"]
    lat = fig.axes[1]
    assert lat.get_yscale() == "log"  # 0.5 … 10 s spans more than a decade
    assert max(fig.axes[2].get_lines()[0].get_ydata()) == 100.0
