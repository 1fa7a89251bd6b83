"""What to paste in a bug report: `python -m collectives.info`.

Versions of everything the library stands on, what this machine can actually do (each
capability is tried, not guessed: a CURVE handshake, an ipc socket, a shared-memory arena
mapped and read back), the network interfaces and the one the library would bind, every
variable of common/config.py with its value in effect and its default, and the sizes at which
all_reduce's "auto" switches algorithm.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
import os
import platform
import socket
import tempfile
import uuid

import numpy as np
import zmq

from ..common import config
from ..group import tuning
from ..membership.failslow import Thresholds
from ..membership.slownic import NicThresholds
from ..transport.zmq.addresses import interface_address
from ..transport.zmq.transport import ABSTRACT_IPC, ipc_path


def versions() -> list[tuple[str, str]]:
    import msgpack

    rows = [
        ("python", platform.python_version()),
        ("platform", platform.platform()),
        ("numpy", np.__version__),
        ("pyzmq", zmq.__version__),
        ("libzmq", zmq.zmq_version()),
        ("msgpack", ".".join(map(str, msgpack.version))),
    ]
    # From the installed metadata: importing torch to ask would take seconds.
    for name, missing in (
        ("collectives", "not installed (a source tree)"),
        ("torch", "not installed (the torch backend and trainer need it)"),
    ):
        try:
            rows.append((name, version(name)))
        except PackageNotFoundError:
            rows.append((name, missing))
    return rows[-2:-1] + rows[:-2] + rows[-1:]


def _roundtrip(server, client, endpoint) -> bool:
    server.bind(endpoint)
    client.connect(endpoint)
    client.send(b"ping")
    return bool(server.poll(3000)) and server.recv_multipart()[-1] == b"ping"


def try_curve() -> str:
    """A real CURVE handshake and message over tcp on 127.0.0.1."""
    if not zmq.has("curve"):
        return "no: this libzmq was built without CURVE"
    ctx = zmq.Context()
    try:
        spub, ssec = zmq.curve_keypair()
        cpub, csec = zmq.curve_keypair()
        server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        for s in (server, client):
            s.setsockopt(zmq.LINGER, 0)
        server.curve_server = True
        server.curve_secretkey = ssec
        server.curve_publickey = spub
        client.curve_serverkey = spub
        client.curve_publickey = cpub
        client.curve_secretkey = csec
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        client.send(b"ping")
        ok = server.poll(3000) and server.recv_multipart()[-1] == b"ping"
        return "yes (handshake and message over tcp)" if ok else "no: no message within 3 s"
    except zmq.ZMQError as exc:
        return f"no: {exc}"
    finally:
        ctx.destroy(linger=0)


def try_ipc() -> str:
    """An ipc round trip where the transport binds its endpoints (transport/zmq/transport.py): a name in
    Linux's abstract namespace, elsewhere a file in the temp dir."""
    path = ipc_path(f"collectives-info-{uuid.uuid4().hex[:8]}.ipc")
    where = "abstract namespace" if ABSTRACT_IPC else tempfile.gettempdir()
    ctx = zmq.Context()
    try:
        server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        for s in (server, client):
            s.setsockopt(zmq.LINGER, 0)
        ok = _roundtrip(server, client, f"ipc://{path}")
        return f"yes ({where})" if ok else "no: no message within 3 s"
    except zmq.ZMQError as exc:
        return f"no: {exc}"
    finally:
        ctx.destroy(linger=0)
        if not ABSTRACT_IPC:
            try:
                os.unlink(path)
            except OSError:
                pass


def try_shm() -> str:
    """An arena made, mapped as a peer would map it, and a payload read back."""
    from ..transport.zmq import shm

    arena = peer = None
    try:
        arena = shm.SendArena(1 << 16, 2)
        peer = shm.PeerArena(arena.describe())
        arena.attach(1, peer.returns.describe())
        data = np.arange(1000, dtype=np.float64)
        slot, nbytes = arena.put(data, 1)
        view = peer.view(slot, nbytes)
        ok = view is not None and bytes(view) == data.tobytes()
        return "yes (memfd arena mapped and read back)" if ok else "no: read back differs"
    except Exception as exc:  # noqa: BLE001 -- any reason is the answer
        return f"no: {exc}"
    finally:
        for a in (peer, arena):
            if a is not None:
                a.close()


