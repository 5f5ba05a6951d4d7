"""A table given as rows: one numpy array, or the phrase that says why it is not one.

A busy-aware table (one row n ↦ b per busy count k = 0..c−1) reaches three readers: the runtime's
:class:`~smdp_batch.runtime.PolicyTable`, the simulator's rule
(:func:`~smdp_batch.baselines.servers.busy_table_rule`) and the exact evaluation
(:func:`~smdp_batch.solvers.multi_pi.evaluate_instances_table`).  Each checks the shape it needs and says
what it got in the same words; rows of different lengths, which numpy refuses to stack, are named as such
rather than as an empty shape.

>>> as_rows([[0, 1], [0, 1]])[1]
'shape (2, 2)'
>>> as_rows([[0, 1], [0]])[1]
'rows of different lengths'
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_rows"]


def as_rows(x: Any) -> tuple[np.ndarray, str]:
    """``(array, what)``: ``x`` as an array and ``"shape (…)"``; for rows of different lengths (or anything
    else numpy cannot make one array of) an empty array and ``"rows of different lengths"``."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):  # ragged: not a table
        return np.zeros(0), "rows of different lengths"
    return a, f"shape {a.shape}"
