"""Only the job's own processes get in (docs/security.md): each attack tried, refused.

Invariants:
  * a socket without the job's keys never gets a frame into a sum: rank r contributes r+1, and
    every element of every result stays n(n+1)/2 exactly, while the rank logs the refusal;
  * a process without the secret cannot join, and the job goes on;
  * no message of any shape stops the coordinator from serving;
  * a rank that finds MASTER_PORT held by something that cannot prove the secret stops with an
    error saying so, and tells it nothing;
  * junk thrown at a rank leaves its memory within a stated bound;
  * the frame decoder and the coordinator's handlers, fed thousands of generated messages,
    never crash and raise nothing but the library's own errors;
  * without a secret, nothing crosses hosts silently unauthenticated.

Elsewhere: the coordinator's handlers and validation in one process
(tests/unit/membership/test_verdicts.py, test_validate.py); what a red-team pass found --
connection floods, a member gone bad, writers of shared memory, a squatted secret directory, a
half-insecure job -- in tests/scenarios/security/.

Real processes where the claim is about processes (tests/support/security_worker.py); every
one is killed and reaped whatever happens, and every port is bound by whoever uses it (port 0)
and reported, never picked first and bound later.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collectives as cl
from collectives.common import config
from collectives.common import secret as shared
from collectives.common.errors import CollectiveError
from collectives.membership import protocol
from collectives.membership.client import CoordinatorClient
from collectives.membership.server import Coordinator
from collectives.transport import channel, stash, wire
from collectives.common import security
from collectives.transport.wire import DATA, encode_header
from collectives.transport.inproc import InprocWorld
from collectives.transport.zmq.transport import ZmqTransport
from collectives.transport.address import RankAddress

from support.fuzz import values
from support.timing import bound, scaled
from support.security_world import (
    OTHER_SECRET,
    PY,
    SECRET,
    WORKER,
    Procs,
    base_env,
    finish,
    rss_kib,
    start_world,
    wait_json,
)


# --- processes (tests/support/security_world.py) ----------------------------------------------
@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


def forged(seq: int, src: int, index: int, count=8, algorithm="direct") -> list[bytes]:
    """A valid-looking all_reduce frame from `src` (two-frame form): what rank `src` would
    send in op `seq`, carrying 1000 in every element."""
    desc = ["all_reduce", count, np.dtype(np.int64).str, cl.ReduceOp.SUM.value, algorithm, None]
    header = encode_header(DATA, 0, seq, src, index, "exchange", 0, src, desc)
    return [header, np.full(count, 1000, np.int64).tobytes()]


def one_frame(header: bytes, payload: bytes) -> bytes:
    return len(header).to_bytes(2, "little") + header + payload


# --- 1. forged data from sockets without the keys -----------------------------------------------
IDS = (b"0", b"1", b"01", b" 1", b"+1", b"1 ", b"00", b"-0")


def _run_under_flood(procs, tmp_path, endpoints, ids):
    """Let the 2-rank world run its ops to the end (finish) while _flood hammers `endpoints`
    with routing ids `ids`; the flood starts half a second before the first op."""
    ctx = zmq.Context()
    stop, started = threading.Event(), threading.Event()
    flood = threading.Thread(target=_flood, args=(ctx, endpoints, ids, stop, started), daemon=True)
    flood.start()
    try:
        # every forged frame of the first op sent (or its connection full) before that op
        assert started.wait(scaled(10)), "the flood did not get going"
        (tmp_path / "go").touch()
        finish(procs, tmp_path, 2)
    finally:
        stop.set()
        flood.join(10)
        ctx.term()


def _flood(ctx, endpoints, ids, stop: threading.Event, started: threading.Event):
    """DEALERs with each routing id at each endpoint, sending valid-looking frames of the
    next ops, claiming to be either rank, until `stop`; `started` is set after the first
    round."""
    socks = []
    for ep in endpoints:
        for ident in ids:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.ROUTING_ID, ident)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 1000)
            s.connect(ep)
            socks.append(s)
    try:
        while not stop.is_set():
            for seq in range(0, 45):
                for s in socks:
                    for src in (0, 1):
                        for alg in ("direct", "ring"):
                            header, payload = forged(seq, src, 0, algorithm=alg)
                            try:
                                s.send_multipart([header, payload], zmq.NOBLOCK)
                                s.send(one_frame(header, payload), zmq.NOBLOCK)
                            except zmq.Again:
                                pass
            started.set()
            stop.wait(0.05)
    finally:
        for s in socks:
            s.close(linger=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_unkeyed_dealers_never_reach_a_sum(procs, tmp_path, transport):
    """DEALERs without the job's keys, with routing ids b"1", b"01", b" 1", b"+1" and the
    like, send valid-looking frames for every coming op at both ranks' ROUTERs (tcp and
    ipc) while the ranks sum: every result stays exact, and each rank logs the refusal."""
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, COLLECTIVES_TRANSPORT=transport, TEST_ROUNDS=40)
    start_world(procs, tmp_path, 2, "sum", env)
    addrs = [wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}") for r in (0, 1)]
    endpoints = [a["tcp"] for a in addrs] + [a["ipc"] for a in addrs if a.get("ipc")]
    _run_under_flood(procs, tmp_path, endpoints, IDS)
    for r in (0, 1):
        assert "refused a connection" in procs.err(f"rank{r}"), procs.err(f"rank{r}")[-2000:]


@pytest.mark.timeout(120)
def test_insecure_job_takes_only_exact_routing_ids(procs, tmp_path):
    """With COLLECTIVES_INSECURE=1 (no keys anywhere) a routing id is a rank only if it is
    exactly b"%d" % rank: b"01", b" 1", b"+1", b"1 " (all int() == 1) and b"00", b"-0" are
    dropped as unknown senders, logged, and the sums stay exact. The job warns once, on one
    line, that it is unauthenticated."""
    env = base_env(COLLECTIVES_INSECURE=1, COLLECTIVES_TRANSPORT="tcp", TEST_ROUNDS=40)
    start_world(procs, tmp_path, 2, "sum", env)
    addrs = [wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}") for r in (0, 1)]
    inexact = [i for i in IDS if i not in (b"0", b"1")]
    _run_under_flood(procs, tmp_path, [a["tcp"] for a in addrs], inexact)
    for r in (0, 1):
        err = procs.err(f"rank{r}")
        assert "dropped a message from unknown sender" in err, err[-2000:]
        assert err.count("COLLECTIVES_INSECURE=1: sockets are not authenticated") == 1, err


def test_a_connection_is_bound_to_the_rank_it_proved(caplog):
    """A socket holding rank 2's key (a member of the job) that claims routing id b"0" at
    rank 1's ROUTER: its frames are dropped ("authenticated as 2") and never taken."""
    from collectives.transport.zmq import frames as zmq_transport  # its parsing, _warn

    zmq_transport._warn._seen.clear()  # this test's warning is not rate-limited away
    keys = security.JobKeys(SECRET.encode())
    t = ZmqTransport(1, 3, transport="tcp", keys=keys)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.ROUTING_ID, b"0")
    s.setsockopt(zmq.LINGER, 0)
    security.make_client(s, keys, keys.rank(0, 2))
    caplog.set_level(logging.WARNING, logger="collectives")
    try:
        s.connect(t.tcp_endpoint)
        header, payload = forged(0, 0, 0)
        s.send_multipart([header, payload])
        deadline = time.monotonic() + 10
        got = []
        while time.monotonic() < deadline and "authenticated as" not in caplog.text:
            r = t.wait_any(0.1)
            if r is not None:
                got.append(r)
        assert not got, got
        assert (
            "claiming to come from rank 0 over a connection authenticated as b'2'" in caplog.text
        ), caplog.text
    finally:
        s.close(linger=0)
        ctx.term()
        t.close(linger=0)