def interfaces() -> list[tuple[str, str]]:
    """(name, IPv4 address or '-') of every interface."""
    rows = []
    for _, name in socket.if_nameindex():
        try:
            addr = interface_address(name)
        except ValueError:
            addr = "-"
        rows.append((name, addr))
    return rows


def picked_address() -> str:
    from ..transport.zmq.addresses import bind_address

    try:
        host, _ = config.coordinator_address()
    except ValueError:
        host = config.master_addr() or "127.0.0.1"
    ifname = config.socket_ifname()
    try:
        where = bind_address(ifname, host)
    except ValueError as exc:
        return f"none: {exc}"
    why = (
        f"COLLECTIVES_SOCKET_IFNAME={ifname}" if ifname else f"the interface that routes to {host}"
    )
    return f"{where} ({why})"


def crossovers() -> list[str]:
    rows = [
        f"direct up to {tuning.DIRECT_MAX_BYTES.get(n, tuning.DIRECT_MAX_BYTES_DEFAULT)} B "
        f"per rank at {n} ranks"
        for n in sorted(tuning.DIRECT_MAX_BYTES)
    ]
    rows.append(
        f"direct up to {tuning.DIRECT_MAX_BYTES_DEFAULT} B at other sizes up to "
        f"{tuning.DIRECT_MAX_RANKS} ranks"
    )
    rows.append(f"tree up to {tuning.TREE_MAX_BYTES} B (3+ ranks), ring above")
    rows.append(
        "across hosts (a group spanning 2+ hosts, one with 2+ ranks): hierarchical "
        "above the direct crossover"
    )
    return rows


def failslow() -> list[str]:
    """The policy in effect and the rule that flags a slow link (membership/failslow.py)."""
    th, nic = Thresholds(), NicThresholds()
    try:
        policy = config.failslow_policy()
    except ValueError as exc:
        policy = f"(invalid: {exc})"
    return [
        f"policy {policy} (COLLECTIVES_FAILSLOW_POLICY; read where the coordinator runs)",
        f"a link is flagged when its throughput over the last {th.window:g} s is below its "
        f"peers' median / {th.slow_ratio:g},",
        f"  its transit fills {th.min_share:.0%} of that time, for {th.sustain:g} s; "
        f"cleared when back above median / {th.clear_ratio:g} for {th.clear_sustain:g} s",
        f"  or its small frames' latency is above its peers' median x {th.latency_ratio:g} "
        f"(frames found queued count, at their bound), on the same share and times",
        "a rank is a slow NIC when 3+ of its links, in and out, to 2+ peers are flagged",
        f"a rank's NIC runs behind when each of its links, in and out, is below the median of "
        f"the links between the others / {nic.ratio:g} for {nic.sustain:g} s (cleared within "
        f"{nic.clear_ratio:g}x for {nic.clear_sustain:g} s): the ring's chunks sized around it",
        "a running job's flagged links: the coordinator's log, and pg.rerouted on every rank",
    ]


def shown_value(name: str, value: str | None) -> str:
    """A variable's value as the report shows it: a secret never (the report is pasted into
    public bug trackers), only that it is set."""
    if value is None:
        return "(unset)"
    if "SECRET" in name:
        return "(set, not shown)"
    return value


def report() -> str:
    out = ["collectives environment report (paste it into your bug report)", "", "Versions:"]
    out += [f"  {k:12s} {v}" for k, v in versions()]
    out += [
        "",
        "Works here (tried):",
        f"  CURVE          {try_curve()}",
        f"  ipc sockets    {try_ipc()}",
        f"  shared memory  {try_shm()}",
        "",
        "Network interfaces:",
    ]
    out += [f"  {name:12s} {addr}" for name, addr in interfaces()]
    out += [f"  would bind:  {picked_address()}", "", "Variables (value in effect | default):"]
    for var, value in config.in_effect():
        out.append(f"  {var.name:32s} {shown_value(var.name, value)} | {var.default}")
    out += ["", "all_reduce auto crossovers (group/tuning.py):"]
    out += [f"  {row}" for row in crossovers()]
    out += ["", "Fail-slow links (membership/failslow.py):"]
    out += [f"  {row}" for row in failslow()]
    return "\n".join(out) + "\n"
