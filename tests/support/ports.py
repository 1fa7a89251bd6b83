"""The one way tests get ports: whoever listens binds port 0 and reports the port it got.

Never "pick a free port, then let someone bind it later": another process can take it in
between ("coordinator cannot listen on 127.0.0.1:PORT: Address already in use").

  coordinator(world_size)           a Coordinator in the test process (port 0; .address)
  coordinator_process(procs, ...)   `python -m collectives.coordinator --port 0 --port-file F`
                                    as a process of `procs`; its "host:port" once written
  rank0_address(procs, name)        a worker started with MASTER_PORT=0 hosts the coordinator
                                    as rank 0 and prints "rank 0 hosts the coordinator at
                                    HOST:PORT"; that address
  torch_store()                     a torch TCPStore in the test process (port 0) that the
                                    workers' env:// or tcp:// rendezvous joins as clients
                                    (TORCHELASTIC_USE_AGENT_STORE, as under torchrun)
"""

from __future__ import annotations

import contextlib
import sys
from datetime import timedelta

HOST = "127.0.0.1"


def coordinator(world_size: int, **kw):
    """A started Coordinator on HOST, port 0 (stop() it, or give it to a ProcessSet)."""
    from collectives.membership.server import Coordinator

    return Coordinator(HOST, 0, world_size, **kw).start()


def coordinator_process(
    procs,
    name: str,
    world_size: int,
    *,
    prefix=(),
    host: str = HOST,
    env=None,
    args=(),
    timeout: float = 30.0,
) -> str:
    """Start the standalone coordinator as process `name` of `procs` on any free port of
    `host`; return "host:port" once it is listening."""
    from .procs import ProcessSet

    port_file = procs.tmp / f"{name}.port"
    ProcessSet.spawn(
        procs,
        name,
        [
            *prefix,
            sys.executable,
            "-m",
            "collectives.coordinator",
            "--host",
            host,
            "--port",
            "0",
            "--port-file",
            port_file,
            "--world-size",
            world_size,
            *args,
        ],
        env,
    )
    port = procs.wait_for_file(port_file, timeout, f"port from {name}")
    return f"{host}:{int(port)}"


def rank0_address(procs, name: str, timeout: float = 30.0) -> str:
    """The address rank 0 (process `name`, started with MASTER_PORT=0) reports on stderr
    (`timeout` scaled: timing.py)."""
    import re
    import time

    from .timing import scaled

    timeout = scaled(timeout)
    rx = re.compile(r"rank 0 hosts the coordinator at (\S+:\d+)")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = rx.search(procs.stderr(name)) or rx.search(procs.text(name))
        if m:
            return m.group(1)
        if procs.procs[name].poll() is not None:
            break
        time.sleep(0.05)
    procs.fail(f"{name} reported no coordinator address within {timeout:g} s")


@contextlib.contextmanager
def torch_store(timeout: float = 60.0):
    """Host a TCPStore on port 0; yields the env that makes workers' torch.distributed
    rendezvous (env:// and tcp://) connect to it as clients."""
    import torch.distributed as dist

    store = dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout)
    )
    try:
        yield {
            "MASTER_ADDR": HOST,
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    finally:
        del store
