"""explain's page model, its input/output pictures and the stepped crash, in-process.

Invariants:
  * the page of an explanation has one step per round plus the start, each round's arrows are
    exactly the messages the replayed trace put in it, and the page loads nothing from outside
    (no src/href to a network, no @import, no fetch);
  * `explain io` decodes each collective's real result: all_reduce gives every rank Σa..Σd,
    reduce_scatter gives rank r the sum of element r, all_to_all is a transpose, gather fills
    the root only, scatter hands rank r element r of the root, send/recv copies rank 0's
    buffer into rank 1's only;
  * the commit-or-drop rule on a stepped ring: a rank that stops before the survivors hold
    their result makes them all drop the op; one that stops only before its own last receive
    lets them all commit it;
  * the evidence a diagnosis carries comes out in one plain shape; a stepped stall (no clock)
    finds the stalled links and the culprit the timed one finds;
  * every grid page kept in docs/pages is what explain writes for its run now.
"""

from __future__ import annotations

import json
import re

import pytest

from collectives.teaching import failures, stall
from collectives.teaching.explain import exchange, explain_run, html, io, views

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


def model_of(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', page, re.S)
    assert m, "the page holds its model"
    return json.loads(m.group(1).replace("<\\/", "</"))


def assert_offline(page: str) -> None:
    for bad in (
        "http://",
        "https://",
        "@import",
        "fetch(",
        "XMLHttpRequest",
        "<link",
        "<img",
        "<iframe",
    ):
        assert bad not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), bad
    assert not re.search(r"\ssrc=", page)


@pytest.mark.parametrize(
    "algorithm",
    [
        "ring",
        "tree",
        "halving_doubling",
        "double_tree",
        "naive",
        "direct",
        "hierarchical",
        "reduce",
        "broadcast",
    ],
)
def test_page_follows_the_replayed_rounds(algorithm):
    x = explain_run(algorithm, 4, 8)
    page = html.page(html.grid_model(x))
    assert_offline(page)
    m = model_of(page)
    assert len(m["frames"]) == x.rounds + 1
    for k, f in enumerate(m["frames"]):
        msgs = x.messages[k] if k else []
        assert [(a["src"], a["dst"]) for a in f["arrows"]] == [
            (s["src"], s["dst"]) for s, _ in msgs
        ]
        assert len(f["cells"]) == 4
    assert "same bytes on every rank" in m["summary"]


@pytest.mark.parametrize("what", exchange.EXCHANGES)
def test_page_of_every_exchange(what):
    x = exchange.explain_exchange(what, 3, 1, root=1)
    m = model_of(html.page(html.grid_model(x)))
    assert len(m["frames"]) == x.rounds + 1
    assert sum(len(f["arrows"]) for f in m["frames"]) == sum(len(v) for v in x.messages)


def test_io_pictures_decode_the_real_results(tmp_path):
    n = 4
    got = {c: io.run_io(c, n, root=0) for c in io.COLLECTIVES}
    assert len(got) == 10  # 11 collectives: send and recv share one picture
    assert all(row == ["Σa", "Σb", "Σc", "Σd"] for row in got["all_reduce"].after)
    assert got["reduce"].after[0] == ["Σa", "Σb", "Σc", "Σd"]
    assert got["reduce"].after[2] == got["reduce"].before[2]
    assert all(row == ["a0", "b0", "c0", "d0"] for row in got["broadcast"].after)
    assert all(row == ["a0", "a1", "a2", "a3"] for row in got["all_gather"].after)
    assert [row for row in got["reduce_scatter"].after] == [["Σa"], ["Σb"], ["Σc"], ["Σd"]]
    assert got["all_to_all"].after[2] == ["c0", "c1", "c2", "c3"]
    assert got["gather"].after[0] == ["a0", "a1", "a2", "a3"]
    assert got["gather"].after[1:] == [None, None, None]
    assert [row for row in got["scatter"].after] == [["a0"], ["b0"], ["c0"], ["d0"]]
    assert got["send_recv"].after[1] == got["send_recv"].before[0]
    assert got["send_recv"].after[2:] == [None, None]
    path = io.draw(got["all_to_all"], str(tmp_path / "a2a.png"))
    assert open(path, "rb").read(4) == b"\x89PNG"
    assert "c0   c1   c2   c3" in io.text(got["all_to_all"])


def test_stepped_crash_commit_or_drop():
    early = failures.stepped_crash(3, victim=1, after=2)
    assert early.outcome == "abort" and not any(early.held.values())
    assert early.pending[0] is not None and early.pending[2] is not None  # stuck, waiting
    # a ring all_reduce on 3 ranks: 8 events a rank; stopping before the last (its own final
    # receive) leaves the survivors holding their result
    late = failures.stepped_crash(3, victim=1, after=7)
    assert late.outcome == "commit" and all(late.held.values())


