"""init_process_group, the default group and its module-level twins (cl.all_reduce etc.).

Where the coordinator is (common/config.py reads the environment):
  COLLECTIVES_COORDINATOR=host:port if set (the launcher sets it), else MASTER_ADDR:MASTER_PORT.
  Under torchrun, MASTER_PORT already belongs to torch's own store, so the coordinator uses
  MASTER_PORT + 1 (documented in docs/launching.md).
Rank 0 starts a coordinator in-process when it can bind that address (nobody else hosts one);
then rank 0's death cannot be survived. MASTER_PORT=0 makes rank 0 host it on any free port,
which it prints ("rank 0 hosts the coordinator at HOST:PORT") for the others to use.

The job secret (docs/security.md): COLLECTIVES_JOB_SECRET or _FILE if set (the launcher sets
one); else, with the coordinator on this host, the one its host published for this user
(common/secret.py: rank 0 hosting it generates and publishes one); else -- the coordinator on
another host and no secret -- init_process_group refuses, unless COLLECTIVES_INSECURE=1.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Concatenate, ParamSpec, TypeVar

import zmq

from ..common import config
from ..common import secret as shared
from ..common.errors import CollectiveError
from ..group.group import ProcessGroup
from ..transport import faults
from ..common import security
from ..transport.zmq.addresses import bind_address
from . import signals
from .client import CoordinatorClient
from .lifecycle import Membership, sockets_failed
from .server import Coordinator

_default: ProcessGroup | None = None
ROLE_HINT = (
    "[collectives] note: rank 0 hosts the coordinator, so the job ends if rank 0 dies; "
    "to survive that, start the workers with `python -m collectives.launch` or run "
    "`python -m collectives.coordinator` apart and point COLLECTIVES_COORDINATOR at it"
)


def init_process_group(
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout: float = 30.0,
    *,
    join: bool | None = None,
    transport: str | None = None,
    heartbeat_interval: float | None = None,
    heartbeat_timeout: float | None = None,
    segment_bytes: int | None = None,
    socket_ifname: str | None = None,
    announce: Callable[[int], None] | None = None,
) -> ProcessGroup:
    """Join the job and return its ProcessGroup (also the default group for cl.all_reduce etc.).

    None arguments come from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. `timeout` is the
    default deadline of every operation and of the rendezvous itself. join=True (or RANK unset
    and COLLECTIVES_JOIN=1) waits to be admitted into a running job at its next reconstruct().
    heartbeat_interval / heartbeat_timeout (or COLLECTIVES_HEARTBEAT_INTERVAL / _TIMEOUT):
    how often workers beat, and after how long without a beat the coordinator declares one
    dead (the timeout takes effect where the coordinator is hosted).
    announce: for a launcher that tells the others where the coordinator is (the torch
    backend, through torch's store): rank 0 always hosts one, on any free port where
    master_port is taken, and calls announce(port) before it waits for the others.
    """
    global _default
    if join is None:
        join = config.join_requested(rank)
    if not timeout > 0:
        raise ValueError(f"init_process_group: timeout must be > 0 seconds, got {timeout}")
    transport = config.transport(transport)
    hb = config.heartbeat_interval(heartbeat_interval)
    hb_timeout = config.heartbeat_timeout(heartbeat_timeout)
    host, port = config.coordinator_address(master_addr, master_port)
    # Where this rank's sockets bind: checked before anything starts (a wrong interface name
    # is an error naming the ones that exist)
    bind = bind_address(config.socket_ifname(socket_ifname), host)
    keys = security.from_environment()  # JobKeys, None (insecure) or AUTO (none set)
    config.raise_open_files()  # idle connections from anyone must not starve this rank of fds

    hosted = None
    if not join:
        rank = config.required_launcher_int("RANK", rank)
        world_size = config.required_launcher_int("WORLD_SIZE", world_size)
        if world_size < 1:
            raise ValueError(f"init_process_group: world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"init_process_group: rank {rank} is not in 0..{world_size - 1}")
        if rank == 0:
            try:
                hosted = _host(host, port, world_size, hb, hb_timeout, keys)
            except ValueError:  # a bad secret setting, or no private place to publish one
                raise
            except Exception as exc:  # the address is taken: the launcher (or someone) hosts one
                if port == 0:
                    raise CollectiveError(
                        f"init_process_group: rank 0 cannot host a coordinator on {host}: {exc}"
                    ) from exc
                if announce is None:
                    hosted = None
                else:  # nobody else hosts one where the others learn the port from announce
                    try:
                        hosted = _host(host, 0, world_size, hb, hb_timeout, keys)
                    except Exception as again:
                        raise CollectiveError(
                            f"init_process_group: rank 0 cannot host a coordinator at "
                            f"{host}:{port} ({exc}) nor on any free port of {host}: {again}",
                            op="init_process_group",
                            rank=0,
                        ) from again
            if announce is not None:
                assert hosted is not None  # hosted above, on master_port or any free port
                port = hosted.port
                try:
                    announce(port)
                except BaseException:
                    hosted.stop()
                    raise
            elif port == 0:  # any free port: say which, so that the others can be started
                port = hosted.port  # type: ignore[union-attr]  # not None: port 0 raised above
                print(
                    f"[collectives] rank 0 hosts the coordinator at {host}:{port}",
                    file=sys.stderr,
                    flush=True,
                )
            if hosted is not None and world_size > 1:
                print(ROLE_HINT, file=sys.stderr, flush=True)
    if port == 0:
        raise ValueError(
            "init_process_group: master_port 0 (any free port) is for rank 0, "
            "which hosts the coordinator and prints its port; give the other "
            "ranks that port"
        )
    keys = hosted.keys if hosted is not None else _find_keys(keys, host, port, rank, timeout)
    try:
        client = CoordinatorClient(
            f"{host}:{port}",
            rank,
            world_size,
            heartbeat_interval=hb,
            keys=keys,
            heartbeat_timeout=hb_timeout,
            grace=config.coordinator_grace(None, hb_timeout),
        )
    except zmq.ZMQError as exc:
        if hosted is not None:
            hosted.stop()
        raise sockets_failed(exc, "init_process_group", rank, 0) from exc
    membership = Membership(
        client, bind, timeout, transport, segment_bytes, hosted, clock=client.clock
    )
    try:
        if join:
            pg = membership.join_group(timeout, spare=config.spare_requested())
        else:
            assert rank is not None and world_size is not None  # required above
            pg = membership.first_group(rank, world_size, timeout)
    except BaseException:
        membership.close()
        raise
    signals.install()
    faults.from_environment(pg)
    _default = pg
    return pg


def _host(
    host: str, port: int, world_size: int, hb: float, hb_timeout: float, keys: Any
) -> Coordinator:
    """A started coordinator in this process (rank 0's)."""
    return Coordinator(
        host,
        port,
        world_size,
        heartbeat_interval=hb,
        heartbeat_timeout=hb_timeout,
        keys=keys,
    ).start()


def _find_keys(keys: Any, host: str, port: int, rank: int | None, timeout: float) -> Any:
    """The keys of a job whose coordinator someone else hosts: the environment's (or None,
    insecure); else, the coordinator being on this host, the secret its host published for
    this user; else refuse: never silently unauthenticated across hosts."""
    if keys is not security.AUTO:
        return keys
    who = f"rank {rank}" if rank is not None else "a joiner"
    if not shared.is_local(host):
        raise CollectiveError(
            f"init_process_group: {who}: the coordinator at {host}:{port} is on another host "
            "and no job secret is set: set COLLECTIVES_JOB_SECRET (or _FILE) to the same "
            "value on every process of the job (see docs/security.md), or accept an "
            "unauthenticated job with COLLECTIVES_INSECURE=1",
            op="init_process_group",
            rank=rank,
        )
    try:
        found = shared.wait(f"coordinator-{port}", timeout, f"the coordinator at {host}:{port}")
    except ValueError as exc:
        raise CollectiveError(
            f"init_process_group: {who}: {exc}", op="init_process_group", rank=rank
        ) from None
    return security.JobKeys(found, "shared file")


def default_group() -> ProcessGroup:
    """The group of the last init_process_group, or the one reconstruct() replaced it with."""
    global _default
    if _default is None:
        raise CollectiveError("no default process group: call cl.init_process_group() first")
    while _default.successor is not None:
        _default = _default.successor
    return _default


def destroy_process_group() -> None:
    global _default
    if _default is not None:
        default_group().destroy()
        _default = None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _twin(method: Callable[Concatenate[ProcessGroup, _P], _R]) -> Callable[_P, _R]:
    """cl.NAME(...) = default_group().NAME(...), with the method's signature and docstring
    (help(cl.all_reduce) says what help(ProcessGroup.all_reduce) says)."""
    name = method.__name__

    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = getattr(default_group(), name)(*args, **kwargs)
        return result

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (
        f"{name} on the default group (cl.default_group().{name}).\n\n"
        f"{inspect.getdoc(method) or ''}"
    )
    sig = inspect.signature(method)
    call.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=list(sig.parameters.values())[1:]
    )  # without self
    return call


all_reduce = _twin(ProcessGroup.all_reduce)
reduce = _twin(ProcessGroup.reduce)
broadcast = _twin(ProcessGroup.broadcast)
all_gather = _twin(ProcessGroup.all_gather)
reduce_scatter = _twin(ProcessGroup.reduce_scatter)
all_to_all = _twin(ProcessGroup.all_to_all)
gather = _twin(ProcessGroup.gather)
scatter = _twin(ProcessGroup.scatter)
barrier = _twin(ProcessGroup.barrier)
send = _twin(ProcessGroup.send)
recv = _twin(ProcessGroup.recv)


def empty(
    shape: int | tuple[int, ...],
    dtype: Any = "float32",
    pg: ProcessGroup | None = None,
    like: str = "numpy",
) -> Any:
    """A zero-filled buffer in registered shared memory of `pg` (default: the default group):
    pg.alloc(shape, dtype), or with like="torch" pg.alloc_tensor(shape, dtype) (dtype may then
    be a torch dtype). Same-host peers read it in place in collectives (group/alloc.py)."""
    if like not in ("numpy", "torch"):
        raise ValueError(f"empty: like must be 'numpy' or 'torch', got {like!r}")
    pg = default_group() if pg is None else pg
    if like == "torch":
        return pg.alloc_tensor(shape, None if dtype == "float32" else dtype)
    return pg.alloc(shape, dtype)


def get_rank() -> int:
    return default_group().rank


def get_world_size() -> int:
    return default_group().world_size
