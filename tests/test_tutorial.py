"""Issue 39 item 2: ``docs/tutorial.ipynb`` (own pairs, a run, matplotlib plots of the lens and DLA, two models
compared) executes end to end in a fresh kernel, in an empty folder, and draws its three figures."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow           # starts a Jupyter kernel (another process)

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "tutorial.ipynb"


def test_tutorial_notebook_runs_end_to_end(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    nb = nbformat.read(tmp_path / NOTEBOOK.name, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    for fig in ("lens.png", "dla.png", "compare.png"):
        assert (tmp_path / fig).stat().st_size > 1000, fig
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "largest |sum of DLA - margin| over pairs:" in text
    assert "sign agreement over 24 pairs:" in text