# --- 2. outsiders that try to join --------------------------------------------------------------
@pytest.mark.timeout(120)
def test_rogue_joiners_are_refused_and_the_job_goes_on(procs, tmp_path):
    """A 2-rank job keyed by a secret. A joiner with another secret is told the coordinator is
    not its job's; one with no secret finds none published for that port and gives up; a raw
    socket asking for the status (which lists missing ranks) or joining as rank 1 gets no
    answer. The job's sums stay exact and the coordinator logs the refusals."""
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_TIMEOUT=20)
    port = start_world(procs, tmp_path, 2, "idle", env)
    for r in (0, 1):
        wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}")
    join_env = base_env(
        COLLECTIVES_COORDINATOR=f"127.0.0.1:{port}", COLLECTIVES_JOIN=1, TEST_TIMEOUT=3
    )
    for name in ("other", "none"):
        (tmp_path / name).mkdir()
    procs.start(
        "other",
        [PY, WORKER, "join", str(tmp_path / "other")],
        dict(join_env, COLLECTIVES_JOB_SECRET=OTHER_SECRET),
    )
    procs.start("none", [PY, WORKER, "join", str(tmp_path / "none")], join_env)
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        raw.connect(f"tcp://127.0.0.1:{port}")
        raw.send(protocol.pack({"t": "status"}))
        raw.send(
            protocol.pack(
                {
                    "t": "join",
                    "rank": 1,
                    "world_size": 2,
                    "mid": "x" * 32,
                    "info": {"tcp": "tcp://127.0.0.1:1", "pid": 1},
                }
            )
        )
        assert not raw.poll(2000), "an unkeyed socket got an answer from the coordinator"
    finally:
        raw.close(linger=0)
        ctx.term()
    for name, needle in (("other", "is not this job's coordinator"), ("none", "published none")):
        assert procs.wait(name, 30) == 0
        rep = wait_json(tmp_path / name / "rankjoiner.json", 5)
        assert rep["error"] and needle in rep["error"], rep
    (tmp_path / "stop").touch()
    finish(procs, tmp_path, 2)
    assert "refused a connection" in procs.err("rank0"), procs.err("rank0")[-2000:]


