"""Which address a rank's sockets bind and advertise, and which processes share a host: the
network-interface helpers of the ZeroMQ transport (transport.py)."""

from __future__ import annotations

from collections.abc import Iterable

import os
import socket


def host_id() -> str:
    """Processes with equal host ids can reach each other over ipc (same kernel, same netns)."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return f"{socket.gethostname()}:{netns}"


def cpu_mask() -> str:
    """The CPUs this process may run on (its affinity), as a hex bit mask: a host's ranks
    together use the union of theirs (group/tuning.py, crowded)."""
    cpus: Iterable[int]
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = range(os.cpu_count() or 1)
    return format(sum(1 << c for c in cpus), "x")


def parse_cpu_mask(text: object) -> int | None:
    """A peer's cpu_mask() as an int; None if it sent none or not a hex mask."""
    if not isinstance(text, (str, bytes)):
        return None
    try:
        mask = int(text, 16)
    except (TypeError, ValueError):
        return None
    return mask if mask > 0 else None


_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` (COLLECTIVES_SOCKET_IFNAME, like
    GLOO_SOCKET_IFNAME); ValueError naming the interfaces that exist if it is not one."""
    import fcntl
    import struct

    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        raise ValueError(
            f"COLLECTIVES_SOCKET_IFNAME={name!r}: no such network interface here; "
            f"this host has {', '.join(names)}"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = struct.pack("256s", name.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
        except OSError:
            raise ValueError(
                f"COLLECTIVES_SOCKET_IFNAME={name!r}: the interface has no IPv4 "
                f"address (interfaces here: {', '.join(names)})"
            ) from None


def bind_address(ifname: str | None, towards: str) -> str:
    """Where a rank's sockets bind and what they advertise: the address of interface
    `ifname` if one is named, else of the interface that routes to `towards`."""
    return interface_address(ifname) if ifname else local_ip_towards(towards)


def local_ip_towards(addr: str) -> str:
    """The address of this host's interface that routes to `addr` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"
