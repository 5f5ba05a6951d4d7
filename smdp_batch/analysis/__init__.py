"""What a policy does once it runs: event simulation, real servers' rules compared, trade-off fronts, figures.

* :mod:`.simulate` — the numba event simulator of paper 004's batch server (tables and server rules).
* :mod:`.compare` — each server rule's best timeout at an SLO, against the SMDP table.
* :mod:`.pareto` — w2 sweeps, the latency–power front, dominance of baselines, the SLO pick.
* :mod:`.parallel` — the local or Dask mapper the sweeps run on.
* :mod:`.report` — policies described in words; :mod:`.plots` — the paper's figures (matplotlib).

Exact evaluation of a policy is the solvers' (:mod:`smdp_batch.solvers.evaluation`): it is the
same banded linear algebra, and :func:`~smdp_batch.solvers.solve` reports it for every solution.
"""