# --- 3. malformed coordinator messages ----------------------------------------------------------
def _malformed():
    """Messages of every type with a field of the wrong type, range or size, or missing."""
    mid = "m" * 32
    state = {
        "mid": mid,
        "generation": 0,
        "seq": 1,
        "in_op": True,
        "waiting_on": 0,
        "sent": [1, 1],
        "recv": [0, 0],
    }
    info = {"tcp": "tcp://127.0.0.1:1", "pid": 1}
    # Each template is refused even where a "bad" value happens to be valid (a join for a
    # rank out of range, a status is harmless), so that the malformed messages never join.
    good = {
        "join": {"rank": 5, "world_size": 2, "mid": mid, "info": info},
        "status": {},
        "beat": state,
        "state": state,
        "progress": state,
        "diagnose": state,
        "outcome": dict(state, timeout=1.0),
        "leave": {"mid": mid},
        "join_request": {"mid": mid},
        "reconstruct": {"mid": mid, "generation": 0, "timeout": 1.0},
        "address": {"mid": mid, "generation": 1, "info": info},
    }
    bad_values = [
        None,
        [1, 2],
        {"a": 1},
        "x" * 5000,
        -1,
        2**64 - 1,
        1.5,
        True,
        b"\x00" * 10,
        "",
        float("nan"),
        float("inf"),
    ]
    out = [
        # the two of the issue: a join whose mid is a list; a diagnose with non-integer fields
        {"t": "join", "rank": 1, "world_size": 2, "mid": ["a", "b"], "info": info},
        dict(state, t="diagnose", generation="0", seq="1", waiting_on="x", sent="y"),
        {"t": "nonsense"},
        {"t": 7},
        {"no": "type"},
        {"t": "beat"},
        {"t": "join", "rank": 1, "world_size": 2, "mid": mid, "info": {"tcp": 1, "pid": 1}},
        {
            "t": "join",
            "rank": 1,
            "world_size": 2,
            "mid": mid,
            "info": {f"k{i}": i for i in range(100)},
        },
        dict(state, t="diagnose", sent=list(range(5)), waiting_on=99),
        dict(state, t="beat", done=[[1, 2, 3]]),
    ]
    for kind, fields in good.items():
        for name in fields:
            for v in bad_values:
                out.append(dict(fields, t=kind, **{name: v}))
            out.append({k: x for k, x in dict(fields, t=kind).items() if k != name})
    return out


