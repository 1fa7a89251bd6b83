"""Rendezvous through the c10d store torch hands the backend: no extra port, no coordinator.

Each rank binds a ZmqTransport and publishes its address_info() (transport/address.py, msgpack) in the store, then
reads everyone else's, within the store's timeout. The job's own store (env://, tcp://,
torchrun) is enough.

The store itself is not authenticated (torch's TCPStore never is: anyone who reaches it can
read and write it), so no secret ever goes through it (docs/security.md). The sockets are
keyed by COLLECTIVES_JOB_SECRET (or _FILE) when set; otherwise, all ranks on one host, rank 0
makes a secret, writes it into a file only this user can read (common/secret.py) and puts just
that file's name and its host in the store; a rank on another host refuses to start (set the
secret), unless COLLECTIVES_INSECURE=1.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import msgpack

from ..common import config
from ..common import secret as shared
from ..common.errors import CollectiveError
from ..group.group import ProcessGroup
from ..common import security
from ..transport import address
from ..transport.zmq.addresses import host_id, interface_address, local_ip_towards
from ..transport.zmq.transport import ZmqTransport
from .store_calls import bounded

_KEY = "collectives/addr/{}"
_SECRET_KEY = "collectives/secret-file"


def _store_host(store: Any) -> str | None:
    """The host of the TCPStore under any PrefixStores, if there is one."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def _bind_host(store: Any) -> str:
    explicit = config.bind_host()
    if explicit:
        return explicit
    ifname = config.socket_ifname()
    if ifname:
        return interface_address(ifname)
    peer = config.master_addr() or _store_host(store)
    if not peer or peer == "localhost":
        return "127.0.0.1"
    return local_ip_towards(peer)


def _wait(store: Any, keys: list[str], rank: int, timeout_s: float, what: str) -> None:
    """Until `keys` are in the store, within timeout_s (store_calls.py: torch's wait alone
    may block for good when the store's server stops answering)."""
    bounded(
        lambda: store.wait(keys, timedelta(seconds=timeout_s)),
        timeout_s,
        op="rendezvous",
        rank=rank,
        what=what,
    )


def _get(store: Any, key: str, rank: int, timeout_s: float) -> bytes:
    return bounded(lambda: store.get(key), timeout_s, op="rendezvous", rank=rank, what=key)


def _set(store: Any, key: str, value: bytes, rank: int, timeout_s: float) -> None:
    bounded(lambda: store.set(key, value), timeout_s, op="rendezvous", rank=rank, what=key)


def _job_keys(store: Any, rank: int, size: int, timeout_s: float) -> tuple[Any, str | None]:
    """(keys, the file to remove once every rank has read it, or None); see the docstring."""
    found = security.from_environment()
    if found is not security.AUTO:
        return found, None
    if size == 1:  # nobody to share with: a secret of this process's own
        return security.process_keys(), None
    if rank == 0:
        name = f"torch-{secrets.token_hex(16)}"
        secret = shared.generate()
        shared.publish(name, secret)
        _set(store, _SECRET_KEY, msgpack.packb({"file": name, "host": host_id()}), rank, timeout_s)
        return security.JobKeys(secret, "shared file"), name
    _wait(store, [_SECRET_KEY], rank, timeout_s, "rank 0's secret file")
    raw = _get(store, _SECRET_KEY, rank, timeout_s)
    try:
        doc = msgpack.unpackb(raw)
        name, host = str(doc["file"]), str(doc["host"])
    except Exception:
        raise CollectiveError(
            f"rendezvous: rank {rank}: the store's {_SECRET_KEY!r} is not "
            "rank 0's (someone else wrote the store?)",
            op="rendezvous",
            rank=rank,
        ) from None
    if host != host_id():
        raise CollectiveError(
            f"rendezvous: rank {rank} is on another host than rank 0 and no job secret is "
            "set: set COLLECTIVES_JOB_SECRET (or _FILE) to the same value on every rank "
            "(torch's store carries no secret), or COLLECTIVES_INSECURE=1 (docs/security.md)",
            op="rendezvous",
            rank=rank,
        )
    try:
        return security.JobKeys(shared.wait(name, timeout_s, "rank 0"), "shared file"), None
    except ValueError as exc:
        raise CollectiveError(
            f"rendezvous: rank {rank}: {exc}", op="rendezvous", rank=rank
        ) from None


def connect(store: Any, rank: int, size: int, timeout_s: float) -> ProcessGroup:
    """Bind a ZmqTransport, swap addresses through `store`, and return a collectives group
    whose transport watches its peers' connections (a dead peer fails the op in flight)."""
    keys, published = _job_keys(store, rank, size, timeout_s)
    try:
        t = ZmqTransport(
            rank, size, 0, transport=config.transport(), bind_host=_bind_host(store), keys=keys
        )
        try:
            # every rank has read the secret before it gives its address: once rank 0 has
            # them all, the file can go
            _set(store, _KEY.format(rank), address.encode(t.address_info()), rank, timeout_s)
            names = [_KEY.format(r) for r in range(size)]
            _wait(store, names, rank, timeout_s, f"the addresses of all {size} ranks")
            t.connect([address.decode(_get(store, k, rank, timeout_s)) for k in names])
            t.watch_peers()
        except BaseException:
            t.close()
            raise
    finally:
        if published is not None:
            shared.unpublish(published, keys.secret)
    return ProcessGroup(t, timeout=timeout_s)
