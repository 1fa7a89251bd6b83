"""The pictures of docs/img that state figures, and the tutorial text that quotes them, come
from one source: the model a picture was drawn from, kept beside it as JSON
(`python -m collectives.explain crash ... --model-json docs/img/crash.json`).

Invariants:
  * redrawing the kept model gives the committed picture (the same pixels within font
    rendering's tolerance): the picture states what the model says;
  * every line of the tutorial's quoted output is a line of the model's text: the tutorial
    states what the picture states;
  * the slow-link lesson's table is what emulating the same runs gives now (deterministic:
    a virtual clock), and its model is the committed one;
  * the rerouting picture's model is what the cost model and the plan give now, and the
    tutorial quotes its text.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from collectives.teaching.explain import views
from collectives.teaching.explain.reroute_view import reroute_model
from collectives.teaching.explain.slow_link_view import slow_link, slow_link_model
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

IMG = ROOT / "docs" / "img"
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")


def pixels(path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def same_picture(a, b) -> None:
    x, y = pixels(a), pixels(b)
    assert x.shape == y.shape, f"picture size {x.shape} != {y.shape}"
    differ = (np.abs(x - y).max(axis=2) > 40).mean()
    assert differ < 0.002, f"{differ:.2%} of the pixels differ"


def quoted_block(first_line: str) -> list[str]:
    """The lines of the tutorial's fenced block that starts with `first_line`."""
    m = re.search(r"```\n(" + re.escape(first_line) + r".*?)```", TUTORIAL, flags=re.DOTALL)
    assert m, f"the tutorial quotes no block starting {first_line!r}"
    return [ln for ln in m.group(1).splitlines() if ln.strip() and ln.strip() != "..."]


@pytest.mark.parametrize("name", ["crash", "crash_stop", "slow_link", "rerouted"])
def test_a_picture_is_its_kept_model_redrawn(name, tmp_path):
    model = json.loads((IMG / f"{name}.json").read_text(encoding="utf-8"))
    same_picture(IMG / f"{name}.png", views.draw_panels(model, str(tmp_path / f"{name}.png")))


def test_the_crash_text_quotes_the_crash_picture():
    model = json.loads((IMG / "crash.json").read_text(encoding="utf-8"))
    told = views.text(model).splitlines()
    quoted = quoted_block(model["title"])
    assert len(quoted) >= 8
    for line in quoted:
        assert line in told, f"the tutorial says {line!r}; the picture's model does not"
    # the witness the picture names is the one the survivors' errors name
    witness = model["frames"][2]
    if any("pidfd" in t for t in witness["text"]):
        assert "pidfd" in witness["title"] and "pidfd" in " ".join(quoted)


def test_the_slow_link_table_is_the_emulated_runs():
    kept = json.loads((IMG / "slow_link.json").read_text(encoding="utf-8"))
    s = slow_link()
    assert slow_link_model(s) == kept, "docs/img/slow_link.json is stale: rerun explain slowlink"
    for alg, name in (("ring", "ring"), ("tree", "tree"), ("halving_doubling", "halving-doubling")):
        cells = [f"{s.case(alg, slow).seconds * 1e3:.2f} ms" for slow in (None, *s.links)]
        row = next(ln for ln in TUTORIAL.splitlines() if ln.startswith(f"| {name} |"))
        for c in cells:
            assert c in row, f"the tutorial's {name} row lacks {c}: {row}"
    ring = s.case("ring", s.links[0]).seconds / s.case("ring", None).seconds
    assert ring == pytest.approx(10.0)


def test_the_rerouted_picture_is_the_library_s_choice_now_and_the_tutorial_quotes_it():
    kept = json.loads((IMG / "rerouted.json").read_text(encoding="utf-8"))
    model = reroute_model(4, [(0, 1), (1, 0)])
    assert model == kept, "docs/img/rerouted.json is stale: rerun explain slowlink --slow 0-1"
    told = views.text(model).splitlines()
    quoted = quoted_block(model["title"])
    assert len(quoted) >= 4
    for line in quoted:
        assert line in told, f"the tutorial says {line!r}; the picture's model does not"


# Pictures of explain runs, each with the command that draws it (as the tutorial prints them).
EXPLAIN_PICTURES = {
    "double_tree_8x8": ["double_tree", "-n", "8", "-c", "8"],
    "hierarchical_4x8": ["hierarchical", "-n", "4", "-c", "8"],
    "reduce_4x4": ["reduce", "-n", "4", "-c", "4"],
    "tree_4x4": ["tree", "-n", "4", "-c", "4"],
}


@pytest.mark.parametrize("name", sorted(EXPLAIN_PICTURES))
def test_an_explain_picture_is_its_command_now(name, tmp_path, capsys):
    """The committed picture is what its explain command draws today: the double tree's (the
    pipelining section's), and those whose rounds and final states the errata fixed
    (test_picture_states checks the runs they are drawn from)."""
    from collectives.teaching.explain import main

    out = tmp_path / f"{name}.png"
    assert main([*EXPLAIN_PICTURES[name], "--out", str(out)]) == 0
    same_picture(IMG / f"{name}.png", out)
