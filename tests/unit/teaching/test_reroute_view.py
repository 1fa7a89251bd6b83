"""`python -m collectives.explain slowlink --slow ...` (teaching/explain/reroute_view.py).

Invariants: the view draws the library's own choice -- the plan is plan_around's on the same
figures, the schedule drawn is the one group/rerouted.py would run, and the slow links are
marked: on the default ring, used; under the plan, dashed where the plan leaves them out;
the predicted times are the cost model's, the chosen one below the default's; a bad --slow is
refused before anything is drawn."""

import contextlib
import io

import pytest

from collectives.algorithms import costmodel
from collectives.algorithms.costmodel import LinkCosts, Schedule, identity
from collectives.algorithms.schedule import plan_around
from collectives.teaching import explain
from collectives.teaching.explain import views
from collectives.teaching.explain.reroute_view import parse_slow, reroute_model

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]


def _ms(t):
    return f"{t * 1e3:.2f} ms"


@pytest.mark.parametrize(
    "n,slow,shape",
    [(4, "0-1", "ring over 0 -> 2 -> 1 -> 3 -> 0"), (3, "0-1", "tree rooted at rank 2")],
)
def test_the_view_draws_the_plan_the_library_picks_with_the_predictions(n, slow, shape):
    links = parse_slow(slow, n)
    assert links == [(0, 1), (1, 0)]
    model = reroute_model(n, links)
    costs = LinkCosts.of(n, {k: 1e9 / 50 for k in links}, rate=1e9, alpha=50e-6)
    plan = plan_around(n, links, costs, 4 << 20)
    assert plan is not None and plan.schedule.describe().startswith(shape)
    default, chosen, small = model["frames"]
    # the default ring is drawn over the slow link; the plan leaves it out (dashed)
    on = [a for a in default["arrows"] if (a["src"], a["dst"]) == (0, 1)]
    assert on and on[0]["color"] == views.RED and not on[0]["dashed"]
    assert shape in chosen["title"]
    out = [a for a in chosen["arrows"] if a["color"] == views.RED]
    assert out and all(a["dashed"] for a in out)
    drawn = {(a["src"], a["dst"]) for a in chosen["arrows"] if not a["dashed"]}
    assert drawn <= costmodel.links_of(plan.schedule) and not drawn & set(links)
    t_default = costmodel.predict(Schedule("ring", identity(n)), 4 << 20, costs)
    t_plan = costmodel.predict(plan.schedule, 4 << 20, costs)
    assert t_plan < t_default
    assert f"{_ms(t_default)} -> {_ms(t_plan)}" in chosen["note"]
    assert "auto would run direct" in small["note"]
    assert not {(a["src"], a["dst"]) for a in small["arrows"] if not a["dashed"]} & set(links)


def test_the_command_line_draws_it_and_refuses_bad_links(tmp_path):
    png = tmp_path / "r.png"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = explain.main(["slowlink", "-n", "3", "--slow", "0->1,1->2", "--out", str(png)])
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "the plan: ring over 0 -> 2 -> 1 -> 0" in out.getvalue()
    for bad in ("0-9", "0-0", "zero-one"):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            explain.main(["slowlink", "-n", "3", "--slow", bad, "--no-plot"])


def test_a_slow_nic_is_shown_with_nothing_predicted_faster_for_a_large_buffer():
    links = parse_slow("1-0,1-2,1-3", 4)
    model = reroute_model(4, links)
    chosen = model["frames"][1]
    assert "ring stays" in chosen["note"] or "default stays" in chosen["title"]
