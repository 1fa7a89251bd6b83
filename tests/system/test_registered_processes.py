"""Registered buffers (pg.alloc, cl.empty; transport/zmq/registered.py): a same-host peer reads the
sender's buffer in place instead of the sender copying it into a slot first.

The invariant everywhere: an op on registered buffers gives exactly the bytes of the same op on
ordinary buffers, on every rank, and it really lent (the lend counter moved) -- so each test
fails without the lending path. In-process tests run one thread per rank over real
ZmqTransports (as test_shm.py); the death test runs real processes.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest

import collectives as cl
from collectives.transport.zmq import registered, shm
from support.cluster import Cluster
from support.timing import scaled
from test_shm import make_pair, run_ranks

pytestmark = pytest.mark.timeout(60)
SEG = 1 << 18  # 256 KiB segments: a 1 MiB chunk is several lends


@pytest.fixture
def groups():
    made = []

    def make(n=2, **kw):
        gs = [cl.ProcessGroup(t, timeout=10.0) for t in make_pair(n=n, segment_bytes=SEG, **kw)]
        made.extend(gs)
        return gs

    yield make
    for g in made:
        g.destroy()


def data(r, count, dtype=np.float32):
    # Values whose float sums depend on the order of addition: a recomputed chunk would show.
    return (np.sin(np.arange(count) * (r + 1.7)) * 10 ** (r % 3)).astype(dtype)


def every_collective(g, r, n, alloc):
    """Each collective once on buffers from `alloc`; the results, in order."""
    count = 2 * (1 << 16) * n  # ring chunks of 512 KiB: two 256 KiB segments
    out = []
    for algorithm, op in (
        ("ring", cl.ReduceOp.SUM),
        ("ring", cl.ReduceOp.AVG),
        ("tree", cl.ReduceOp.AVG),
        ("naive", cl.ReduceOp.SUM),
        ("direct", cl.ReduceOp.SUM),
    ):  # direct never lends (LENDING)
        x = alloc(count)
        x[:] = data(r, count)
        g.all_reduce(x, op=op, algorithm=algorithm)
        out.append(x.copy())
    x = alloc(count)
    x[:] = data(r, count)
    o = alloc(count // n)
    g.reduce_scatter(o, x)
    out.append(o.copy())
    o = alloc((n, count // n))
    g.all_gather(o, x[: count // n])
    out.append(o.copy())
    x[:] = data(r, count)
    g.broadcast(x, src=n - 1)
    out.append(x.copy())
    x[:] = data(r, count)
    g.reduce(x, dst=0)
    out.append(x.copy() if r == 0 else None)
    return out


def same(a, b):
    return all(
        (x is None and y is None) or (x.dtype == y.dtype and x.tobytes() == y.tobytes())
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_on_registered_buffers_gives_the_plain_bytes(groups, n):
    """For all_reduce (ring SUM and AVG, tree, naive, direct), reduce_scatter, all_gather,
    broadcast and reduce: registered buffers on every rank, then (2 ranks) on rank 0 only, give
    the bytes of ordinary buffers, and every rank's all_reduce result is the same bytes."""
    gs = groups(n=n)

    def body(r, g):
        plain = every_collective(g, r, n, lambda s: np.zeros(s, np.float32))
        lent0 = g.transport.sender.lender.sent
        reg = every_collective(g, r, n, lambda s: g.alloc(s, np.float32))
        lent = g.transport.sender.lender.sent - lent0
        mixed = (
            plain
            if n > 2
            else every_collective(  # mixed: at 2 ranks (time)
                g,
                r,
                n,
                (lambda s: g.alloc(s, np.float32))
                if r == 0
                else (lambda s: np.zeros(s, np.float32)),
            )
        )
        assert not g.transport.sender.lender.outstanding(), "a lend was never handed back"
        return plain, reg, mixed, lent

    out = run_ranks(gs, body)
    for r, (plain, reg, mixed, lent) in enumerate(out):
        assert lent >= 10, (r, lent)
        assert same(plain, reg), f"rank {r}: registered buffers gave other bytes"
        assert same(plain, mixed), f"rank {r}: mixed registered/plain gave other bytes"
        assert same(plain[:5], out[0][0][:5]), f"rank {r}'s all_reduce differs from rank 0's"
    assert_every_slot_free(gs)


def assert_every_slot_free(gs):
    for g in gs:
        assert (g.transport.sender.arena.flags == 0).all()


def test_torch_variant_and_data_parallel_buckets(groups):
    """cl.empty(like="torch") and pg.alloc_tensor give CPU tensors in registered memory that
    all_reduce in place (rank r gives r+1; the sum is 3); DataParallel's buckets are registered
    and it averages the gradients to the same bits as with ordinary buckets."""
    torch = pytest.importorskip("torch")
    gs = groups()
    torch.manual_seed(0)
    init = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).state_dict()

    def body(r, g):
        t = cl.empty((512, 512), torch.float64, pg=g, like="torch")  # 2 MiB: ring
        u = g.alloc_tensor(1 << 17)
        assert t.dtype == torch.float64 and u.dtype == torch.float32
        assert cl.is_registered(t) and g.is_registered(u) and not cl.is_registered(t.clone())
        t.fill_(r + 1)
        u.fill_(r + 1)
        lent = g.transport.sender.lender.sent
        g.all_reduce(t)
        g.all_reduce(u)
        assert g.transport.sender.lender.sent > lent
        assert bool((t == 3).all() and (u == 3).all())
        grads = []
        for reg in (True, False):
            m = torch.nn.Sequential(
                torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
            )
            m.load_state_dict(init)  # not manual_seed: the RNG is shared by the rank threads
            dp = cl.DataParallel(m, g, registered=reg)
            assert [g.is_registered(b.flat) for b in dp.buckets] == [reg] * len(dp.buckets)
            gen = torch.Generator().manual_seed(r)
            m(torch.randn(8, 64, generator=gen)).square().sum().backward()
            dp.sync_gradients()
            grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
        assert torch.equal(grads[0], grads[1])
        return grads[0]

    out = run_ranks(gs, body)
    assert torch.equal(out[0], out[1])


