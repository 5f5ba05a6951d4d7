"""Paper 004's scenarios by name (§VII: the basic scenario; §VII-C: Figs. 7, 8 and 9).

Each preset fixes the model (latency, energy, service law); load ρ and weights stay yours.  The §VII-C
laws are the transforms printed in the paper.  Note on ``fig9-erlang``: the paper calls it "CoV 0.5",
but the transform it prints, (1 + 0.5·l(b)·s)^{−2}, is Erlang-2 with CoV 1/√2 ≈ 0.707; we follow the
transform.
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
    "fig9-erlang": ({**_BASIC, "service": "erlang:2"}, "Erlang batch times g̃ = (1 + 0.5·l·s)^−2 (§VII-C3, Fig. 9)"),
    "fig9-exp": ({**_BASIC, "service": "exp"}, "exponential batch times, CoV 1 (§VII-C3, Fig. 9)"),
    "fig9-hyperexp": ({**_BASIC, "service": "hyperexp"}, "hyperexponential batch times, CoV 2 (§VII-C3, Fig. 9)"),
}


def preset(name: str) -> dict:
    """The model fields of a preset (a copy): latency, energy, service specs."""
    try:
        return dict(PRESETS[name][0])
    except KeyError:
        raise InputError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}") from None
