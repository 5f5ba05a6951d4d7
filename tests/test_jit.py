"""Numba's compile step: one notice on a cold cache, never counted as solve time (solvers/jit.py)."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.solvers import jit
from smdp_batch.solvers.pi import COLD_SECONDS, warm_up_pi


_HERE = ("x86_64-unknown-linux-gnu", "this-cpu", "+avx2")


def _dispatcher(entries: int, machine: tuple = _HERE):
    """A stand-in for a numba dispatcher whose cache index holds ``entries`` entries compiled for ``machine``."""
    index = SimpleNamespace(_load_index=lambda: {(i, machine, ("stamp",)): None for i in range(entries)})
    codegen = SimpleNamespace(magic_tuple=lambda: _HERE)
    return SimpleNamespace(_cache=SimpleNamespace(_cache_file=index), targetctx=SimpleNamespace(codegen=lambda: codegen))


def test_a_cache_compiled_for_another_cpu_is_not_warm_here():
    """A package on a shared file system: entries another machine's CPU compiled do not count (numba would
    compile again here), so the notice is said and the compiled PI loop is not loaded in the foreground."""
    assert jit.cache_is_warm([_dispatcher(1)])
    assert not jit.cache_is_warm([_dispatcher(1, ("x86_64-unknown-linux-gnu", "other-cpu", "+avx512f"))])
    assert not jit.cache_is_warm([_dispatcher(0)])


def test_a_kernel_inlined_in_its_callers_does_not_make_a_warm_cache_cold():
    """An ``inline="always"`` kernel has no cache entry of its own; it once made every exponential-rule run say
    "compiling kernels" on a warm cache."""
    from smdp_batch.solvers.geometric_pi import KERNELS, warm_up_geometric

    inlined = _dispatcher(0)
    inlined.targetoptions = {"inline": "always"}
    assert jit.cache_is_warm([_dispatcher(1), inlined])
    warm_up_geometric()
    assert any(k.targetoptions.get("inline") == "always" for k in KERNELS)
    assert jit.cache_is_warm(KERNELS)


def test_cold_cache_gives_one_notice_and_one_run(caplog, monkeypatch):
    monkeypatch.setattr(jit, "_done", set())
    runs = []
    with caplog.at_level(logging.INFO, logger="smdp_batch"):
        jit.warm_up("x", [_dispatcher(1), _dispatcher(0)], lambda: runs.append(1), 7.6)
        assert jit.warm_up("x", [_dispatcher(0)], lambda: runs.append(1), 7.6) == 0.0
    assert runs == [1]
    assert [r.getMessage() for r in caplog.records] == ["compiling kernels (first run only, ~8 s)"]


def test_warm_cache_is_silent(caplog, monkeypatch):
    monkeypatch.setattr(jit, "_done", set())
    with caplog.at_level(logging.INFO, logger="smdp_batch"):
        jit.warm_up("y", [_dispatcher(2)], lambda: None, 8)
    assert not caplog.records


def test_real_kernels_are_cached_after_a_solve():
    solve(BatchingProblem.from_rho(0.5))
    assert warm_up_pi() == 0.0  # once per process
    from smdp_batch.solvers import banded, pi

    assert jit.cache_is_warm([banded.evaluate_policy_banded, banded.stationary_banded, pi.improve_step])


@pytest.mark.slow
def test_cli_says_compiling_on_a_cold_cache_only(tmp_path):
    """A fresh numba cache (as after an install): the notice, then none on the next run."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [subprocess.run([sys.executable, "-m", "smdp_batch", "solve"], capture_output=True, text=True, env=env,
                           timeout=600) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stderr.splitlines() == [f"smdp-batch: note: compiling kernels (first run only, ~{round(COLD_SECONDS)} s)"]
    assert runs[1].stderr == ""
    policy = [[line for line in r.stdout.splitlines() if line.lstrip().startswith("policy")] for r in runs]
    assert policy[0] == policy[1] and len(policy[0]) == 1


