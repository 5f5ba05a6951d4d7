"""Hard inputs for the automatic truncation: seconds, s_max, Δ and the converged range per case.

Not a timed test: run it and read the table (docs/benchmarks.md quotes its output)::

    python benchmarks/bench_hard.py            # every case, converged tables (s_max "auto")
    python benchmarks/bench_hard.py --quick    # the solve cases only, no fronts

Each case is solved once after the kernels are loaded (numba's compile is kept out, as in
``Solution.seconds``).  Columns: wall seconds of ``solve()``, the truncation s_max, Δ, R =
``converged_upto`` (marked when it ends a probable-range table, whose π(R) is not the limit action:
large Bmax, :func:`smdp_batch.solvers.search._search_probable`) and the number of truncations solved.  Δ is the truncation's error measure: on the
tail boundary (the default) |ĝ(s_max) − ĝ(s_max/2)|, on eq. 19's overflow boundary (``--boundary
overflow``, the rule before the tail boundary) S_o's share of the cost (eq. 22); both in cost per ms.  Fronts are ``sweep_w2`` with the default
settings (no simulated baselines), at the default front tolerance ftol = 1e-3 and, where it is quick,
at ftol = 0 (every distinct policy).  A case that cannot be solved prints the one-line refusal the CLI
would print.

``--side-by-side`` (also part of the default run) times two cases against the search as it was before the
long-queue action of :mod:`smdp_batch.solvers.limit`: the tail boundary fixed at B = Bmax (no move to a tied
size the table settles on) and no reach check before work.  Columns: seconds and outcome of each, and the
ratio old/new::

    python benchmarks/bench_hard.py --side-by-side
"""

from __future__ import annotations

import argparse
import time
import warnings

from smdp_batch import BatchingProblem, InputError, solve
from smdp_batch.analysis.pareto import sweep_w2
from smdp_batch.solvers.geometric_pi import warm_up_geometric
from smdp_batch.solvers.pi import warm_up_pi
from smdp_batch.solvers.limit import reach
from smdp_batch.solvers.search import (PROBABLE_MASS, PROBABLE_START, SMAX_LIMIT, Candidates, _search_probable,
                                       _search_tail, limiting_actions)

AFF, LIN = "affine:0.3051,1.0524", "affine:19.899,19.603"


def basic(rho: float, w2: float = 1.0, **kw) -> BatchingProblem:
    kw.setdefault("batch_sizes", range(1, 33))
    return BatchingProblem.from_rho(rho, latency=kw.pop("latency", AFF), energy=LIN, w2=w2, **kw)


SOLVES = [
    ("basic ρ=0.5, w2=1 (smdp-batch solve)", lambda: basic(0.5)),
    ("--service gamma:0.5 --rho 0.9", lambda: basic(0.9, service="gamma:0.5")),
    ("--service hyperexp --rho 0.9 --w2 2", lambda: basic(0.9, 2.0, service="hyperexp")),
    ("--rho 0.9 --w2 100", lambda: basic(0.9, 100.0)),
    ("--service lognormal:1 --rho 0.7", lambda: basic(0.7, service="lognormal:1")),
    ("--bmax 128 --rho 0.9 --service exp", lambda: basic(0.9, batch_sizes=range(1, 129), service="exp")),
    ("--bmax 256 --rho 0.9 --service exp", lambda: basic(0.9, batch_sizes=range(1, 257), service="exp")),
    ("--bmax 1024 --rho 0.9 --service exp", lambda: basic(0.9, batch_sizes=range(1, 1025), service="exp")),
    ("--bmax 4096 --rho 0.9", lambda: basic(0.9, batch_sizes=range(1, 4097))),
    ("--bmax 4096 --rho 0.9 --batch-sizes 1,2,4,…,4096",
     lambda: basic(0.9, batch_sizes=[2 ** i for i in range(13)])),
] + [
    (f"Prop. 4 l={l} ρ={rho} w2=100", (lambda l=l, rho=rho: basic(rho, 100.0, batch_sizes=range(1, 9),
                                                                   latency=f"const:{l}", service="exp")))
    for l in (2.4252, 1.7465) for rho in (0.3, 0.5, 0.7, 0.9)
]

FRONTS = [  # (name, problem, ftol): the default front tolerance, and ftol = 0 (every policy) where it is quick
    ("front: basic ρ=0.3", lambda: basic(0.3), 1e-3),
    ("front: basic ρ=0.3, every policy (ftol=0)", lambda: basic(0.3), 0.0),
    ("front: basic ρ=0.7", lambda: basic(0.7), 1e-3),
    ("front: basic ρ=0.7, every policy (ftol=0)", lambda: basic(0.7), 0.0),
    ("front: Fig. 9 hyperexp ρ=0.7", lambda: basic(0.7, service="hyperexp"), 1e-3),
]


