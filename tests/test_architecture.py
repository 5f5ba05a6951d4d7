"""The layout's invariants (docs/architecture.md): no import cycle, small modules, no module patching,
no package attribute that is both a submodule and a function."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import smdp_batch

ROOT = Path(smdp_batch.__file__).parent
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> dict[str, set[str]]:
    """Module → modules it imports, at any depth of the file (function-level imports count too).

    Importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` first, so those count as
    imported as well — except the importer's own ancestors, which Python has initialised (or is
    initialising) already.
    """
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        own = set(_ancestors(mod))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t not in mods:
                    continue
                for dep in [*_ancestors(t), t]:
                    if dep in mods and dep != mod and dep not in own:
                        graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" ↔ ".join(c) for c in found)


def test_no_module_over_the_size_limit():
    big = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_no_module_class_patching():
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    assert not (isinstance(t, ast.Attribute) and t.attr == "__class__"), f"{mod} patches a __class__"


@pytest.mark.parametrize("pkg", sorted(m for m, p in _modules().items() if p.name == "__init__.py"))
def test_every_submodule_attribute_is_the_module(pkg):
    """``pkg.name`` is the submodule ``name``, never a function that shadows it (the old ``truncate``)."""
    package = importlib.import_module(pkg)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name == "__main__":
            continue  # running it is the CLI, not an import
        module = importlib.import_module(f"{pkg}.{info.name}")
        assert getattr(package, info.name) is module, f"{pkg}.{info.name} is shadowed by {getattr(package, info.name)!r}"


def test_layout_docs_name_every_module():
    """The docs site's layout block (docs/layout.md) and docs/architecture.md name every package and module."""
    layout = (ROOT.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    assert "```" in layout and "smdp_batch/" in layout, "docs/layout.md lost its layout block"
    arch = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for mod, path in _modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            folder = path.parent.name + "/"
            if path.parent != ROOT:
                assert folder in layout and folder in arch, f"{folder} missing from the layout docs"
            continue
        name = path.name
        assert name in layout, f"docs/layout.md does not name {mod} ({name})"
        if path.parent.name in ("model", "solvers", "runtime", "export", "analysis"):
            assert name in arch, f"docs/architecture.md does not name {mod} ({name})"


def test_product_text_names_no_work_items():
    """Users read the code, docs, notebooks, examples and benchmarks: no internal work-item numbers ("issue 17"),
    and no path into the development workspace (``../shared``), which a user of the package does not have."""
    import re

    repo = ROOT.parent
    pattern = re.compile(r"\bissues? #?[0-9]+|\.\./shared", re.IGNORECASE)
    found = []
    for top in ("smdp_batch", "docs", "notebooks", "examples", "benchmarks", "README.md"):
        paths = [repo / top] if (repo / top).is_file() else sorted((repo / top).rglob("*"))
        for path in paths:
            if path.suffix not in (".py", ".md", ".ipynb", ".txt", ".toml") or "__pycache__" in path.parts:
                continue
            for k, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(repo)}:{k}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


#: The floors of docs/architecture.md, lowest first: a part may import only parts on lower floors (and
#: itself); two parts on one floor do not import each other.  Lazy imports inside functions count too.
FLOORS = (
    ("errors", "kernel_cache"),
    ("smdp_batch", "extras", "limits", "files"),
    ("specs",),
    ("model", "runtime"),
    ("baselines", "measure"),
    ("solvers",),
    ("analysis",),
    ("autopilot", "export", "llm"),
    ("integrations",),
    ("cli",),
    ("console",),
    ("__main__",),
)
#: Imports that run back up, each named with its reason in docs/architecture.md (none today).
UPWARD_ALLOWED: set[tuple[str, str]] = set()


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_import_points_down_the_floors():
    floor = {part: k for k, parts in enumerate(FLOORS) for part in parts}
    graph = import_graph()
    unknown = sorted({_part(m) for m in graph} - set(floor))
    assert not unknown, f"parts on no floor of FLOORS (add them where they belong): {unknown}"
    up = sorted((a, b) for a, deps in graph.items() for b in deps
                if _part(a) != _part(b) and floor[_part(a)] <= floor[_part(b)]
                and (_part(a), _part(b)) not in UPWARD_ALLOWED)
    assert not up, "imports that do not point down: " + "; ".join(f"{a} → {b}" for a, b in up)


def test_the_serving_floor_and_the_autopilot_load_no_numba():
    """A server imports the runtime, or the Autopilot, without the solver stack (numba, scipy, jax)."""
    import subprocess

    code = ("import sys, smdp_batch.runtime, smdp_batch.autopilot, smdp_batch.specs\n"
            "bad = [m for m in ('numba', 'llvmlite', 'scipy', 'jax') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_name_that_left_the_runtime_says_where_it_went():
    with pytest.raises(ImportError, match="moved to smdp_batch.autopilot: from smdp_batch.autopilot import Autopilot"):
        from smdp_batch.runtime import Autopilot  # noqa: F401
    with pytest.raises(ImportError, match="from smdp_batch.autopilot import RateChange"):
        from smdp_batch.runtime import RateChange  # noqa: F401
    import smdp_batch.runtime as rt

    assert not hasattr(rt, "no_such_name")


def test_the_scheduler_groups_exactly_the_tests_marked_to_take_turns(request):
    """conftest reads the turn-taking tests from the sources (xdist's controller does not collect): the same set as
    the markers collection sees, so no server test runs beside another and none is grouped by mistake."""
    from conftest import TURN_MARKERS, turn_taking_tests

    items = request.session.items  # the whole suite in CI; the files given otherwise (-k deselects from it)
    marked = {i.nodeid.split("[", 1)[0] for i in items if any(i.get_closest_marker(m) for m in TURN_MARKERS)}
    collected = {i.nodeid.split("::", 1)[0] for i in items}
    assert marked == {n for n in turn_taking_tests() if n.split("::", 1)[0] in collected}
    assert "tests/test_real_servers.py::test_slo_exports_meet_the_slo_on_the_real_servers_across_the_load_range" \
        in turn_taking_tests()
