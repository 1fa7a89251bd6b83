"""Hierarchical all_reduce in-process, with host maps given to cl.simulate.

Invariants:
  * the result equals numpy's reduction of the n inputs (exact for integers and MIN/MAX, within
    the dtype's rounding bound for floating SUM/AVG/PRODUCT) and every rank holds the same
    bytes, for host maps of every shape (one host, one rank per host, uneven hosts, hosts whose
    ranks are interleaved) at world sizes 2-8, every op and dtype, counts 0/1/odd/many, and
    with segments so small that every phase is cut into many pipelined pieces;
  * the result is the same bytes on every run, whatever the thread timing (a fixed order);
  * only the hosts' leaders send across hosts, each 2(H-1)/H * N bytes (a flat ring sends
    2(n-1)/n * N over each host's link), and the other ranks talk to their own host only;
  * "auto" picks hierarchical exactly when the group spans hosts, some host has 2+ ranks and
    the buffer is past the direct crossover -- the same choice on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as cl
from collectives.algorithms.hierarchical import host_groups, leaders_per_host
from collectives.group import tuning
from support.reference import (
    ALL_DTYPES,
    ALL_OPS,
    assert_identical,
    assert_matches,
    expected,
    make_input,
    op_applies,
)

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

# Host maps by world size: one host, a host per rank, even and uneven hosts, interleaved ranks.
HOST_MAPS = {
    2: [[0, 1], [0, 0]],
    3: [[0, 0, 1], [0, 1, 1], [0, 1, 0]],
    4: [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1], [0, 1, 2, 3]],
    5: [[0, 0, 1, 1, 2], [0, 0, 0, 0, 1], [1, 0, 1, 0, 1]],
    6: [[0, 0, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1]],
    7: [[0, 0, 0, 1, 1, 1, 2], [0, 1, 1, 2, 2, 2, 2]],
    8: [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3], [0] * 8, [3, 2, 1, 0, 0, 1, 2, 3]],
}
CASES = [(n, hosts) for n, maps in HOST_MAPS.items() for hosts in maps]


def run_cases(hosts, cases, algorithm="hierarchical", segment_bytes=None, seed=0):
    """cases: (op, dtype, count). One simulated group runs them all; each result is checked
    against numpy and for identical bytes on every rank. Returns the results."""
    n = len(hosts)

    def body(pg):
        out = []
        for op, dt, c in cases:
            x = make_input(pg.rank, c, dt, op, seed)
            pg.all_reduce(x, op=op, algorithm=algorithm)
            out.append(x)
        return out

    results = cl.simulate(n, body, timeout=20, segment_bytes=segment_bytes, hosts=hosts)
    for i, (op, dt, c) in enumerate(cases):
        what = f"all_reduce {algorithm} hosts={hosts} {op!r} {dt} count={c}"
        got = [results[r][i] for r in range(n)]
        assert all(g.dtype == np.dtype(dt) and g.shape == (c,) for g in got), what
        assert_identical([g.tobytes() for g in got], what)
        ref, tol = expected([make_input(r, c, dt, op, seed) for r in range(n)], op, dt)
        assert_matches(got[0], ref, tol, what)
    return results


@pytest.mark.parametrize("n,hosts", CASES, ids=[f"{n}:{''.join(map(str, h))}" for n, h in CASES])
def test_hierarchical_matrix(n, hosts):
    """Every op x dtype x count {0, 1, odd, 3n+1, 2999} on small host maps; at 5+ ranks a
    rotating third of the dtypes (every dtype is met at some size)."""
    k = (n + len(hosts) + sum(hosts)) % 3
    dtypes = ALL_DTYPES if n <= 4 else ALL_DTYPES[k::3]
    counts = sorted({0, 1, 2 * n + 1, 3 * n + 1, 2999})
    run_cases(
        hosts,
        [(op, dt, c) for op in ALL_OPS for dt in dtypes for c in counts if op_applies(op, dt)],
    )


@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], [0, 1, 1, 2, 2, 2], [0, 0, 0, 1, 1, 1, 2, 2]])
def test_hierarchical_multi_segment(hosts):
    """segment_bytes=64: every block, tree segment and ring chunk is many messages, of
    unequal sizes (the last block is short, chunks differ by one element)."""
    run_cases(
        hosts,
        [
            (op, dt, c)
            for op in (cl.ReduceOp.SUM, cl.ReduceOp.AVG, cl.ReduceOp.MAX)
            for dt in ("int16", "float16", "float32")
            for c in (1000, 8 * len(hosts) + 3)
            if op_applies(op, dt)
        ],
        segment_bytes=64,
    )


def test_hierarchical_same_bytes_on_every_run():
    """Float SUM is order-sensitive: a fixed reduction order gives the same bytes run after run
    (and on every rank), whatever the threads' timing."""
    cases = [(cl.ReduceOp.SUM, "float32", 5000), (cl.ReduceOp.PRODUCT, "float64", 333)]
    hosts = [0, 0, 0, 1, 1, 2]
    first = run_cases(hosts, cases, segment_bytes=256)
    for _ in range(3):
        again = run_cases(hosts, cases, segment_bytes=256)
        for a, b in zip(first[0], again[0]):
            assert a.tobytes() == b.tobytes()