def test_stepped_redo_and_handover():
    """The redo on the two survivors is the plain 2-rank ring (2 sends and 2 receives a
    rank); the joiner's model comes from rank 0 to each of the others."""
    redo = failures.stepped_redo(2)
    assert len(redo) == 8 and sum("send" in ln for ln in redo) == 4
    hand = failures.stepped_handover(3)
    sends = [ln for ln in hand if "send" in ln and "broadcast" in ln]
    assert sorted(ln.split()[5] for ln in sends) == ["1", "2"]  # "rank 0 send -> rank d"
    assert all(ln.startswith("rank 0") for ln in sends)


@pytest.mark.parametrize("n,culprit", [(3, 1), (4, 0), (5, 4)])
def test_stepped_stall_blames_as_the_timed_run(n, culprit):
    """The stepper, holding the culprit's links, reaches the snapshot the threaded stall
    reaches with a clock: the same stalled links and the same verdict."""
    st = failures.stepped_stall(n, culprit)
    timed = stall.run_stall(n, culprit)
    assert st.stalled == sorted(timed.links)
    assert st.blamed == timed.blamed == [culprit]


def test_evidence_in_one_shape():
    plain = stall.evidence_of((3, {}, [1], "is on the stalled link(s) 0->1, 1->2"))
    assert plain == {"probes": [], "decided_by": "is on the stalled link(s) 0->1, 1->2"}
    ev = stall.evidence_of(
        (
            3,
            {},
            [1],
            "why",
            {
                "probes": [{"src": 0, "dst": 1, "seconds": None}, (1, 2, 0.5)],
                "decided_by": "rank 1's links did not answer a probe",
            },
        )
    )
    assert ev["probes"] == [
        {"src": 0, "dst": 1, "seconds": None},
        {"src": 1, "dst": 2, "seconds": 0.5},
    ]
    assert ev["decided_by"] == "rank 1's links did not answer a probe"


def test_stall_decided_by_probes_is_drawn_from_the_verdicts_evidence():
    """Links 2->0 and 1->0 held: the op's own picture shows one stalled link (2->0, a tie
    between 0 and 2); the probe round finds 1->0 silent too, and rank 0, on both, is blamed
    'by probes'. The page's evidence step draws exactly the silent probes."""
    s = stall.run_stall(3, 1, links=[(2, 0), (1, 0)])
    assert s.links == [(2, 0)] and s.blamed == [0]
    assert s.evidence["decided_by"].startswith("probes")
    silent = {(p["src"], p["dst"]) for p in s.evidence["probes"] if p["seconds"] is None}
    assert silent == {(2, 0), (1, 0)}
    m = views.stall_model(s)
    assert_offline(html.page(m))
    probe = [f for f in m["frames"] if f["title"].startswith("evidence")]
    assert probe and {(a["src"], a["dst"]) for a in probe[0]["arrows"]} == silent
    assert m["frames"][-1]["nodes"][0]["color"] == views.BLAMED
    t = stall.text(s)
    assert "1->0 no answer" in t and "2->0 no answer" in t and "Decided by: probes" in t


def test_explain_writes_pages_and_defaults_to_explain_out(tmp_path, monkeypatch):
    from collectives.teaching.explain import main

    monkeypatch.chdir(tmp_path)
    assert main(["ring", "-n", "3", "-c", "6", "--html", "r.html"]) == 0
    assert (tmp_path / "explain_out" / "explain_ring_3x6.png").exists()
    assert model_of((tmp_path / "r.html").read_text())["kind"] == "grid"
    assert main(["io", "scatter", "-n", "3"]) == 0
    assert (tmp_path / "explain_out" / "io_scatter.png").exists()
    assert main(["stall", "--links", "2:0,1:0", "--no-plot", "--html", "s.html"]) == 0
    assert model_of((tmp_path / "s.html").read_text())["kind"] == "graph"


# The committed pages of explain's grids and the run each is (docs/tutorial.md links them):
# each is written by `python -m collectives.explain ALGORITHM -n N -c COUNT --html PAGE`.
KEPT_GRID_PAGES = {
    "ring_4x8": ("ring", 4, 8),
    "ring_8x16": ("ring", 8, 16),
    "tree_4x4": ("tree", 4, 4),
    "halving_doubling_8x8": ("halving_doubling", 8, 8),
    "hierarchical_4x8": ("hierarchical", 4, 8),
    "all_to_all_4": ("all_to_all", 4, 1),
}


@pytest.mark.parametrize("name", sorted(KEPT_GRID_PAGES))
def test_a_kept_page_is_its_run_now(name):
    """A page in docs/pages is what explain writes for its run today (frames, rows and the
    theory-vs-run summary), so a page cannot keep a report the code no longer prints."""
    from support.procs import ROOT

    what, n, count = KEPT_GRID_PAGES[name]
    x = (
        exchange.explain_exchange(what, n, count)
        if what in exchange.EXCHANGES
        else explain_run(what, n, count)
    )
    kept = model_of((ROOT / "docs" / "pages" / f"{name}.html").read_text(encoding="utf-8"))
    assert kept == json.loads(json.dumps(html.grid_model(x))), (
        f"docs/pages/{name}.html is stale: python -m collectives.explain {what} -n {n} "
        f"-c {count} --html docs/pages/{name}.html"
    )