@pytest.mark.timeout(120)
def test_malformed_messages_of_every_kind_leave_the_coordinator_serving():
    """Through its socket, from a member's key (the only one that can reach the handlers):
    every malformed message is dropped with a log line (a request that waits for an answer is
    told what is wrong), and the coordinator then forms a 2-rank group as if nothing happened,
    and survives the same again once the group exists."""
    keys = security.JobKeys(SECRET.encode())
    coord = Coordinator(
        "127.0.0.1", 0, 2, heartbeat_interval=0.1, heartbeat_timeout=5.0, keys=keys
    ).start()
    ctx = zmq.Context()
    bad = ctx.socket(zmq.DEALER)
    bad.setsockopt(zmq.LINGER, 0)
    security.make_client(bad, keys)
    bad.connect(f"tcp://127.0.0.1:{coord.port}")
    clients = []
    try:
        msgs = _malformed()
        for m in msgs:
            bad.send(msgpack.packb(m, use_bin_type=True))
        for junk in (b"", b"\xc1", b"\x92\x01", msgpack.packb([1, 2, 3]), b"\xff" * 1000):
            bad.send(junk)
        bad.send_multipart([b"two", b"frames"])
        # the join with a list for mid is answered with what is wrong with it
        reply = None
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline and reply is None:
            if bad.poll(200):
                r = msgpack.unpackb(bad.recv())
                if r and r["t"] == "error" and "join.mid" in r["message"]:
                    reply = r
        assert reply is not None
        assert coord._thread.is_alive()

        infos = [None, None]

        def join(r):
            c = CoordinatorClient(
                f"127.0.0.1:{coord.port}", r, 2, heartbeat_interval=0.1, keys=keys
            )
            clients.append(c)
            infos[r] = c.join(RankAddress(tcp=f"tcp://127.0.0.1:{10000 + r}"), 20)

        threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert infos[0] and infos[1] and infos[0][0] == 0, infos
        for c in clients:
            c.start_heartbeat(None)
        for m in msgs:  # again, now with a formed group (different handler paths)
            bad.send(msgpack.packb(m, use_bin_type=True))
        # then a status request on the same connection: served after all of them
        bad.send(msgpack.packb({"t": "status"}, use_bin_type=True))
        status = None
        deadline = time.monotonic() + scaled(10)
        while status is None:
            assert time.monotonic() < deadline, "no answer to a status request after them"
            if bad.poll(200):
                r = msgpack.unpackb(bad.recv())
                status = r if r and r["t"] == "status" else None
        assert coord._thread.is_alive()
        assert coord.members is not None and len(coord._live()) == 2, coord.failed
        status = clients[0].status(5.0)
        assert isinstance(status, protocol.StatusAnswer) and status.world_size == 2
    finally:
        bad.close(linger=0)
        ctx.term()
        for c in clients:
            c.close()
        coord.stop()


# --- 4. port squatting --------------------------------------------------------------------------
def _silent_listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("squatter", ["zmq", "tcp"])
def test_a_squatted_master_port_gives_a_clear_error(procs, tmp_path, squatter):
    """Something else holds MASTER_PORT: a plain ZeroMQ ROUTER (what a squatter would run to
    collect the members' addresses), or a TCP listener that never speaks. Both ranks stop with
    an error saying the process there is not this job's coordinator, and the squatter
    receives not one message."""
    ctx = zmq.Context()
    router = listener = None
    if squatter == "zmq":
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
    else:
        listener = _silent_listener()
        port = listener.getsockname()[1]
        conns = []
        threading.Thread(
            target=lambda: [conns.append(listener.accept()) for _ in range(64)], daemon=True
        ).start()
    try:
        env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_TIMEOUT=30)
        for r in (0, 1):
            procs.start(
                f"rank{r}",
                [PY, WORKER, "sum", str(tmp_path)],
                dict(
                    env, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
                ),
            )
        for r in (0, 1):
            procs.wait(f"rank{r}", 60)
            rep = wait_json(tmp_path / f"rank{r}.json", 5)
            assert not rep["ok"] and "is not this job's coordinator" in rep["error"], rep
            assert "MASTER_PORT" in rep["error"], rep
        if router is not None:
            assert not router.poll(500), "the squatter received a message"
    finally:
        if router is not None:
            router.close(linger=0)
        if listener is not None:
            listener.close()
        ctx.term()


# --- 5. junk at a rank --------------------------------------------------------------------------


def _throw_junk(endpoint: str) -> int:
    """Throw more than 100 MiB at a rank's ROUTER, within about 15 s: 40 MiB of raw bytes
    over TCP (reconnecting whenever the rank drops the connection, moving on when it stops
    reading), then ZeroMQ frames from sockets without keys: one of 64 MiB (over any size a
    rank takes) and 64 of 1 MiB with a routing id that is no rank. Returns the raw bytes
    the kernel took from us."""
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    taken, tried = 0, 0
    block = os.urandom(1 << 20)
    deadline = time.monotonic() + 10
    while tried < (40 << 20) and time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=0.5) as s:
                while tried < (40 << 20):
                    tried += len(block)
                    taken += s.send(block)
        except OSError:
            pass  # reset, or a stall: the rank is not taking any more
    ctx = zmq.Context()
    for ident, size, count in ((b"0", 64 << 20, 1), (b"junk", 1 << 20, 64)):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, ident)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect(endpoint)
        frame = b"\x00" * size
        for _ in range(count):
            try:
                s.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass
        s.close(linger=2000)
    ctx.term()
    return taken