SIDE_BY_SIDE = [
    ("ties: --latency affine:0.25,0 --rho 0.5", lambda: basic(0.5, latency="affine:0.25,0")),
    ("--bmax 128 --rho 0.9 --service exp", lambda: basic(0.9, batch_sizes=range(1, 129), service="exp")),
    ("--bmax 256 --rho 0.9 --service exp", lambda: basic(0.9, batch_sizes=range(1, 257), service="exp")),
    ("--bmax 1024 --rho 0.9 --service exp", lambda: basic(0.9, batch_sizes=range(1, 1025), service="exp")),
]


def _outcome(run) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = run()
    except InputError as e:
        return time.perf_counter() - t0, f"refused: {str(e)[:60]}…"
    dt = time.perf_counter() - t0
    R, pol = found.converged_upto, found.policy
    kind = "probable range" if found.probable else "converged"
    return dt, f"R = {R} ({kind}), serve {int(pol[R])} beyond, table of {len(pol)} entries"


def _old_search(p: BatchingProblem):
    """The converged search before the long-queue action module: B = Bmax fixed, no reach check."""
    cands = Candidates(p, 1e-3, tail=max(limiting_actions(p)))
    cands.tried = set(limiting_actions(p))  # never move the boundary to a tied size
    t0 = time.perf_counter()
    try:
        cands.check_work(4 * p.bmax)
    except InputError:
        return _search_probable(cands, t0)
    return _search_tail(cands, 4 * p.bmax, SMAX_LIMIT, t0)


def _new_search(p: BatchingProblem):
    s = solve(p)
    return type("Found", (), {"converged_upto": s.converged_upto, "policy": s.policy,
                              "probable": s.converged_to_limit is False})


def side_by_side() -> None:
    print("| case | new: seconds | new: outcome | old path: seconds | old path: outcome | old/new |")
    print("|---|---|---|---|---|---|")
    for name, make in SIDE_BY_SIDE:
        p = make()
        t_new, new = _outcome(lambda: _new_search(p))  # noqa: B023 - called in this iteration
        t_old, old = _outcome(lambda: _old_search(p))  # noqa: B023 - called in this iteration
        print(f"| {name} | {t_new:.3f} | {new} | {t_old:.3f} | {old} | {t_old / t_new:.0f}× |", flush=True)
    r = reach(SIDE_BY_SIDE[1][1](), SMAX_LIMIT, PROBABLE_START)
    print(f"\nexp Bmax 1024 ρ 0.9: the limit action's run starts near n ≈ {r.onset:.0f} (n*(0)), a converged table needs "
          f"a truncation ≥ {4 * r.onset:.0f}; the probable range reaches n ≈ {r.floor:.0f}; longest truncation within "
          f"the limits: {r.fit}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="solve cases only")
    ap.add_argument("--side-by-side", action="store_true", help="only the new/old search comparison")
    ap.add_argument("--s-max", default="auto", help="auto (default) or minimal")
    ap.add_argument("--boundary", default=None, choices=("tail", "overflow"),
                    help="the converged rule's truncation boundary (default: tail)")
    args = ap.parse_args()
    warm_up_pi()
    warm_up_geometric()
    if args.side_by_side:
        return side_by_side()
    print("| case | seconds | s_max | Δ | converged up to R | truncations |")
    print("|---|---|---|---|---|---|")
    for name, make in SOLVES:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                s = solve(make(), s_max=args.s_max, boundary=args.boundary)
        except InputError as e:
            print(f"| {name} | {time.perf_counter() - t0:.2f} | refused: {str(e)[:110]}… | | | |", flush=True)
            continue
        dt = time.perf_counter() - t0
        R = "not verified" if s.converged_upto is None else s.converged_upto
        if s.converged_to_limit is False:
            R = f"{R} (probable range: P(N > R) < {PROBABLE_MASS:g}; not the limit)"
        print(f"| {name} | {dt:.2f} | {s.s_max} | {s.evaluation.delta:.1e} | {R} | {s.candidates} |", flush=True)
    if args.quick:
        return
    print()
    side_by_side()
    print()
    print("| front | seconds | solves | points (policies) | gaps left within ftol |")
    print("|---|---|---|---|---|")
    for name, make, ftol in FRONTS:
        solves = []
        t0 = time.perf_counter()
        f = sweep_w2(make(), ftol=ftol, progress=solves.append)
        print(f"| {name} | {time.perf_counter() - t0:.2f} | {sum(solves)} | {len(f.points)} | {len(f.open_gaps)} |", flush=True)


if __name__ == "__main__":
    main()
