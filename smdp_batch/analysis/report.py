"""Human-readable descriptions of policies and solutions."""

from __future__ import annotations

import numpy as np

from ..solvers.evaluation import control_limit_of


def policy_ranges(policy) -> list[tuple[int, int | None, str]]:
    """Group states 0..s_max into ranges with one rule each: (first n, last n or None = ∞, rule).

    Rules: "wait", "serve n" (serve everything waiting), "serve B" (a constant batch).  The last
    range runs to infinity by eq. 30.
    """
    policy = np.asarray(policy)
    n_top = policy.size - 2  # s_max
    out: list[tuple[int, int | None, str]] = []

    def rule(s: int) -> str:
        a = int(policy[s])
        if a == 0:
            return "wait"
        if a == s and s != n_top:
            return "serve n"
        return f"serve {a}"

    start, cur = 0, rule(0)
    for s in range(1, n_top + 1):
        r = rule(s)
        if r != cur:
            out.append((start, s - 1, cur))
            start, cur = s, r
    out.append((start, None, cur))
    return out


def describe_busy(busy, batch_sizes) -> list[str]:
    """A busy-aware table busy[k, n] in words: one line per run of busy counts k with the same row."""
    groups: list[list] = []  # [first k, last k, row]
    for k, row in enumerate(np.asarray(busy)):
        if groups and np.array_equal(groups[-1][2], row):
            groups[-1][1] = k
        else:
            groups.append([k, k, row])
    return [f"{a}{'' if a == b else f'–{b}'} busy: {describe_policy(r, batch_sizes)}" for a, b, r in groups]


#: Ranges a policy's one-line description spells out: the first ones and the last ones, the rest counted.
SHOWN_RANGES = (16, 4)


def describe_policy(policy, batch_sizes, shown: tuple[int, int] | None = SHOWN_RANGES, more: str = "") -> str:
    """One line: "wait below 5, then serve min(n, 32)" for control-limit policies, else ranges.

    A table of more ranges than ``shown`` = (first, last) spells out those and counts the rest in between
    ("… 1 012 more ranges …"), followed by ``more`` (where every range can be read): at Bmax 1 024 the optimal
    batch changes a thousand times, a line no one reads.  ``shown=None`` spells out every range.

    >>> describe_policy([0, 1, 2, 2, 3, 3, 3], (1, 2, 3), shown=(1, 1))
    'n=0: wait; … 2 more ranges …; n≥4: serve 3'
    """
    q = control_limit_of(policy, batch_sizes)
    sizes = list(batch_sizes)
    if q is not None and sizes == list(range(1, sizes[-1] + 1)):
        return f"wait below {q}, then serve min(n, {sizes[-1]})" if q > 1 else f"serve min(n, {sizes[-1]}) (greedy)"
    parts = []
    for lo, hi, r in policy_ranges(policy):
        span = f"n={lo}" if hi == lo else (f"n≥{lo}" if hi is None else f"n={lo}–{hi}")
        parts.append(f"{span}: {r}")
    if shown is not None and len(parts) > sum(shown) + 1:
        first, last = shown
        hidden = len(parts) - first - last
        parts = parts[:first] + [f"… {hidden:,} more range{'s' if hidden > 1 else ''} …".replace(",", " ")] + parts[-last:]
        return "; ".join(parts) + more
    return "; ".join(parts)