@pytest.mark.timeout(150)
@pytest.mark.parametrize("insecure,bound_mib", [(False, 32), (True, 96)])
def test_junk_at_a_rank_leaves_its_memory_bounded(procs, tmp_path, insecure, bound_mib):
    """100 MiB of junk thrown at an idle rank's ROUTER (raw TCP, oversized and undersized
    ZeroMQ frames): its RSS grows by less than `bound_mib` MiB, and it then sums exactly.
    Keyed, all of it is refused at the handshake; insecure (no keys), a frame over a segment
    drops its connection, and the rest wait in a queue of at most 64 MiB per connection
    (RCV_BUFFER) until the rank reads and drops them."""
    env = base_env(
        COLLECTIVES_TRANSPORT="tcp",
        TEST_TIMEOUT=30,
        **({"COLLECTIVES_INSECURE": 1} if insecure else {"COLLECTIVES_JOB_SECRET": SECRET}),
    )
    start_world(procs, tmp_path, 2, "idle", env)
    addrs = [wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}") for r in (0, 1)]
    pid = addrs[1]["pid"]
    before = settled_rss_kib(pid)
    taken = _throw_junk(addrs[1]["tcp"])
    assert taken >= 8 << 20, f"only {taken} bytes of junk reached rank 1's socket"
    # the rank reads and drops what its queue held: until its memory is back within the bound
    # (a rank that keeps the junk never gets there)
    deadline = time.monotonic() + scaled(10)
    while (after := rss_kib(pid)) - before >= bound_mib << 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"raw bytes taken {taken >> 20} MiB; rank 1 RSS {before} -> {after} KiB")
    (tmp_path / "stop").touch()
    finish(procs, tmp_path, 2)
    grew = (after - before) / 1024
    assert grew < bound_mib, f"rank 1's RSS grew by {grew:.1f} MiB ({before} -> {after} KiB)"


def settled_rss_kib(pid: int) -> int:
    """Its VmRSS once it stopped growing (the start-up's first ops done): two reads 0.2 s
    apart within 1 MiB, within a scaled 10 s."""
    deadline = time.monotonic() + scaled(10)
    last = rss_kib(pid)
    while True:
        time.sleep(0.2)
        now = rss_kib(pid)
        if abs(now - last) < 1024 or time.monotonic() > deadline:
            return now
        last = now


# --- 6. fuzzing the decoders and handlers -------------------------------------------------------


def _near_header():
    """Headers that are nearly ours: each field drawn from a type that fits or does not."""
    small = st.integers(-3, 70)
    return st.tuples(
        st.sampled_from([wire.MAGIC, wire.MAGIC, 0]),
        small,
        small,
        small,
        small,
        small,
        st.one_of(st.text(max_size=5), values),
        small,
        small,
        st.one_of(st.none(), values, st.just(["all_reduce", 8, "<i8", "sum", "direct", None])),
        st.one_of(st.floats(0, 2e9), values),
    ).map(list)


class _Frame:
    """What ZmqTransport.frames.parse reads of a zmq.Frame: bytes, buffer, get()."""

    def __init__(self, data: bytes, props: dict):
        self.bytes, self.buffer, self._props = data, memoryview(data), props

    def get(self, name):
        if name not in self._props:
            raise zmq.ZMQError(zmq.EINVAL)
        return self._props[name]


@pytest.fixture(scope="module")
def keyed_transport():
    t = ZmqTransport(1, 3, transport="tcp", keys=security.JobKeys(SECRET.encode()))
    yield t
    t.close(linger=0)


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(
    raw=st.one_of(
        st.binary(max_size=200), values.map(msgpack.packb), _near_header().map(msgpack.packb)
    )
)
def test_fuzz_decode_header(raw):
    """decode_header never raises, and what it returns has every field of the right type."""
    h = wire.decode_header(raw)
    if h is not None:
        ints = (h.type, h.generation, h.seq, h.src, h.number, h.step, h.chunk)
        assert all(type(x) is int for x in ints)
        assert isinstance(h.phase, str) and type(h.sent) is float
        assert h.desc is None or isinstance(h.desc, wire.Descriptor)
        assert (h.abort is not None) == (h.type in (wire.ABORT, wire.P2P_ABORT))
        if h.abort is not None:
            a = h.abort
            assert isinstance(a.kind, str) and isinstance(a.message, str)
            assert a.culprit is None or type(a.culprit) is int


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(
    ident=st.sampled_from([b"0", b"1", b"2", b"01", b" 1", b"+1", b"wake", b"", b"3"]),
    uid=st.sampled_from([None, "0", "1", "2", "x"]),
    parts=st.lists(
        st.one_of(
            st.binary(max_size=64),
            _near_header().map(msgpack.packb),
            st.just(b"\xff\xffcollectives-shm-ready"),
        ),
        max_size=3,
    ),
    shape=st.integers(0, 2),
)
def test_fuzz_zmq_parse_and_admit(keyed_transport, ident, uid, parts, shape):
    """ZmqTransport.frames.parse takes a frame only from an exact rank routing id that matches the
    connection's User-Id, and never raises; what it takes, OpChannel.admit vets without
    raising anything but the library's own errors."""
    t = keyed_transport
    props = {} if uid is None else {"User-Id": uid}
    if shape == 1 and parts:  # the one-frame form: length, header, payload
        parts = [len(parts[0]).to_bytes(2, "little") + b"".join(parts)]
    frames = [_Frame(ident, props)] + [_Frame(p, props) for p in parts]
    got = t.frames.parse(frames)
    if got is None:
        return
    src, header, payload = got
    assert src in (0, 2) and uid == ident.decode()
    ch = channel.OpChannel(t, 0, ["all_reduce", 8, "<i8", "sum", "direct", None], "all_reduce", 1.0)
    try:
        ch.admit(src, header)
    except cl.CollectiveError:
        pass


