"""A standalone coordinator, for jobs that no launcher hosts (several hosts, or a job whose rank 0
may die and must not take the rendezvous down with it):

    python -m collectives.coordinator --port 29501 --world-size 8 [--host 0.0.0.0]

then start each rank with COLLECTIVES_COORDINATOR=<this host>:29501 (or MASTER_ADDR/MASTER_PORT
pointing here). --port 0 takes any free port; the port it got is printed ("listening on
HOST:PORT") and, with --port-file PATH, written to PATH once it listens. It serves
rendezvous, heartbeats and stall diagnosis (membership/server.py) until SIGTERM or SIGINT,
then exits with status 0.

Killed, it can be started again at the same address with the same secret within the members'
grace (COLLECTIVES_COORDINATOR_GRACE): the members re-register and it rebuilds the job's
membership from them, without a generation change (membership/recovery.py).

It needs the job's secret (docs/security.md): COLLECTIVES_JOB_SECRET or COLLECTIVES_JOB_SECRET_FILE,
the same as every rank's; or --insecure (or COLLECTIVES_INSECURE=1; every rank then sets
COLLECTIVES_INSECURE=1), which lets anyone who reaches the port join the job.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from ..common.config import DEFAULT_HEARTBEAT_INTERVAL
from ..membership.server import Coordinator
from ..common import security


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m collectives.coordinator",
        description="Serve the rendezvous of one job until stopped.",
    )
    p.add_argument(
        "--port",
        type=int,
        required=True,
        help="TCP port to listen on (0: any free port, see --port-file)",
    )
    p.add_argument(
        "--port-file",
        default=None,
        help="write the port it listens on to this file (atomically) once it does",
    )
    p.add_argument("--world-size", type=int, required=True, help="number of ranks in the job")
    p.add_argument(
        "--min-world-size",
        type=int,
        default=None,
        help="generation 0 may form without ranks that died after joining, down "
        "to this many (default: --world-size; a replacement takes the place)",
    )
    p.add_argument(
        "--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: every interface)"
    )
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=DEFAULT_HEARTBEAT_INTERVAL,
        help="seconds between the ranks' heartbeats (default %(default)s)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="log warnings only, not every membership change (the launcher's)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no authentication: anyone who reaches the port can join the job "
        "(the ranks must set COLLECTIVES_INSECURE=1)",
    )
    a = p.parse_args(argv)
    if a.world_size < 1:
        p.error(f"--world-size must be >= 1, got {a.world_size}")
    if not 0 <= a.port < 65536:
        p.error(f"--port must be in 0..65535, got {a.port}")
    logging.basicConfig(
        level=logging.WARNING if a.quiet else logging.INFO, format="[coordinator] %(message)s"
    )
    try:
        keys = security.from_environment()
    except ValueError as exc:
        p.error(str(exc))
    if a.insecure:
        if keys is not None and keys is not security.AUTO:
            p.error("--insecure and a job secret (COLLECTIVES_JOB_SECRET/_FILE) both given")
        security.warn_insecure()
        keys = None
    elif keys is security.AUTO:
        p.error(
            "no job secret: set COLLECTIVES_JOB_SECRET or COLLECTIVES_JOB_SECRET_FILE "
            "(the same on every rank), or pass --insecure (docs/security.md)"
        )
    try:
        c = Coordinator(
            a.host,
            a.port,
            a.world_size,
            heartbeat_interval=a.heartbeat_interval,
            keys=keys,
            min_world_size=a.min_world_size,
        )
    except Exception as exc:
        print(f"[coordinator] cannot listen on {a.host}:{a.port}: {exc}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        print(f"[coordinator] {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
        c.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not a.quiet:
        print(
            f"[coordinator] listening on {c.address} for {a.world_size} ranks",
            file=sys.stderr,
            flush=True,
        )
    if a.port_file:
        tmp = f"{a.port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{c.port}\n")
        os.replace(tmp, a.port_file)
    c.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