def test_every_kernel_module_takes_njit_from_kernel_cache():
    """Every module with a numba kernel is in the digest's list and gets ``njit`` from kernel_cache (so its cache
    is keyed by every kernel file), never from numba directly."""
    import re
    from pathlib import Path

    from smdp_batch import kernel_cache

    root = Path(kernel_cache.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        if rel == "kernel_cache.py":
            continue
        assert not re.search(r"^\s*(from numba import .*\bnjit\b|import numba\b)", text, re.M), rel
        if re.search(r"^\s*@njit\b", text, re.M):
            found.add(rel)
            assert "from ..kernel_cache import njit" in text, rel
    assert found == set(kernel_cache.KERNEL_MODULES)


def _kernels() -> dict:
    """Every numba kernel of the package: name → (module, fast-math?, inline="always"?, names it calls)."""
    import ast
    from pathlib import Path

    from smdp_batch import kernel_cache

    root = Path(kernel_cache.__file__).parent
    out = {}
    for rel in kernel_cache.KERNEL_MODULES:
        tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "njit":
                    kw = {k.arg: k.value for k in d.keywords}
                    inline = isinstance(kw.get("inline"), ast.Constant) and kw["inline"].value == "always"
                    calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                    out[node.name] = (rel, "fastmath" in kw, inline, calls)
    return out


def test_no_kernel_depends_on_what_the_cache_held_when_it_compiled():
    """A kernel that calls another compiled separately gets the callee's machine code from numba's cache (no
    inlining) or inlines its fresh IR, so with fast-math flags on either side its last bits would depend on the
    cache's history (measured: ĝ moved in the 16th digit).  So a fast-math kernel calls only kernels inlined at
    numba's IR level, and one that other kernels call is itself inlined (compiled within each caller)."""
    kernels = _kernels()
    assert "evaluate_factored" in kernels and "pi_loop_compiled" in kernels
    for name, (rel, fast, _, calls) in kernels.items():
        for callee in calls & set(kernels):
            c_rel, c_fast, c_inline, _ = kernels[callee]
            if fast:
                assert c_inline, f"{rel}:{name} has fast-math flags and calls {callee}, which is not inlined"
            if c_fast:
                assert c_inline, f"{c_rel}:{callee} has fast-math flags and is called by {name}: inline it"


def test_kernel_stamps_carry_the_digest_of_every_kernel_file(tmp_path):
    from pathlib import Path

    from numba import njit as plain_njit

    from smdp_batch import kernel_cache
    from smdp_batch.solvers import banded

    locator = banded.evaluate_policy_banded._cache._impl._locator
    assert locator.get_source_stamp()[1] == kernel_cache.kernel_digest()
    other = tmp_path / "other_mod.py"
    other.write_text("def f(x):\n    return x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        other_mod = importlib.import_module("other_mod")  # a module of another package, written above
        theirs = plain_njit(cache=True)(other_mod.f)._cache._impl._locator
    finally:
        sys.path.remove(str(tmp_path))
    assert not getattr(type(theirs), "_smdp_batch", False)  # other packages keep numba's own stamps
    copy = tmp_path / "pkg"
    for rel in kernel_cache.KERNEL_MODULES:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((Path(kernel_cache.__file__).parent / rel).read_bytes())
    assert kernel_cache.kernel_digest(str(copy)) == kernel_cache.kernel_digest()
    (copy / "solvers" / "kernels.py").write_text((copy / "solvers" / "kernels.py").read_text() + "\n# edited\n")
    assert kernel_cache.kernel_digest(str(copy)) != kernel_cache.kernel_digest()


_STATS = """
import json
import numpy as np
from smdp_batch.solvers import banded, pi
m = pi._tiny_model()  # banded's kernel alone on a tiny model (PI's whole warm-up compiled twice the CPU)
pol, rows = pi._initial_policy(m), np.arange(m.n_states)
ok, g, h = banded.evaluate_policy_banded(pol, m.costs()[rows, pol], m.sojourn_rows()[0, pol], m.P, m.SF, m.klo, m.khi,
                                         m.actions, m.s_max)
assert ok
print(json.dumps([sum(banded.evaluate_policy_banded.stats.cache_hits.values()),
                  sum(banded.evaluate_policy_banded.stats.cache_misses.values())]))
"""


@pytest.mark.slow
def test_an_edit_of_a_callee_file_recompiles_its_callers(tmp_path):
    """banded.evaluate_policy_banded calls kernels.policy_residual: after an edit of kernels.py alone, numba's own
    per-file stamp would load banded's stale machine code; with the kernel digest it compiles again."""
    import shutil
    from pathlib import Path

    import smdp_batch

    pkg = tmp_path / "src" / "smdp_batch"
    shutil.copytree(Path(smdp_batch.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run():
        out = subprocess.run([sys.executable, "-c", _STATS], capture_output=True, text=True, env=env, timeout=600,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        import json

        return json.loads(out.stdout.splitlines()[-1])

    assert run()[1] >= 1  # cold: compiled
    assert run() == [1, 0]  # warm: loaded
    kernels = pkg / "solvers" / "kernels.py"
    kernels.write_text(kernels.read_text() + "\n# an edit of the callee's file only\n")
    assert run()[1] >= 1  # compiled again, not loaded stale