K_LEADER_MAPS = [[0, 0, 1, 1], [0, 0, 0, 1, 1, 1], [0, 1, 1], [0, 0, 1, 1, 1]]


@pytest.mark.parametrize("hosts", K_LEADER_MAPS, ids=["".join(map(str, h)) for h in K_LEADER_MAPS])
def test_k_leaders_equal_numpy_bit_for_bit(hosts):
    """k leaders per host (k = 2, 3, then 1 for a host of one rank, 2 with an uneven host):
    SUM, AVG, MAX and PRODUCT of small integers held in float32 and float64 are exact, so every
    rank must hold numpy's reduction bit for bit -- whatever order the k rings and the hosts
    added in -- at counts below k*H (empty parts and chunks), odd counts and many pieces
    (segment_bytes=64)."""
    n = len(hosts)
    ops = (cl.ReduceOp.SUM, cl.ReduceOp.AVG, cl.ReduceOp.MAX, cl.ReduceOp.PRODUCT)
    cases = [(op, dt, c) for op in ops for dt in ("float32", "float64") for c in (1, 3, 5, 77)]

    def inputs(r, c, dt):  # |x| <= 3: a product of 6 stays exact
        return ((np.arange(c) * 7 + r * 3) % 7 - 3).astype(dt)

    def body(pg):
        out = []
        for op, dt, c in cases:
            x = inputs(pg.rank, c, dt)
            pg.all_reduce(x, op=op, algorithm="hierarchical")
            out.append(x)
        return out

    got = cl.simulate(n, body, timeout=20, segment_bytes=64, hosts=hosts)
    for i, (op, dt, c) in enumerate(cases):
        xs = np.stack([inputs(r, c, dt) for r in range(n)])
        want = {
            cl.ReduceOp.SUM: xs.sum(0),
            cl.ReduceOp.AVG: xs.sum(0) / np.array(n, dt),
            cl.ReduceOp.MAX: xs.max(0),
            cl.ReduceOp.PRODUCT: xs.prod(0),
        }[op].astype(dt)
        for r in range(n):
            assert got[r][i].tobytes() == want.tobytes(), (hosts, op, dt, c, r, got[r][i], want)


def _bytes_across(hosts, algorithm, count=1200):
    """Bytes each rank sent to ranks of other hosts / of its own host, from a trace."""
    tracer = cl.Tracer()
    cl.simulate(
        len(hosts),
        lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm=algorithm),
        hosts=hosts,
        wrappers=[tracer.wrap],
    )
    across, within = [0] * len(hosts), [0] * len(hosts)
    for e in tracer.events:
        if e["kind"] == "send":
            (across if hosts[e["src"]] != hosts[e["dst"]] else within)[e["src"]] += e["nbytes"]
    return across, within


