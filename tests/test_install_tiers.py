"""Install tiers (pyproject.toml, smdp_batch/extras.py), checked without installing anything: the core
dependencies are the lean set, the core commands run with every optional module blocked, and a command
that needs a missing extra says which one, on one line, with exit code 2."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from smdp_batch import extras
from smdp_batch.cli import main
from smdp_batch.errors import InputError

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
CORE = {"numpy", "scipy", "numba", "h5py", "click", "threadpoolctl"}
#: what the optional extras provide, blocked (sys.modules[name] = None makes `import name` fail)
OPTIONAL = ("hmmlearn", "sklearn", "matplotlib", "jax", "jaxlib", "ray", "dask", "distributed", "pytriton",
            "tritonclient", "pynvml", "zeus", "tqdm", "pandas")
#: the extras the README's test command installs (+ nvidia-pytriton, --no-deps)
CI_EXTRAS = ("dev", "bench", "jax", "triton", "ray")


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _extra(name: str) -> set[str]:
    return {_name(r) for r in PROJECT["optional-dependencies"][name]}


def test_core_dependencies_are_the_lean_set():
    assert {_name(r) for r in PROJECT["dependencies"]} == CORE


def test_extras_are_named_for_what_they_add():
    extra = PROJECT["optional-dependencies"]
    for name in ("jax", "plot", "bursty", "measure", "triton", "ray", "dask", "notebooks", "docs", "dev", "all",
                 "bench", "examples"):
        assert name in extra, name
    assert _extra("bursty") == {"hmmlearn"} and _extra("plot") == {"matplotlib"}
    assert {"nvidia-ml-py", "tqdm"} <= _extra("measure")
    assert {"mkdocs-material", "mkdocs-click", "mkdocstrings"} <= _extra("docs")
    assert {"hmmlearn", "nvidia-ml-py", "matplotlib", "fastapi", "uvicorn", "httpx"} <= _extra("dev")
    every = re.search(r"\[(.*)\]", extra["all"][0]).group(1).split(",")
    assert set(every) == {"jax", "plot", "bursty", "measure", "metrics", "triton", "ray", "dask", "notebooks", "examples",
                          "calibrate"}
    assert _extra("calibrate") == {"httpx"}


def test_every_missing_module_names_a_declared_extra():
    for module, (_, extra) in extras.EXTRAS.items():
        assert extra in PROJECT["optional-dependencies"], (module, extra)


def test_the_ci_install_covers_what_the_tests_import():
    """Every third-party module tests/ imports comes with the core or the README's test command's extras."""
    dist = {"google": "protobuf", "mdptoolbox": "pymdptoolbox", "pytriton": "nvidia-pytriton", "xdist": "pytest-xdist"}
    local = {"smdp_batch", "tests", "examples", "run_demo", "hm"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
    installed = CORE | {"nvidia-pytriton"} | set().union(*(_extra(e) for e in CI_EXTRAS))
    found = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value.split(".")[0])
    third = {m for m in found if m not in sys.stdlib_module_names and m not in local}
    missing = sorted(m for m in third if dist.get(m, m).lower() not in installed)
    assert not missing, f"tests import {missing}, which the test command does not install"


PRELUDE = "import sys\nfor m in {mods!r}:\n    sys.modules[m] = None\n"


def test_core_commands_run_with_every_optional_module_blocked(tmp_path):
    code = PRELUDE.format(mods=OPTIONAL) + (
        "import smdp_batch.cli\n"
        "rc = smdp_batch.cli.main(['solve', '--rho', '0.3', '--bmax', '8', '-o', 't.h5'])\n"
        "rc = rc or smdp_batch.cli.main(['simulate', '--policy', 't.h5', '--requests', '2000'])\n"
        "rc = rc or smdp_batch.cli.main(['show', 't.h5'])\n"
        "loaded = sorted(k for k in sys.modules if k.split('.')[0] in {mods!r} and sys.modules[k] is not None)\n"
        "print('LOADED', loaded)\n"
        "sys.exit(rc)\n").format(mods=OPTIONAL)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout and "converged" in proc.stdout
    assert "Traceback" not in proc.stderr


def _one_line(capsys, argv: list[str], extra: str, monkeypatch, *blocked: str) -> str:
    for m in blocked:
        monkeypatch.setitem(sys.modules, m, None)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("smdp-batch: error: "), err
    assert f"pip install 'smdp-batch[{extra}]'" in err, err
    return err


def test_fit_arrivals_without_hmmlearn(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_ms\n" + "\n".join(str(0.5 * i) for i in range(300)) + "\n")
    err = _one_line(capsys, ["fit-arrivals", str(trace)], "bursty", monkeypatch, "hmmlearn")
    assert err == "smdp-batch: error: fit-arrivals needs hmmlearn: pip install 'smdp-batch[bursty]'"


@pytest.mark.parametrize("argv", [["pareto", "--plot", "F.png"], ["tables", "--plot", "F.png"],
                                  ["multibin", "--plot", "F.png"], ["llm", "--plot", "F.png"]])
def test_plots_without_matplotlib(tmp_path, capsys, monkeypatch, argv):
    argv = [a.replace("F.png", str(tmp_path / "f.png")) for a in argv]
    err = _one_line(capsys, argv, "plot", monkeypatch, "matplotlib", "matplotlib.figure")
    assert f"{argv[0]} --plot needs matplotlib" in err
    assert not (tmp_path / "f.png").exists()


def test_jax_backend_without_jax(capsys, monkeypatch):
    err = _one_line(capsys, ["solve", "--backend", "jax"], "jax", monkeypatch, "jax")
    assert "backend 'jax' needs JAX" in err


def test_dask_without_dask(capsys, monkeypatch):
    err = _one_line(capsys, ["pareto", "--rho", "0.3", "--bmax", "8", "--dask", "local"], "dask", monkeypatch,
                    "dask", "dask.distributed")
    assert "needs dask[distributed]" in err


def test_library_entry_points_name_their_extra(monkeypatch):
    from smdp_batch.analysis.parallel import dask_mapper
    from smdp_batch.integrations.ray_serve import RayServe
    from smdp_batch.integrations.triton import find_distribution
    from smdp_batch.measure.worker import energy_source

    for m in ("ray", "ray.serve", "pytriton", "pynvml", "zeus", "zeus.monitor", "dask", "dask.distributed"):
        monkeypatch.setitem(sys.modules, m, None)
    with pytest.raises(InputError, match=r"RayServe needs ray\[serve\]: pip install 'smdp-batch\[ray\]'"):
        RayServe().__enter__()
    with pytest.raises(InputError, match=r"needs nvidia-pytriton: pip install 'smdp-batch\[triton\]' && pip install "
                                         r"--no-deps \"nvidia-pytriton==0.7.0\""):
        find_distribution()
    with pytest.raises(InputError, match=r"NVML energy counter needs nvidia-ml-py: pip install 'smdp-batch\[measure\]'"):
        energy_source("nvml", None, 0)
    with pytest.raises(InputError, match=r"pip install 'smdp-batch\[dask\]'"):
        with dask_mapper("local"):
            pass


def test_require_returns_the_module():
    import math

    assert extras.require("math", "anything") is math
    assert str(extras.missing("hmmlearn.hmm", "x")) == "x needs hmmlearn: pip install 'smdp-batch[bursty]'"
