"""init_process_group and the default group (module-level twins such as cl.all_reduce).

Where the coordinator is:
  COLLECTIVES_COORDINATOR=host:port if set (the launcher sets it), else MASTER_ADDR:MASTER_PORT.
  Under torchrun, MASTER_PORT already belongs to torch's own store, so the coordinator uses
  MASTER_PORT + 1 (documented in the README).
Rank 0 starts a coordinator in-process when it can bind that address (nobody else hosts one).
"""
from __future__ import annotations

import os

from .api import ProcessGroup
from .errors import CollectiveError
from .rendezvous import DEFAULT_HEARTBEAT_INTERVAL, Coordinator, CoordinatorClient
from .transport.zmq import ZmqTransport, local_ip_towards

_default: ProcessGroup | None = None


def _env_int(name: str, value):
    if value is not None:
        return int(value)
    raw = os.environ.get(name)
    if raw is None:
        raise ValueError(f"init_process_group: {name.lower()} not given and ${name} is not set "
                         "(launch with `python -m collectives.launch` or torchrun, or pass it)")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"init_process_group: ${name}={raw!r} is not an integer") from None


def coordinator_address(master_addr=None, master_port=None) -> tuple[str, int]:
    explicit = os.environ.get("COLLECTIVES_COORDINATOR")
    if explicit and master_addr is None and master_port is None:
        host, _, port = explicit.rpartition(":")
        return host, int(port)
    addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = _env_int("MASTER_PORT", master_port)
    if master_port is None and os.environ.get("TORCHELASTIC_RUN_ID"):
        port += 1   # torchrun's TCPStore holds MASTER_PORT itself
    if not 0 < port < 65536:
        raise ValueError(f"init_process_group: master_port {port} is not a TCP port")
    return addr, port


def init_process_group(rank=None, world_size=None, master_addr=None, master_port=None,
                       timeout: float = 30.0, *, transport: str | None = None,
                       heartbeat_interval: float | None = None,
                       segment_bytes: int | None = None) -> ProcessGroup:
    """Join the job and return its ProcessGroup (also the default group for cl.all_reduce etc.).

    None arguments come from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. `timeout` is the
    default deadline of every operation and of the rendezvous itself.
    """
    global _default
    rank = _env_int("RANK", rank)
    world_size = _env_int("WORLD_SIZE", world_size)
    if world_size < 1:
        raise ValueError(f"init_process_group: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: rank {rank} is not in 0..{world_size - 1}")
    if not timeout > 0:
        raise ValueError(f"init_process_group: timeout must be > 0 seconds, got {timeout}")
    transport = transport or os.environ.get("COLLECTIVES_TRANSPORT", "auto")
    hb = heartbeat_interval or float(os.environ.get("COLLECTIVES_HEARTBEAT_INTERVAL",
                                                    DEFAULT_HEARTBEAT_INTERVAL))
    host, port = coordinator_address(master_addr, master_port)

    hosted = None
    if rank == 0:
        try:
            hosted = Coordinator(host, port, world_size, heartbeat_interval=hb).start()
        except Exception:  # the address is taken: the launcher (or someone) hosts one
            hosted = None
    t = ZmqTransport(rank, world_size, 0, transport=transport,
                     bind_host=local_ip_towards(host), segment_bytes=segment_bytes)
    client = CoordinatorClient(f"{host}:{port}", rank, world_size, heartbeat_interval=hb)
    try:
        generation, infos = client.join(t.address_info(), timeout)
        t.generation = generation
        t.connect(infos)
    except BaseException:
        client.close()
        t.close()
        if hosted is not None:
            hosted.stop()
        raise
    t.diagnoser = client.diagnose
    client.start_heartbeat(t)

    def on_destroy():
        global _default
        client.close()
        if hosted is not None:
            hosted.stop()
        if _default is pg:
            _default = None

    pg = ProcessGroup(t, timeout=timeout, on_destroy=on_destroy)
    _default = pg
    return pg


def default_group() -> ProcessGroup:
    if _default is None:
        raise CollectiveError("no default process group: call cl.init_process_group() first")
    return _default


def destroy_process_group():
    if _default is not None:
        _default.destroy()


def _twin(name):
    def call(*args, **kwargs):
        return getattr(default_group(), name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = f"{name} on the default group (see ProcessGroup.{name})."
    return call


all_reduce = _twin("all_reduce")
reduce = _twin("reduce")
broadcast = _twin("broadcast")
all_gather = _twin("all_gather")
reduce_scatter = _twin("reduce_scatter")
barrier = _twin("barrier")
send = _twin("send")
recv = _twin("recv")


def get_rank() -> int:
    return default_group().rank


def get_world_size() -> int:
    return default_group().world_size
