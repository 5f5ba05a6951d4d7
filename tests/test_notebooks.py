"""The notebooks run top to bottom in a fresh kernel and draw their figures; git holds them without outputs."""

import re
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
nbformat = pytest.importorskip("nbformat")


def test_the_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_pareto_fig5.ipynb", "03_slo_fig6.ipynb",
                                           "04_scenarios_fig7_9.ipynb", "05_your_model.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs before committing"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_and_draws(path):
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    last_lines = [c.source.strip().splitlines()[-1] for c in nb.cells if c.cell_type == "code"]
    drawn = sum(bool(re.match(r"(plot_\w+\(|figure\(|fig$)", line)) for line in last_lines)  # cells ending in a figure
    assert len(images) >= drawn >= 1  # every cell that draws produced its figure