# --- 7. bounded stash, segmented messages --------------------------------------------------------
@pytest.mark.timeout(60)
def test_frames_too_far_ahead_fail_the_op_naming_their_sender(monkeypatch):
    """Rank 1 waits for rank 2 in a receive while rank 0 runs reduce after reduce at it: once
    rank 0 is more ops ahead than the stash allows, rank 1's op fails naming rank 0."""
    world = InprocWorld(3)
    pgs = [cl.ProcessGroup(world.transport(r), timeout=5.0) for r in range(3)]
    for pg in pgs:
        pg.transport.early.max_ahead = 4
    errors = {}

    def rank1():
        try:
            pgs[1].recv(np.zeros(4), src=2, timeout=5.0)
        except CollectiveError as exc:
            errors[1] = exc

    th = threading.Thread(target=rank1, daemon=True)
    th.start()
    for _ in range(6):
        # rank 0 only sends (a reduce's leaf in a 3-rank tree rooted at 1): it runs ahead
        pgs[0].transport.post(
            1,
            encode_header(DATA, 0, _, 0, 0, "reduce", 0, 0, ["reduce", 4, "<f8", "sum", "tree", 1]),
            np.zeros(4),
            False,
        )
    th.join(10)
    try:
        assert 1 in errors, "rank 1's receive did not fail"
        assert "from rank 0" in str(errors[1]) and "ahead" in str(errors[1]), errors[1]
        assert errors[1].peer == 0
    finally:
        for pg in pgs:
            pg.destroy()


def test_stash_counts_bytes():
    s = stash.EarlyFrames(max_bytes=1000, max_ahead=10)
    s.put(0, 1, 0, [0], b"x" * 600, 1)
    with pytest.raises(CollectiveError, match="from rank 1: more than 1000 bytes"):
        s.put(0, 1, 0, [0], b"x" * 600, 1)
    s[(1, 0)].popleft()
    assert s.nbytes == 0
    s.put(0, 1, 0, [0], b"x" * 600, 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ["direct", "naive", "ring", "tree"])
def test_no_message_is_larger_than_a_segment(algorithm):
    """Every algorithm, and send/recv, over ZeroMQ (which refuses larger messages) with
    64 KiB segments and a 1 MiB + 3 element buffer: exact results, and no payload posted is
    larger than a segment."""
    seg = 64 << 10
    ts = [ZmqTransport(r, 2, transport="tcp", segment_bytes=seg) for r in range(2)]
    infos = [t.address_info() for t in ts]
    sizes = []
    for t in ts:
        t.connect(infos)
        post = t.post

        def recording(peer, header, payload, zero_copy, post=post):
            sizes.append(memoryview(payload).nbytes)
            return post(peer, header, payload, zero_copy)

        t.post = recording
    pgs = [cl.ProcessGroup(t, timeout=20) for t in ts]
    n = (1 << 17) + 3  # float64: just over 1 MiB
    out = [None, None]

    def body(r):
        x = np.full(n, r + 1.0)
        pgs[r].all_reduce(x, algorithm=algorithm)
        y = np.arange(n, dtype=np.float64)
        if r == 0:
            pgs[0].send(y, dst=1)
        else:
            z = np.zeros(n)
            pgs[1].recv(z, src=0)
            assert (z == y).all()
        out[r] = x

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(40)
    try:
        assert all(o is not None and (o == 3.0).all() for o in out), out
        assert max(sizes) <= seg, max(sizes)
    finally:
        for pg in pgs:
            pg.destroy()


