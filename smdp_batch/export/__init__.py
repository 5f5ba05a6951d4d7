"""Exports: HDF5 policy tables and λ-banks (:mod:`.hdf5`), and server configs (:mod:`.configs`).

The schema and its reader live in :mod:`smdp_batch.runtime.schema`, which servers import without
the solver stack.
"""

from .hdf5 import write_bank, write_policy

__all__ = ["write_bank", "write_policy"]
