"""Baseline batching rules as stationary policies (paper 004 Defs. 1–3)."""

from .simple import control_limit_policy, greedy_policy, parse_policy, static_policy

__all__ = ["control_limit_policy", "greedy_policy", "parse_policy", "static_policy"]