# --- 8. the secret: where it comes from, where it must not go -------------------------------------
def test_hkdf_sha256_matches_rfc5869():
    okm = security.hkdf_sha256(
        bytes([0x0B] * 22), bytes(range(0xF0, 0xFA)), 42, salt=bytes(range(0x0D))
    )
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_keys_differ_by_role_rank_generation_and_secret():
    a, b = security.JobKeys(SECRET.encode()), security.JobKeys(OTHER_SECRET.encode())
    pubs = {
        a.server.public,
        a.member.public,
        a.rank(0, 0).public,
        a.rank(0, 1).public,
        a.rank(1, 0).public,
        b.server.public,
    }
    assert len(pubs) == 6
    assert zmq.curve_public(a.server.secret) == a.server.public
    assert SECRET not in repr(a)


def test_secret_settings_are_checked(monkeypatch, tmp_path):
    for k in ("COLLECTIVES_JOB_SECRET", "COLLECTIVES_JOB_SECRET_FILE", "COLLECTIVES_INSECURE"):
        monkeypatch.delenv(k, raising=False)
    assert config.job_secret() is None and not config.insecure()
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", "short")
    with pytest.raises(ValueError, match="COLLECTIVES_JOB_SECRET must hold 16"):
        config.job_secret()
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", SECRET)
    assert config.job_secret() == SECRET.encode()
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    f.chmod(0o644)
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET_FILE", str(f))
    with pytest.raises(ValueError, match="both set"):
        config.job_secret()
    monkeypatch.delenv("COLLECTIVES_JOB_SECRET")
    with pytest.raises(ValueError, match="chmod 600"):
        config.job_secret()
    f.chmod(0o600)
    assert config.job_secret() == SECRET.encode()
    monkeypatch.setenv("COLLECTIVES_INSECURE", "yes")
    with pytest.raises(ValueError, match="COLLECTIVES_INSECURE"):
        config.insecure()
    monkeypatch.setenv("COLLECTIVES_INSECURE", "1")
    with pytest.raises(ValueError, match="both set"):
        security.from_environment()


def test_shared_secret_files_are_private_and_checked(monkeypatch, tmp_path):
    """A published secret is a 0600 file in a 0700 directory of this user's; a file others
    may read is refused; one whose writer is gone is stale (not used)."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    path = Path(shared.publish("unit-test", SECRET.encode()))
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    assert shared.read("unit-test") == SECRET.encode()
    path.chmod(0o644)
    with pytest.raises(ValueError, match="refusing"):
        shared.read("unit-test")
    path.chmod(0o600)
    doc = json.loads(path.read_text())
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    path.write_text(json.dumps(dict(doc, pid=dead.pid)))
    assert shared.read("unit-test") is None
    path.parent.chmod(0o755)  # open to others: passed over, never read from
    assert shared.directory() != str(path.parent)
    assert shared.read("unit-test") is None
    path.parent.chmod(0o700)
    assert shared.is_local("127.0.0.1") and shared.is_local("localhost")
    assert not shared.is_local("192.0.2.1")  # TEST-NET-1: never this host


@pytest.mark.timeout(30)
def test_no_secret_and_a_coordinator_on_another_host_refuses(monkeypatch):
    for k in (
        "COLLECTIVES_JOB_SECRET",
        "COLLECTIVES_JOB_SECRET_FILE",
        "COLLECTIVES_INSECURE",
        "COLLECTIVES_COORDINATOR",
    ):
        monkeypatch.delenv(k, raising=False)
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match="on another host and no job secret"):
        cl.init_process_group(
            rank=1, world_size=2, master_addr="192.0.2.1", master_port=29400, timeout=10
        )
    assert time.monotonic() - t0 < bound(2.0, below=10.0)  # refused, not timed out


@pytest.mark.timeout(60)
def test_without_a_secret_one_hosts_ranks_share_one_privately(procs, tmp_path):
    """No secret anywhere: rank 0 (hosting the coordinator) publishes one in this user's
    private directory, rank 1 reads it there, the job runs keyed, and the file is gone when
    rank 0 is."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = base_env(XDG_RUNTIME_DIR=run, TEST_ROUNDS=3)
    port = start_world(procs, tmp_path, 2, "sum", env)
    for r in (0, 1):
        wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}")
    f = run / "collectives" / f"coordinator-{port}.secret"
    assert f.exists() and f.stat().st_mode & 0o777 == 0o600
    (tmp_path / "go").touch()
    finish(procs, tmp_path, 2)
    assert not f.exists()


