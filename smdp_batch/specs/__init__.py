"""Specifications and checks that both the model and the runtime make (numpy only).

A server imports :mod:`smdp_batch.runtime` without the model's dependencies (numba, scipy), and the model
must not import the serving floor; what both must agree on lives here, just above
:mod:`smdp_batch.errors` and :mod:`smdp_batch.limits`:

* :mod:`~smdp_batch.specs.contention` — instances slowing each other (the ``K:S[:E]`` spec and its checks);
* :mod:`~smdp_batch.specs.mapcheck` — a Markovian arrival process (D0, D1): shapes, signs, rates, reach;
* :mod:`~smdp_batch.specs.rows` — a table given as rows (busy-aware tables): one array, or the one phrase
  that says why it is not one.
"""

from .contention import Contention, parse_contention
from .mapcheck import PHASE_LIMIT, check_map
from .rows import as_rows

__all__ = ["Contention", "parse_contention", "PHASE_LIMIT", "check_map", "as_rows"]
