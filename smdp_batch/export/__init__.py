"""Exports: HDF5 policy tables (schema 1)."""

from .hdf5 import FORMAT, SCHEMA_VERSION, PolicyFile, read_policy, write_policy

__all__ = ["FORMAT", "SCHEMA_VERSION", "PolicyFile", "read_policy", "write_policy"]
