"""Paper 004's scenarios by name (§VII: the basic scenario; §VII-C: Figs. 7, 8 and 9).

Each preset fixes the model (latency, energy, service law); load ρ and weights stay yours.  The §VII-C
laws are the transforms printed in the paper.  The paper labels them "CoV 0.5, 1, 2"; those numbers are
the *squared* coefficients of variation c² = Var/mean² of the printed transforms (Erlang-2: c² = 1/2,
CoV ≈ 0.707; exponential: 1; the (2/3, 1/3) hyperexponential with means (0.5, 2)·l: c² = 2,
CoV ≈ 1.414).  We follow the transforms.
"""

from __future__ import annotations

from ..errors import InputError

__all__ = ["PRESETS", "preset"]

_BASIC = {"latency": "affine:0.3051,1.0524", "energy": "affine:19.899,19.603", "service": "det"}

#: name → (model fields, what it reproduces)
PRESETS: dict[str, tuple[dict, str]] = {
    "basic": (_BASIC, "GoogLeNet on a Tesla P4, deterministic batch times (§VII, Fig. 2)"),
    "fig7-const-latency": ({**_BASIC, "latency": "const:6.0859"}, "ideal parallelism, l(b) = 6.0859 ms (§VII-C1, Fig. 7)"),
    "fig8-log-energy": ({**_BASIC, "energy": "log:105,60"}, "ζ(b) = 105·ln b + 60 mJ (§VII-C2, Fig. 8)"),
    "fig9-erlang": ({**_BASIC, "service": "erlang:2"}, "Erlang-2 batch times g̃ = (1 + 0.5·l·s)^−2, c² = 0.5 (§VII-C3, Fig. 9)"),
    "fig9-exp": ({**_BASIC, "service": "exp"}, "exponential batch times, c² = 1 (§VII-C3, Fig. 9)"),
    "fig9-hyperexp": ({**_BASIC, "service": "hyperexp"}, "hyperexponential batch times, c² = 2 (§VII-C3, Fig. 9)"),
}


def preset(name: str) -> dict:
    """The model fields of a preset (a copy): latency, energy, service specs."""
    try:
        return dict(PRESETS[name][0])
    except KeyError:
        raise InputError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}") from None