@pytest.mark.parametrize(
    "hosts", [[0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 2, 2], [1, 0, 1, 0], [0, 0, 0, 1, 1, 2]]
)
def test_only_leaders_cross_hosts_with_2_h_minus_1_over_h_of_the_buffer(hosts):
    """A host's k leaders (its first k ranks, k = the fewest ranks a host has) send
    2(H-1)/H * N/k each across hosts, 2(H-1)/H * N together; the other ranks send their N
    bytes to their own host's leaders only."""
    n_bytes = 1200 * 4
    groups = host_groups(hosts)
    h, k = len(groups), leaders_per_host(groups)
    across, within = _bytes_across(hosts, "hierarchical")
    for g in groups:
        for v, r in enumerate(g):
            if v < k:
                assert across[r] == 2 * (h - 1) * n_bytes // (h * k), (r, across)
            else:
                assert across[r] == 0, (r, across)
                assert within[r] == n_bytes  # its contribution, once, to its leader(s)
        assert sum(across[r] for r in g) == 2 * (h - 1) * n_bytes // h, (g, across)
    if hosts == [0, 0, 1, 1]:
        # the flat ring: 2(n-1)/n N = 1.5 N over each host's link (ranks 1 and 3 send out)
        ring_across, _ = _bytes_across(hosts, "ring")
        assert ring_across[1] == ring_across[3] == 3 * n_bytes // 2
        assert ring_across[0] == ring_across[2] == 0


def test_auto_picks_hierarchical_across_hosts_only():
    seen = []

    def body(pg):
        pg.channel_wrappers.append(
            lambda ch: (seen.append((pg.rank, ch.descriptor.algorithm)), ch)[1]
        )
        for count in (4, 1 << 18):  # 16 B (direct), 1 MiB (past every crossover)
            x = np.full(count, pg.rank + 1, np.int64)
            pg.all_reduce(x)
            assert (x == 10).all()  # ranks 0..3 contribute 1..4
        return pg.hosts

    for hosts, big in (
        ([0, 0, 1, 1], "hierarchical"),
        ([0, 0, 0, 0], "tree"),
        ([0, 1, 2, 3], "tree"),
        (None, "tree"),
    ):
        seen.clear()
        got_hosts = cl.simulate(4, body, hosts=hosts)
        assert got_hosts[0] == tuple(hosts or [0] * 4)
        by_rank = {r: [a for rr, a in seen if rr == r] for r in range(4)}
        assert all(v == ["direct", big] for v in by_rank.values()), (hosts, by_rank)


