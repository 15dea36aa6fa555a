"""notebooks/explore.ipynb and its script twin notebooks/explore.py: same cells, and the twin runs top to bottom
on the CPU against the shipped dataset. Executing the .ipynb itself needs nbclient + ipykernel (skipped
without them)."""
from __future__ import annotations

import json
import pathlib
import re
import runpy

import pytest

NB_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOK, TWIN = NB_DIR / "explore.ipynb", NB_DIR / "explore.py"


def twin_cells() -> list[tuple[str, str]]:
    """(cell type, source) for each `# %%` cell of the percent-format twin (the header before it is not a cell)."""
    parts = re.split(r"^# %%(.*)$", TWIN.read_text(encoding="utf-8"), flags=re.M)
    cells = []
    for tag, body in zip(parts[1::2], parts[2::2]):
        body = body.strip("\n")
        if tag.strip() == "[markdown]":
            text = "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body.splitlines())
            cells.append(("markdown", text.strip("\n")))
        else:
            cells.append(("code", body))
    return cells


def notebook_cells() -> list[tuple[str, str]]:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    return [(c["cell_type"], "".join(c["source"]).strip("\n")) for c in nb["cells"]]


def test_notebook_and_twin_have_the_same_cells():
    assert notebook_cells() == twin_cells()


def test_notebook_uses_the_package_api():
    code = "\n".join(src for kind, src in twin_cells() if kind == "code")
    assert "from cublaslt_probe.render import plots, report" in code
    assert "plots.load()" in code
    assert "import torch" not in code and "import cupy" not in code
    assert "which tile does bf16 nt pick for decode shapes?" in TWIN.read_text(encoding="utf-8").lower()
    assert "where do torch and torch-lt differ?" in TWIN.read_text(encoding="utf-8").lower()


def test_twin_runs_top_to_bottom(capsys):
    ns = runpy.run_path(str(TWIN), run_name="__main__")
    out = capsys.readouterr().out
    assert "GEMMs" in out and "NVIDIA H200" in out and "cliffs;" in out
    assert len(ns["tiles"]) > 0                       # the decode-tile answer
    assert not ns["report"].path_summary(ns["df"]).empty
    assert ns["fig"].axes                             # the last figure (heuristic plot) was built


def test_notebook_executes():
    nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (add nbclient + ipykernel to the "
                                                      "test extra to execute the .ipynb itself)")
    pytest.importorskip("ipykernel", reason="ipykernel not installed")
    import nbformat
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    assert all(o.get("output_type") != "error" for c in nb.cells for o in c.get("outputs", []))
