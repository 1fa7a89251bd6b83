"""Teaching tools: trace, invariants, explain (text, picture), link emulation, step mode.

Every algorithm is run on the in-process transport with a tracer installed, and the trace is
checked against the algorithm's promises (invariants.py): rounds, messages and bytes per rank,
n-1 reductions per element, identical bytes on every rank.
"""

import contextlib
import io
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import collectives as cl
from support.timing import scaled
from collectives.teaching import emulate, explain, invariants
from collectives.teaching.step import Stepper, StepperClosed
from collectives.teaching.trace import Tracer, chrome_trace, load, merge

# in-process: part of `make test-fast`
pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]
GOLDEN = Path(__file__).parent / "golden"


def traced_run(n, fn, wrappers=()):
    tracer = Tracer()
    results = cl.simulate(n, fn, wrappers=[*wrappers, tracer.wrap], timeout=10.0)
    return tracer, results


@pytest.mark.parametrize("algorithm", ["ring", "tree", "halving_doubling", "naive", "direct"])
@pytest.mark.parametrize("n", range(1, 10))
def test_all_reduce_invariants(algorithm, n):
    # Rank r contributes r+1 in every element: the sum is n(n+1)/2 everywhere.
    for count in (1, 7, 13):

        def fn(pg):
            x = np.full(count, pg.rank + 1, np.int32)
            pg.all_reduce(x, algorithm=algorithm)
            return x

        tracer, results = traced_run(n, fn)
        assert all((r == n * (n + 1) // 2).all() for r in results)
        report = invariants.check(
            tracer.events, algorithm, world_size=n, count=count, itemsize=4, finals=results
        )
        assert report.ok, f"count {count}\n{report}"
        lg = n.bit_length() - 1  # floor(log2 n)
        depth = {
            "ring": 2 * (n - 1),
            "tree": 2 * lg,
            "halving_doubling": 2 * lg + (0 if n & (n - 1) == 0 else 2),
            "naive": 2,
            "direct": 1,
        }[algorithm]
        assert invariants.assign_depth(tracer.events) == (depth if n > 1 else 0)


@pytest.mark.parametrize("kind", ["reduce", "broadcast"])
@pytest.mark.parametrize("n", range(1, 9))
def test_rooted_invariants(kind, n):
    root = (n - 1) // 2
    count = 5

    def fn(pg):
        x = np.full(count, pg.rank + 1, np.int64)
        if kind == "reduce":
            pg.reduce(x, dst=root)
        else:
            pg.broadcast(x, src=root)
        return x

    tracer, results = traced_run(n, fn)
    report = invariants.check(
        tracer.events, kind, world_size=n, count=count, itemsize=8, root=root, finals=results
    )
    assert report.ok, str(report)
    if kind == "reduce":
        assert (results[root] == n * (n + 1) // 2).all()
    else:
        assert all((r == root + 1).all() for r in results)
    # The confirm messages go through the tracer too (they are left out of the checks): one
    # from every other rank to the root before a broadcast, one from the root to every
    # other rank after a reduce; each is a send and a receive.
    assert sum(e["phase"] == "confirm" for e in tracer.events) == 2 * (n - 1)


def test_invariants_catch_a_broken_schedule():
    # A ring whose rank 0 "forgets" one reduction is caught: the check must be able to fail.
    n, count = 4, 8
    tracer, results = traced_run(
        n, lambda pg: pg.all_reduce(np.ones(count, np.int64), algorithm="ring")
    )
    events = [dict(e) for e in tracer.events]
    victim = next(e for e in events if e["kind"] == "reduce")
    victim["kind"] = "recv"
    bad = invariants.check(
        events,
        "ring",
        world_size=n,
        count=count,
        itemsize=8,
        finals=[results[0], np.zeros(count, np.int64), *results[2:]],
    )
    names = {row[0] for row in bad.failures()}
    assert names == {"reductions per element", "same bytes on every rank"}
    # and a trace claiming another algorithm fails on rounds and traffic
    wrong = invariants.check(tracer.events, "tree", world_size=n, count=count, itemsize=8)
    assert not wrong.ok


def test_explain_ring_matches_golden():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = explain.main(["ring", "--world-size", "3", "--count", "6", "--no-plot"])
    assert rc == 0
    golden = (GOLDEN / "explain_ring_3x6.txt").read_text()
    assert out.getvalue() == golden


@pytest.mark.parametrize("algorithm", ["ring", "tree", "naive", "direct", "reduce", "broadcast"])
def test_explain_every_algorithm(algorithm):
    x = explain.explain_run(algorithm, 4, 5, root=1)
    assert x.report.ok, str(x.report)
    text = explain.text(x)
    assert "round 1:" in text and "theory vs run" in text
    full = (1 << 4) - 1
    if algorithm == "reduce":
        assert (x.finals[1] == full).all()
    else:
        assert all((f == full).all() for f in x.finals)
    # The replayed buffers end where the real ones did (direct adds its own input locally).
    if algorithm in ("ring", "tree", "naive", "broadcast"):
        assert all((s == f).all() for s, f in zip(x.states[-1], x.finals))


def colours_in(png, n) -> list[bool]:
    """Whether each of the first n tab10 colours (one per chunk, drawn at full strength where
    a cell holds the final sum, or as a plot line) appears in the picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image
    import matplotlib.pyplot as plt

    img = matplotlib.image.imread(str(png))[..., :3]
    cmap = plt.get_cmap("tab10")
    return [bool((np.abs(img - np.array(cmap(i)[:3])).max(axis=-1) < 0.02).any()) for i in range(n)]


@pytest.mark.parametrize("n", (1, 2, 3, 5))
@pytest.mark.parametrize("what", ["all_to_all", "gather", "scatter"])
def test_explain_every_exchange(what, n):
    """The exchanges checked against their theory (pairwise all_to_all: n-1 rounds, n-1
    messages of one block from every rank; linear gather/scatter: one message deep, n-1
    messages into / out of the root, one a round: n-1 rounds of the single-port model, as the
    emulator counts them), every block where it belongs, and the replayed outputs end where
    the real ones did."""
    from collectives.teaching.explain import exchange

    root = n - 1
    x = exchange.explain_exchange(what, n, 2, root=root)
    assert x.report.ok, str(x.report)
    model = emulate.LinkModel(alpha=1.0, beta=0.0)
    fn = exchange.make_fn(what, exchange.inputs(what, n, 2, root), root, 2)
    cl.simulate(n, fn, wrappers=[model.wrap])
    data_rounds = n - 1  # the rooted exchanges' empty confirm messages are not drawn
    assert x.rounds == data_rounds
    if what == "all_to_all":
        assert x.rounds == round(model.makespan())
    for s, f in zip(x.states[-1], x.finals):
        assert (s is None and f is None) or np.array_equal(s, f)
    text = exchange.text(x)
    assert "theory vs run" in text and "every block where it belongs" in text
    if n == 3 and what == "all_to_all":
        assert "round 2: exchange step 2 (3 messages)" in text
        assert "  rank 1 -> rank 0  1>0  16 B" in text  # step 2: r -> r+2
        assert text.rstrip().count("  rank 0  0>0     1>0     2>0") == 2  # round 2, result


def test_explain_exchange_cli_and_picture(tmp_path):
    out = io.StringIO()
    png = tmp_path / "g.png"
    with contextlib.redirect_stdout(out):
        rc = explain.main(["gather", "-n", "4", "--root", "2", "--out", str(png)])
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "round 1: gather (1 message)" in out.getvalue()  # the root takes one a round
    assert "round 3: gather (1 message)" in out.getvalue()
    assert "  rank 2  0>2     1>2     2>2     3>2" in out.getvalue()
    step = io.StringIO()
    rc = explain.step_interactively(
        "all_to_all", 3, 1, stream_in=io.StringIO("\nc\n"), stream_out=step
    )
    assert rc == 0 and "event 12:" in step.getvalue()
    assert "result: rank 0 [0>0 1>0 2>0]; rank 1 [0>1 1>1 2>1]" in step.getvalue()


def test_explain_picture_is_written(tmp_path):
    x = explain.explain_run("ring", 3, 6)
    path = explain.draw(x, tmp_path / "ring.png")
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    # what it shows: a column per round plus the start (5 here), the 3 chunks in their colours
    assert x.rounds == 4
    assert all(colours_in(path, 3)), colours_in(path, 3)
    import matplotlib.image

    h, w = matplotlib.image.imread(str(path)).shape[:2]
    assert w > h, (w, h)  # 5 columns of 3 rank rows: a wide picture


def test_explain_cli_writes_picture_and_traces(tmp_path):
    out = io.StringIO()
    png, chrome, plain = tmp_path / "t.png", tmp_path / "c.json", tmp_path / "p.json"
    with contextlib.redirect_stdout(out):
        rc = explain.main(
            [
                "tree",
                "-n",
                "5",
                "-c",
                "3",
                "--out",
                str(png),
                "--chrome",
                str(chrome),
                "--json",
                str(plain),
            ]
        )
    assert rc == 0 and png.stat().st_size > 0
    assert all(colours_in(png, 3)), colours_in(png, 3)  # 3 elements: 3 chunks, 3 colours
    doc = json.loads(chrome.read_text())
    assert {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"} == set(range(5))
    assert len(load(plain)["events"]) > 0


def test_chrome_trace_one_track_per_rank(tmp_path):
    n = 5
    tracer, _ = traced_run(n, lambda pg: pg.all_reduce(np.ones(11, np.float32), algorithm="ring"))
    path = tmp_path / "trace.json"
    tracer.save_chrome(path)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert names == {r: f"rank {r}" for r in range(n)}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in slices} == set(range(n))
    assert len(slices) == len(tracer.events) == 2 * n * 2 * (n - 1)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    # one flow arrow (start + finish) per message
    assert (
        sum(e["ph"] == "s" for e in events)
        == sum(e["ph"] == "f" for e in events)
        == n * 2 * (n - 1)
    )


def test_plain_json_and_merge(tmp_path):
    tracer, _ = traced_run(3, lambda pg: pg.all_reduce(np.ones(6), algorithm="ring"))
    p = tmp_path / "events.json"
    tracer.save_json(p)
    doc = load(p)
    assert doc["events"] == json.loads(json.dumps(tracer.sorted_events()))
    # Two per-process tracers (as in a ZeroMQ run) merge onto one time line.
    half = {**doc, "events": [e for e in doc["events"] if e["rank"] == 0]}
    rest = {
        **doc,
        "epoch": doc["epoch"] + 1.0,
        "events": [e for e in doc["events"] if e["rank"] != 0],
    }
    merged = merge(half, rest)
    assert len(merged) == len(doc["events"])
    shifted = [e for e in merged if e["rank"] == 1][0]
    original = [e for e in doc["events"] if e["rank"] == 1][0]
    assert shifted["t0"] == pytest.approx(original["t0"] + 1.0)
    assert invariants.check(merged, "ring", world_size=3, count=6, itemsize=8).ok


def test_tracer_sees_zmq_runs():
    # the project's own module: an import that fails is a failure, never a skip
    from collectives.transport.zmq import transport as zmq_mod

    n = 2
    ts = [zmq_mod.ZmqTransport(r, n, transport="ipc") for r in range(n)]
    infos = [t.address_info() for t in ts]
    for t in ts:
        t.connect(infos)
    tracer = Tracer()
    groups = [cl.ProcessGroup(t, timeout=10.0) for t in ts]
    out, errors = [None] * n, []

    def body(r):
        try:
            tracer.install(groups[r])
            x = np.full(7, r + 1.0)
            groups[r].all_reduce(x, algorithm="ring")
            out[r] = x
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(20)
    finally:
        for g in groups:
            g.destroy()
    assert not errors and all((x == 3.0).all() for x in out)
    assert invariants.check(tracer.events, "ring", world_size=n, count=7, itemsize=8, finals=out).ok


# --- link emulation -----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_emulated_time_matches_alpha_beta_model(algorithm):
    n, alpha, beta = 8, 50e-6, 1e-9
    count = 8 * 1024  # float32, divisible by n
    closed = {"ring": emulate.ring_time, "tree": emulate.tree_time}[algorithm]
    times = []
    for _ in range(2):  # deterministic: the same virtual time twice
        model = emulate.LinkModel(alpha, beta)
        tracer, _ = traced_run(
            n,
            lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm=algorithm),
            wrappers=[model.wrap],
        )
        times.append(model.makespan())
    assert times[0] == times[1]
    assert times[0] == pytest.approx(closed(count * 4, n, alpha, beta), rel=1e-9)
    assert all(e["vt0"] is not None and e["vt1"] >= e["vt0"] for e in tracer.events)
    doc = chrome_trace(tracer.sorted_events(), "virtual")
    end = max(e["ts"] + e["dur"] for e in doc["traceEvents"] if e["ph"] == "X")
    assert end == pytest.approx(times[0] * 1e6)


def test_per_link_parameters_and_naive_gather():
    # Naive all_reduce: rank 0's port takes the n-1 buffers one after another, and gives the
    # result back one after another: 2(n-1) messages in series, each alpha + N beta.
    n, alpha, beta, N = 4, 1e-3, 1e-6, 800
    model = emulate.LinkModel(alpha, beta)
    cl.simulate(
        n, lambda pg: pg.all_reduce(np.ones(N // 8), algorithm="naive"), wrappers=[model.wrap]
    )
    assert model.makespan() == pytest.approx(2 * (n - 1) * (alpha + N * beta))

    # One link ten times slower (alpha and beta): on the ring's direction (1 -> 2) it paces
    # every step, so the whole ring takes ten times as long; against it (2 -> 1) the ring
    # never uses it. The tree (edges 0-1, 0-2, 2-3) does not notice 1 -> 2 at all, and pays
    # for 0 -> 1 once, in the one broadcast message that crosses it.
    def run(algorithm, link):
        m = emulate.LinkModel(alpha, beta, links={link: (10 * alpha, 10 * beta)})
        cl.simulate(
            n, lambda pg: pg.all_reduce(np.ones(N // 8), algorithm=algorithm), wrappers=[m.wrap]
        )
        return m.makespan()

    ring, tree = emulate.ring_time(N, n, alpha, beta), emulate.tree_time(N, n, alpha, beta)
    assert run("ring", (1, 2)) == pytest.approx(10 * ring)
    assert run("ring", (2, 1)) == pytest.approx(ring)
    assert run("tree", (1, 2)) == pytest.approx(tree)
    one = alpha + N * beta  # the 0 -> 1 message, now ten of these
    assert run("tree", (0, 1)) == pytest.approx(tree + 9 * one)


def test_units_and_crossover():
    assert emulate.parse_time("50us") == pytest.approx(50e-6)
    assert emulate.parse_time("0.5ms") == pytest.approx(5e-4)
    assert emulate.parse_beta("1GB/s") == pytest.approx(1e-9)
    assert emulate.parse_beta("8Gb/s") == pytest.approx(1e-9)
    assert emulate.parse_beta("2ns/B") == pytest.approx(2e-9)
    with pytest.raises(ValueError, match="bandwidth"):
        emulate.parse_beta("fast")
    n, alpha, beta = 8, 50e-6, 1e-9
    star = emulate.crossover_bytes(n, alpha, beta)
    assert emulate.ring_time(star, n, alpha, beta) == pytest.approx(
        emulate.tree_time(star, n, alpha, beta)
    )
    rows = explain.crossover(alpha, beta, 4, sizes=[256, 1 << 20])
    small, large = rows[0][1], rows[1][1]
    assert small["tree"][1] < small["ring"][1] and large["ring"][1] < large["tree"][1]
    text = explain.crossover_text(rows, alpha, beta, 4)
    assert "N* =" in text and "changes between 256 B and 1 MiB" in text


def test_crossover_cli(tmp_path):
    out = io.StringIO()
    png = tmp_path / "x.png"
    with contextlib.redirect_stdout(out):
        rc = explain.main(
            [
                "crossover",
                "--alpha",
                "50us",
                "--beta",
                "1GB/s",
                "-n",
                "4",
                "--sizes",
                "64,65536",
                "--out",
                str(png),
            ]
        )
    assert rc == 0 and png.stat().st_size > 0
    assert all(colours_in(png, 2)), colours_in(png, 2)  # the ring and the tree curves
    assert "ring model" in out.getvalue()


# --- step mode -----------------------------------------------------------------------------------
def ring_fn(pg):
    x = np.full(6, 1 << pg.rank, np.int64)
    pg.all_reduce(x, algorithm="ring")
    return x


def test_step_mode_event_by_event():
    with cl.simulate(3, ring_fn, step=True) as s:
        first = s.pending()
        assert [p["kind"] for p in first.values()] == ["send"] * 3  # nothing moved yet
        # rank 0's first receive waits for rank 2's send: it cannot be stepped yet
        s.step(rank=0)
        assert s.pending()[0]["kind"] == "reduce"
        with pytest.raises(ValueError, match="not been sent"):
            s.step(rank=0)
        events = [s.step(rank=2)] + list(s)
        assert len(events) + 1 == 3 * 2 * 2 * (3 - 1)
        assert s.done
        assert all((r == 7).all() for r in s.results())
        assert invariants.check(s.tracer.events, "ring", world_size=3, count=6, itemsize=8).ok


def test_step_mode_is_deterministic_and_closable():
    orders = []
    for _ in range(2):
        with Stepper(4, lambda pg: pg.all_reduce(np.ones(5), algorithm="tree")) as s:
            orders.append([(e["rank"], e["kind"], e["peer"]) for e in s])
    assert orders[0] == orders[1]
    s = Stepper(3, ring_fn)
    s.step()
    s.close()
    with pytest.raises(cl.SimulationError) as info:
        s.results()
    assert all(isinstance(e, StepperClosed) for e in info.value.errors.values())


def test_step_from_the_terminal():
    out = io.StringIO()
    rc = explain.step_interactively("ring", 3, 3, stream_in=io.StringIO("\n\nc\n"), stream_out=out)
    text = out.getvalue()
    assert rc == 0 and "event 1:" in text and "event 24:" in text
    assert "result: rank 0 [ALL ALL ALL]" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n,culprit", [(3, 1), (4, 2), (5, 0)])
def test_explain_stall_blames_the_rank_between_the_slowed_links(n, culprit, tmp_path):
    """The stall story (python -m collectives.explain stall): with the links into and out of
    the culprit slowed, exactly those two links are found stalled and the culprit is blamed;
    the text says so and the picture is drawn from the same snapshot."""
    from collectives.teaching import stall as stall_story

    # the op deadline scaled: under load a healthy link may still be draining at 0.5 s
    s = stall_story.run_stall(n, culprit, timeout=scaled(0.5))
    left, right = (culprit - 1) % n, (culprit + 1) % n
    assert s.blamed == [culprit]
    assert sorted(s.links) == sorted([(left, culprit), (culprit, right)])
    txt = stall_story.text(s)
    assert f"Blamed: rank {culprit} -- is on the stalled link(s)" in txt
    assert f"{left}->{culprit}: STALLED link" in txt and f"{culprit}->{right}: STALLED link" in txt
    path = stall_story.draw(s, tmp_path / "stall.png")
    import matplotlib.image

    img = matplotlib.image.imread(path)
    red = (img[..., 0] > 0.75) & (img[..., 1] < 0.3) & (img[..., 2] < 0.3)
    assert red.sum() > 500  # the blamed rank and the stalled links are drawn in red


@pytest.mark.parametrize("n", range(2, 17))
@pytest.mark.parametrize("per_rank", [1, 3, 8])
def test_halving_doubling_bytes_formula_names_what_the_ranks_send(n, per_rank):
    """Where the report prints a figure for halving-doubling's bytes, every rank outside the
    fold pairs sends exactly that (uneven chunks print none)."""
    from collectives.algorithms import halving_doubling as hd

    count = per_rank * n
    exp = invariants.expected("halving_doubling", n, count, 8)
    formula = exp.formulas["bytes"]
    m = re.search(r"= ([0-9.]+)", formula)
    p, e = hd.fold(n)
    if count % p:
        assert m is None, formula
        return
    assert m, formula
    outside = [exp.nbytes[r] for r in range(2 * e, n)]
    assert outside == [float(m.group(1))] * len(outside)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "halving_doubling"])
def test_a_segmented_trace_is_checked_on_what_segments_keep(algorithm):
    """Segments change rounds, depth and message counts, not bytes: check(segmented=True) on a
    trace cut into 4 segments a message passes with its bytes row, and the same trace checked
    as unsegmented fails."""
    n, count = 4, 64
    tracer = Tracer()
    cl.simulate(
        n,
        lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm=algorithm),
        wrappers=[tracer.wrap],
        segment_bytes=count * 4 // n // 4 if algorithm != "tree" else count,
    )
    args = dict(world_size=n, count=count, itemsize=4)
    seg = invariants.check(tracer.events, algorithm, segmented=True, **args)
    assert seg.ok, str(seg)
    assert any(r[0].startswith("bytes") for r in seg.rows)
    assert not invariants.check(tracer.events, algorithm, **args).ok