def test_auto_rule():
    f = tuning.all_reduce_algorithm
    assert f(1 << 20, 4, ["a", "a", "b", "b"]) == "hierarchical"
    assert f(64, 4, ["a", "a", "b", "b"]) == "direct"  # below the direct crossover
    assert f(64, 32, [i // 4 for i in range(32)]) == "hierarchical"  # direct stops at 16
    assert f(1 << 20, 4, ["a", "b", "c", "d"]) != "hierarchical"  # one rank per host
    assert f(1 << 20, 4, ["a"] * 4) != "hierarchical"  # one host
    assert f(1 << 20, 4) == f(1 << 20, 4, None) == "tree"


def test_hosts_are_numbered_by_lowest_rank_and_checked():
    assert cl.simulate(4, lambda pg: pg.hosts, hosts=["b", "a", "b", "c"])[0] == (0, 1, 0, 2)
    assert host_groups(["b", "a", "b", "c"]) == [[0, 2], [1], [3]]
    with pytest.raises(ValueError, match="one host per rank"):
        cl.simulate(3, lambda pg: None, hosts=[0, 1])


def test_a_stalled_leader_is_named_with_the_phase():
    """A leader that never shows up: every other rank raises (no hang) with rank 2 as the
    culprit (the diagnosis blames it whoever's deadline fires first), and names the phase of
    the composed schedule the first rank to time out was in."""

    def body(pg):
        x = np.ones(1000, np.float32)
        if pg.rank == 2:
            return "skipped"
        try:
            pg.all_reduce(x, algorithm="hierarchical", timeout=1.0)
        except cl.CollectiveTimeout as exc:
            return exc.peer, str(exc)
        return "returned"

    out = cl.simulate(4, body, hosts=[0, 0, 1, 1], timeout=10)
    for r in (0, 1, 3):
        assert out[r] != "returned", out
        peer, text = out[r]
        assert peer == 2 and "rank 2 did not answer" in text, out
        assert any(
            f"in all_reduce, {p}" in text
            for p in ("leaders reduce-scatter", "host reduce-scatter", "host all-gather")
        ), out


# --- explain (python -m collectives.explain hierarchical) ---------------------------------------
@pytest.mark.parametrize(
    "hosts", [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 1]]
)
def test_explain_hierarchical_theory_matches_the_run(hosts):
    """Rounds, messages and bytes per rank, reductions per element and identical results:
    what invariants.py predicts for the host map is what the traced run did; only messages
    between leaders cross hosts, and between leaders of the same ring (local rank j)."""
    from collectives.teaching import explain

    x = explain.explain_run("hierarchical", len(hosts), 7, hosts=hosts)
    assert x.report.ok, str(x.report)
    groups = host_groups(hosts)
    k = leaders_per_host(groups)
    local = {r: v for g in groups for v, r in enumerate(g)}
    for rnd in range(1, x.rounds + 1):
        for s, _ in x.messages[rnd]:
            if hosts[s["src"]] != hosts[s["dst"]]:
                assert local[s["src"]] == local[s["dst"]] < k, s
    text = explain.text(x)
    assert "only leaders send across hosts" in text and "[across hosts]" in text
    back = "host broadcast" if k == 1 else "host all-gather"
    assert "leaders reduce-scatter" in text and back in text


def test_explain_hierarchical_cli(tmp_path, capsys):
    from collectives.teaching import explain

    png = tmp_path / "h.png"
    rc = explain.main(
        ["hierarchical", "--world-size", "4", "--hosts", "0,0,1,1", "--out", str(png)]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "host 0: ranks 0, 1 (leaders 0, 1); host 1: ranks 2, 3 (leaders 2, 3)" in out
    # the rounds are the single-port model's (7 here, where the depth is 4): the host
    # all-gather ends the run in its last round
    assert "round 7: host all-gather" in out and "round 8:" not in out
    assert png.stat().st_size > 10_000
    with pytest.raises(SystemExit):
        explain.main(["hierarchical", "--world-size", "3", "--hosts", "0,0,1,1", "--no-plot"])


def test_explain_hierarchical_step_mode():
    import io

    from collectives.teaching import explain

    out = io.StringIO()
    rc = explain.step_interactively(
        "hierarchical", 4, 2, stream_in=io.StringIO("\nc\n"), stream_out=out, hosts=[0, 1, 0, 1]
    )
    assert rc == 0
    assert (
        "result: rank 0 [ALL ALL]; rank 1 [ALL ALL]; rank 2 [ALL ALL]; rank 3 [ALL ALL]"
        in out.getvalue()
    )


@pytest.mark.parametrize("n", (1, 2, 3, 5))
def test_ring_hooks_cover_every_piece_in_touch_order(n):
    """ring.all_reduce's hooks, which hierarchical pipelines on: ready(a, b) comes for every
    piece, in touch_order, before the ring has changed it; final(a, b) for every piece, in
    touch_order, once it holds the result (rank r gives r+1 everywhere: the sum is known)."""
    import threading

    from collectives.algorithms import ring
    from collectives.algorithms.chunks import chunk_bounds, segments
    from collectives.transport.channel import OpChannel
    from collectives.transport.inproc import InprocWorld

    count, total = 101, n * (n + 1) // 2
    world = InprocWorld(n)
    log, errors = {}, []

    def body(r):
        try:
            t = world.transport(r)
            t.segment_bytes = 8 * 8  # 8 int64s a piece
            buf = np.full(count, r + 1, np.int64)
            ch = OpChannel(
                t, 0, ["all_reduce", count, "<i8", "sum", "ring", None], "all_reduce", 10.0
            ).begin()
            calls = log[r] = []

            def ready(a, b):
                assert (buf[a:b] == r + 1).all(), "touched before ready"
                calls.append(("ready", a, b))

            def final(a, b):
                assert (buf[a:b] == total).all(), "final before it was"
                calls.append(("final", a, b))

            ring.all_reduce(ch, buf, cl.ReduceOp.SUM, ready=ready, final=final)
            ch.finish()
            assert (buf == total).all()
        except BaseException as exc:  # reported below, with the rank
            errors.append((r, exc))

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert not errors, errors
    bounds = chunk_bounds(count, n)
    for r in range(n):
        wants, finals = ring.touch_order(r, n)
        pieces = lambda cs: [p for c in cs for p in segments(*bounds[c], 8)]  # noqa: E731
        assert [c[1:] for c in log[r] if c[0] == "ready"] == pieces(wants)
        assert [c[1:] for c in log[r] if c[0] == "final"] == pieces(finals)


def test_below_leaders_min_bytes_one_leader_per_host_crosses():
    """Below the channel's leaders_min_bytes (1 MiB over ZeroMQ) the schedule has one leader
    per host, at and above it k: on [0,0,1,1], only ranks 0 and 2 send across below it, all
    four at it; the sums are exact either way."""
    hosts = [0, 0, 1, 1]
    count = 1200

    def body(pg):
        x = np.full(count, pg.rank + 1.0, np.float32)
        pg.all_reduce(x, algorithm="hierarchical")
        return x

    for threshold, crossing in ((count * 4 + 1, {0, 2}), (count * 4, {0, 1, 2, 3})):
        tracer = cl.Tracer()

        def wrap(ch, threshold=threshold):
            ch.leaders_min_bytes = threshold
            return tracer.wrap(ch)

        results = cl.simulate(4, body, hosts=hosts, wrappers=[wrap])
        assert all((r == 10.0).all() for r in results), threshold
        senders = {
            e["src"]
            for e in tracer.events
            if e["kind"] == "send" and hosts[e["src"]] != hosts[e["dst"]]
        }
        assert senders == crossing, (threshold, senders)


@pytest.mark.parametrize(
    "hosts,link", [([0, 0, 1, 1], 256), ([0, 0, 1, 1], None), ([0, 0, 0, 0], 256), ([0, 1, 1], 256)]
)
def test_pieces_are_the_link_segment_across_hosts(hosts, link):
    """With a channel's link_segment_bytes (1 MiB over ZeroMQ) below its segment, every
    phase of a hierarchical all_reduce across hosts is cut into pieces of at most that size
    (the host phases feed the rings piece by piece, so all of them); on one host, or without
    it, pieces are segments. The sums are exact either way."""
    count, segment = 1200, 1024  # 4800 B: 1 KiB segments, 256 B link pieces

    def body(pg):
        x = np.full(count, pg.rank + 1.0, np.float32)
        pg.all_reduce(x, algorithm="hierarchical")
        return x

    tracer = cl.Tracer()

    def wrap(ch):
        ch.link_segment_bytes = link
        ch.leaders_min_bytes = 0
        return tracer.wrap(ch)

    results = cl.simulate(len(hosts), body, hosts=hosts, wrappers=[wrap], segment_bytes=segment)
    total = sum(range(1, len(hosts) + 1))
    assert all((r == total).all() for r in results)
    sizes = [e["nbytes"] for e in tracer.events if e["kind"] == "send"]
    spans = len(set(hosts)) > 1
    assert max(sizes) == (link if spans and link else segment), (max(sizes), hosts, link)
