"""Rendezvous through the c10d store torch hands the backend: no extra port, no coordinator.

Each rank binds a ZmqTransport and publishes its address_info() (msgpack) in the store, then
reads everyone else's, within the store's timeout. The job's own store (env://, tcp://,
torchrun) is enough.
"""
from __future__ import annotations

from datetime import timedelta

import msgpack

from ..core import config
from ..core.errors import CollectiveError
from ..core.group import ProcessGroup
from ..transport.zmq import ZmqTransport, interface_address, local_ip_towards

_KEY = "collectives/addr/{}"


def _store_host(store) -> str | None:
    """The host of the TCPStore under any PrefixStores, if there is one."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def _bind_host(store) -> str:
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


def connect(store, rank: int, size: int, timeout_s: float) -> ProcessGroup:
    """Bind a ZmqTransport, swap addresses through `store`, and return a collectives group
    whose transport watches its peers' connections (a dead peer fails the op in flight)."""
    t = ZmqTransport(rank, size, 0, transport=config.transport(), bind_host=_bind_host(store))
    try:
        store.set(_KEY.format(rank), msgpack.packb(t.address_info()))
        keys = [_KEY.format(r) for r in range(size)]
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception as exc:
            raise CollectiveError(f"rendezvous: rank {rank} timed out after {timeout_s:g} s "
                                  f"waiting in the c10d store for the addresses of all "
                                  f"{size} ranks ({exc})", op="rendezvous", rank=rank) from exc
        t.connect([msgpack.unpackb(store.get(k)) for k in keys])
        t.watch_peers()
    except BaseException:
        t.close()
        raise
    return ProcessGroup(t, timeout=timeout_s)
