"""A griffe extension for the API reference: the docstrings use Sphinx roles (``:func:`~.kernels.improve```),
which mkdocstrings would print literally; this turns each into inline code naming its target
(``improve``), as Sphinx would show it.  Loaded by mkdocs.yml (mkdocstrings' ``extensions`` option)."""

from __future__ import annotations

import re

import griffe

# :role:`target`, :role:`~target`, :role:`text <target>` (domain prefixes such as :py:func: included)
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`<]*?)(?:\s*<([^`>]+)>)?`")


def _show(match: re.Match) -> str:
    tilde, text, target = match.group(1), match.group(2).strip(), match.group(3)
    if target:
        return f"`{text}`"
    name = text.lstrip(".")
    return f"`{name.rsplit('.', 1)[-1] if tilde or text.startswith('.') else name}`"


class RstRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # griffe ≥ 1.0 hook
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_show, obj.docstring.value)
