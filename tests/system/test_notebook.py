"""docs/tutorial.ipynb runs from top to bottom (issue 17 item 4): every cell executes
(nbclient raises on the first error), the ring and tree results are right, and the pictures
are drawn inline (each a real PNG in the notebook's outputs)."""
from __future__ import annotations

import base64
import os

import nbclient
import nbformat
import pytest

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "docs", "tutorial.ipynb")


@pytest.mark.timeout(300)
def test_tutorial_notebook_executes(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "ring [10. 10. 10. 10. 10. 10.]" in text and "tree [10. 10. 10. 10. 10. 10.]" in text
    assert "reduce-scatter" in text and "faster (model)" in text
    pngs = [base64.b64decode(o["data"]["image/png"]) for o in outputs
            if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert len(pngs) >= 3 and all(p.startswith(b"\x89PNG") and len(p) > 5000 for p in pngs)