@pytest.mark.timeout(60)
def test_standalone_coordinator_needs_a_secret_or_insecure(procs, tmp_path):
    """Without a secret it refuses to start; with --insecure it serves, after one warning
    line; with a secret it serves keyed. (Each binds a free port itself and prints it.)"""
    argv = [
        PY,
        "-m",
        "collectives.coordinator",
        "--port",
        "0",
        "--world-size",
        "2",
        "--host",
        "127.0.0.1",
    ]
    procs.start("bare", argv, base_env())
    assert procs.wait("bare", 30) == 2
    assert "no job secret" in procs.err("bare")
    for name, extra, env in (
        ("insecure", ["--insecure"], base_env()),
        ("keyed", [], base_env(COLLECTIVES_JOB_SECRET=SECRET)),
    ):
        procs.start(name, argv + extra, env)
        procs.wait_line(name, r"listening on 127\.0\.0\.1:(\d+)", 30)
        procs.procs[name].send_signal(signal.SIGTERM)
        assert procs.wait(name, 30) == 0
        warned = procs.err(name).count("sockets are not authenticated")
        assert warned == (1 if name == "insecure" else 0), procs.err(name)


@pytest.mark.timeout(90)
def test_the_launcher_hands_its_workers_a_secret(procs, tmp_path):
    """No secret in the launcher's environment: it makes one, the workers get it (and only
    through their environment), and the job runs keyed."""
    script = tmp_path / "w.py"
    script.write_text(
        "import os, numpy as np, collectives as cl\n"
        "pg = cl.init_process_group(timeout=20)\n"
        "s = os.environ.get('COLLECTIVES_JOB_SECRET', '')\n"
        "x = np.ones(4); pg.all_reduce(x)\n"
        "print('SECRET', len(s), pg.transport.keys.origin, int(x[0]), flush=True)\n"
        "pg.destroy()\n"
    )
    procs.start(
        "launch",
        [PY, "-m", "collectives.launch", "--nproc", "2", "--timeout", "60", str(script)],
        base_env(),
    )
    assert procs.wait("launch", 80) == 0, procs.err("launch")[-2000:]
    out = (tmp_path / "launch.out").read_text()
    lines = re.findall(r"SECRET (\d+) (\w+) (\d+)", out)
    assert len(lines) == 2 and all(
        int(n) == 64 and o == "environment" and v == "2" for n, o, v in lines
    ), out


# --- 9. shared memory ---------------------------------------------------------------------------
def _shm_pair():
    keys = security.JobKeys(SECRET.encode())
    ts = [ZmqTransport(r, 2, transport="shm", keys=keys) for r in range(2)]
    infos = [t.address_info() for t in ts]
    for t in ts:
        t.connect(infos)
    return ts


def test_a_peers_arena_is_sealed_and_mapped_read_only():
    """A receiver maps the sender's slots read-only (only the flag page read-write), and the
    memfd is sealed: neither the receiver nor anyone else can shrink or grow it."""
    ts = _shm_pair()
    try:
        peer = ts[1].peer_arenas[0]
        assert not peer.data.flags.writeable
        with pytest.raises((ValueError, TypeError)):
            peer.data[0] = 1
        with pytest.raises(TypeError):
            peer.data_mm[0] = 1
        peer.flags[0] = 0  # the flag page is writable
        info = ts[0].sender.arena.describe()
        with open(f"/proc/{info.pid}/fd/{info.fd}", "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            for new in (0, size // 2, size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(f.fileno(), new)
    finally:
        for t in ts:
            t.close(linger=0)


def test_slot_frames_are_taken_only_from_the_arena_owner_over_ipc(caplog):
    """A frame naming a slot of rank 0's arena is taken only if its connection comes over ipc
    from rank 0's own process (the kernel's peer credentials); the same frame from another
    pid, or over tcp, is dropped and logged, and its slot is left alone."""
    from collectives.transport.zmq import frames as zmq_transport  # its parsing, _warn

    zmq_transport._warn._seen.clear()
    ts = _shm_pair()
    t = ts[1]
    caplog.set_level(logging.WARNING, logger="collectives")
    try:
        header = encode_header(DATA, 0, 0, 0, 0, "x", 0, 0, None)
        # one frame: 2-byte header length with the slot flag, header, slot 0, 8 bytes
        data = (
            (len(header) | 0x8000).to_bytes(2, "little")
            + header
            + (0).to_bytes(4, "little")
            + (8).to_bytes(8, "little")
        )
        owner = ts[0].sender.arena.describe().pid
        for address, taken in (
            (f"localhost:0:0:{owner}", True),
            (f"localhost:0:0:{owner + 1}", False),
            ("127.0.0.1", False),
        ):
            props = {"User-Id": "0", "Peer-Address": address}
            got = t.frames.parse([_Frame(b"0", props), _Frame(data, props)])
            assert (got is not None) == taken, address
            if got is not None:
                shm_free = got[2]
                assert shm_free.nbytes == 8
                shm_free.free_slot()
        assert "not from its arena's owner" in caplog.text
    finally:
        for x in ts:
            x.close(linger=0)