def test_lends_of_an_aborted_op_come_back(groups):
    """Ranks that call different things (float32 vs int32, same bytes) raise
    CollectiveMismatch after lending each other their buffers; the lent regions are handed
    back, not lost: after one more op on the same buffers no lend is outstanding, and its sum
    is exact (rank r gives r+1; the sum is 3)."""
    gs = groups()

    def body(r, g):
        x = g.alloc(1 << 18, np.float32 if r == 0 else np.int32)
        x[:] = 1
        with pytest.raises(cl.CollectiveMismatch):
            g.all_reduce(x, algorithm="ring")
        y = g.alloc(1 << 18, np.float64)
        y[:] = r + 1
        g.all_reduce(y, algorithm="ring")
        return y, g.transport.sender.lender.sent

    out = run_ranks(gs, body)
    assert all((y == 3.0).all() and sent > 0 for y, sent in out)
    assert all(g.transport.sender.lender.outstanding() == 0 for g in gs)


class _Frame:
    """What ZmqTransport.frames.parse reads of a zmq.Frame (as in test_security.py)."""

    def __init__(self, data: bytes, props: dict):
        self.bytes, self.buffer, self._props = data, memoryview(data), props

    def get(self, name):
        return self._props[name]


def test_lend_frames_are_taken_only_from_the_owner_over_ipc():
    """A frame lending a region of rank 0's registered buffer is taken (as a read-only view
    of exactly that region) only if it comes over ipc from rank 0's own process; from another
    pid or over tcp it is dropped, and so is one naming a region outside the buffer."""
    from collectives.transport.wire import DATA, encode_header

    ts = make_pair(mode="shm")
    try:
        x = registered.allocate(1 << 16, np.uint8)
        x[:] = 5
        header = encode_header(DATA, 0, 0, 0, 0, "x", 0, 0, None)
        tail, _ = ts[0].sender.lender.lend(x[4096:8192], 1)
        fd, size, offset, nbytes, index, name = registered._LEND.unpack(tail)
        outside = registered._LEND.pack(fd, size, size - 8, 16, index, name)
        owner = ts[0].sender.arena.describe().pid
        for address, body, taken in (
            (f"localhost:0:0:{owner}", tail, True),
            (f"localhost:0:0:{owner + 1}", tail, False),
            ("127.0.0.1", tail, False),
            (f"localhost:0:0:{owner}", outside, False),
        ):
            props = {"User-Id": "0", "Peer-Address": address}
            data = (len(header) | 0x4000).to_bytes(2, "little") + header + body
            got = ts[1].frames.parse([_Frame(b"0", props), _Frame(data, props)])
            assert (got is not None) == taken, address
            if got is not None:
                assert got[2].nbytes == 4096 and (got[2] == 5).all()
                assert not got[2].flags.writeable
                shm.free_slot(got[2])
        assert ts[0].sender.lender.outstanding() == 0
    finally:
        for t in ts:
            t.close(linger=0)


@pytest.mark.timeout(60)
def test_sigkill_mid_op_with_registered_buffers(tmp_path):
    """Rank 2 is SIGKILLed in the all-gather of an all_reduce on registered 4 MiB buffers;
    the survivors raise PeerFailure, reconstruct, and go on with the *same* buffers, still
    registered and lent in the new group, with exact sums; the dead rank's pool is mapped
    nowhere any more (the kernel frees it; nothing ever had a name under /dev/shm)."""
    c = Cluster(
        3,
        tmp_path,
        heartbeat_timeout=scaled(1.0),
        worker_args=["--algorithm", "ring", "--count", str(1 << 20), "--registered"],
        env={"COLLECTIVES_FAULTS": "kill:2@op=5,phase=all-gather"},
    )
    try:
        c.start()
        pools = {
            c.wait_for(
                lambda e, n=n: e["proc"] == n and e["event"] == "registered", 20, f"{n} allocating"
            )["pools"][0]: n
            for n in ("w0", "w1", "w2")
        }
        died = c.wait_for(lambda e: e["event"] == "exit" and e["proc"] == "w2", 30, "rank 2")
        assert died["code"] == -signal.SIGKILL
        c.wait_steps(["w0", "w1"], ws=2, timeout=15, after=died["t"])
        for name in ("w0", "w1"):
            step = c.wait_for(
                lambda e, name=name: (
                    e["proc"] == name and e["event"] == "step" and e["ws"] == 2 and e["lent"] > 0
                ),
                15,
                f"{name} lending again",
            )
            maps = open(f"/proc/{step['pid']}/maps").read()
            dead = [p for p, n in pools.items() if n == "w2"]
            assert dead and not any(p in maps for p in dead), f"{name} still maps w2's pool"
    finally:
        c.close()
