"""The notebook's prose (docs/tutorial.ipynb, written by tools/make_tutorial_notebook.py) states
what the model and the diagnosis compute: checked here from them, not from the prose.

Invariants: the tree beats the ring for small buffers exactly from n = 4 on (at 2 and 3 the
ring is never slower), and a stall's blame is the fewest ranks that touch every stalled link.
"""

from __future__ import annotations

import json

import pytest

from collectives.membership.evidence import min_covers
from collectives.teaching import emulate, failures
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

ALPHA, BETA = 50e-6, 1e-9


def notebook_prose() -> str:
    cells = json.loads((ROOT / "docs" / "tutorial.ipynb").read_text(encoding="utf-8"))["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return " ".join(text.split())


def test_the_tree_wins_for_small_buffers_from_four_ranks_on():
    wins = [
        n
        for n in range(2, 17)
        if emulate.tree_time(64, n, ALPHA, BETA) < emulate.ring_time(64, n, ALPHA, BETA)
    ]
    assert wins == list(range(4, 17))
    assert all(emulate.crossover_bytes(n, ALPHA, BETA) is None for n in (2, 3))
    assert f"wins for small buffers from n = {wins[0]} on" in notebook_prose()
    assert "at n = 2 and 3 it takes as many rounds as the ring" in notebook_prose()


@pytest.mark.parametrize("culprit", [0, 1, 2])
def test_a_stall_blames_the_fewest_ranks_on_every_stalled_link(culprit):
    st = failures.stepped_stall(3, culprit=culprit)
    covers = min_covers(sorted(st.stalled))
    assert len(covers) == 1 and list(covers[0]) == st.blamed
    assert "blames the fewest ranks that between them touch every stalled link" in notebook_prose()
