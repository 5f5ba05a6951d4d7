"""Time smdp-batch's solvers against pymdptoolbox and mdpsolver on the identical discretized MDP.

Cases (paper 004 basic scenario, w1 = w2 = 1, c_o = 100, ε = 0.01):
  A  ρ = 0.9, Bmax = 32,  s_max = 70   (Table II row)
  B  ρ = 0.5, Bmax = 32,  s_max = 160  (Table III)
  C  ρ = 0.9, Bmax = 128, s_max = 400

All solvers run in this one process on the same machine.  Peers get the dense discretized MDP of
eq. 23 (infeasible actions: self-loop with a prohibitive cost); building their arrays is not
timed.  Times are the best of --repeat runs (after one warm-up for our numba kernels).  The
"policy" column says whether a solver returned exactly the policy of our exact policy iteration.

    python benchmarks/bench_solvers.py                # all cases, all peers
    python benchmarks/bench_solvers.py --cases A,B --no-slow-peers
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from smdp_batch import BatchingProblem, truncate
from smdp_batch.solvers import policy_iteration, relative_value_iteration

CASES = {
    "A": dict(rho=0.9, bmax=32, smax=70),
    "B": dict(rho=0.5, bmax=32, smax=160),
    "C": dict(rho=0.9, bmax=128, smax=400),
}


def discretized_dense(model, eta):
    """(A, S, S) transitions and (S, A) rewards −c̃ of eq. 23 for the peers."""
    M = model.dense()
    S, A = model.n_states, len(model.actions)
    feas = model.feasible()
    costs = model.costs()
    P = np.zeros((A, S, S))
    R = np.full((S, A), -1e9)
    for i in range(A):
        w = eta / model.y[i]
        rows = np.nonzero(feas[:, i])[0]
        P[i, rows] = w * M[rows, i]
        P[i, rows, rows] += 1 - w
        R[rows, i] = -costs[rows, i] / model.y[i]
        bad = np.nonzero(~feas[:, i])[0]
        P[i, bad, bad] = 1.0
    return P, R


def best_time(fn, repeat):
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="A,B,C")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--eps", type=float, default=0.01)
    ap.add_argument("--no-slow-peers", action="store_true", help="skip pymdptoolbox RVI (tens of seconds on case C)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rows, summary = [], []
    for name in args.cases.split(","):
        c = CASES[name]
        p = BatchingProblem.from_rho(c["rho"], batch_sizes=range(1, c["bmax"] + 1), w2=1.0)
        model = truncate(p, c["smax"], 100.0)
        policy_iteration(model), relative_value_iteration(model, eps=args.eps)  # JIT warm-up
        t_pi, pi = best_time(lambda: policy_iteration(model), args.repeat)
        ref = pi.policy
        t_rvi, rvi = best_time(lambda: relative_value_iteration(model, eps=args.eps), args.repeat)
        res = [("smdp-batch PI (default)", t_pi, True), ("smdp-batch RVI", t_rvi, np.array_equal(rvi.policy, ref))]
        eta = rvi.eta
        P, R = discretized_dense(model, eta)
        try:
            import mdptoolbox.mdp as mtb

            if not args.no_slow_peers:
                def peer_rvi():
                    m = mtb.RelativeValueIteration(P, R, epsilon=args.eps, max_iter=1_000_000)
                    m.run()
                    return model.actions[np.array(m.policy)]

                t, pol = best_time(peer_rvi, 1 if name == "C" else min(args.repeat, 3))
                res.append(("pymdptoolbox RelativeValueIteration", t, np.array_equal(pol, ref)))

            def peer_pi():
                m = mtb.PolicyIteration(P, R, 0.999999, max_iter=10_000)
                m.run()
                return model.actions[np.array(m.policy)]

            t, pol = best_time(peer_pi, min(args.repeat, 3))
            res.append(("pymdptoolbox PolicyIteration (γ=0.999999)", t, np.array_equal(pol, ref)))
        except ImportError:
            print("pymdptoolbox not installed (pip install -e '.[bench]')")
        try:
            import mdpsolver

            S, A = model.n_states, len(model.actions)
            probs = [[list(P[a, s][P[a, s] > 0]) for a in range(A)] for s in range(S)]
            cols = [[list(np.nonzero(P[a, s] > 0)[0].astype(int)) for a in range(A)] for s in range(S)]
            rew = R.tolist()

            def peer_mdpsolver():
                m = mdpsolver.model()
                m.mdp(discount=0.999999, rewards=rew, tranMatProbs=probs, tranMatColumns=cols)
                m.solve(algorithm="mpi", criterion="average", tolerance=args.eps, verbose=False)
                return model.actions[np.array(m.getPolicy())]

            t, pol = best_time(peer_mdpsolver, min(args.repeat, 3))
            res.append(("mdpsolver MPI (criterion=average)", t, np.array_equal(pol, ref)))
        except ImportError:
            print("mdpsolver not installed (pip install -e '.[bench]')")
        peers = [(t, n) for n, t, _ in res if not n.startswith("smdp-batch")]
        for n, t, same in res:
            rows.append((name, n, t, t / t_pi, same))
        if peers:
            t_best, n_best = min(peers)
            summary.append(f"case {name}: our default (PI) is {t_best / t_pi:.1f}x faster than the fastest peer ({n_best})")
    print(f"\n{'case':4} {'solver':42} {'ms':>10} {'/ our PI':>9}  same policy as our PI")
    for name, n, t, ratio, same in rows:
        print(f"{name:4} {n:42} {t * 1e3:10.2f} {ratio:9.1f}  {'yes' if same else 'NO'}")
    print()
    print("\n".join(summary))

if __name__ == "__main__":
    main()
