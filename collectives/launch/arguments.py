"""The launcher's command line: its options, checked before anything starts (__main__.py
runs the job they describe)."""

from __future__ import annotations

import argparse


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m collectives.launch",
        description="Start N local workers of a script with RANK/WORLD_SIZE/... set, host their "
        "coordinator, prefix their output with their rank, and stop all of them "
        "when one fails.",
    )
    p.add_argument(
        "--nproc",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc",
        type=int,
        required=True,
        help="number of worker processes on this node",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="number of nodes (hosts) in the job, each running this launcher with "
        "the same --nproc, --master-addr and --master-port (default 1)",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        help="this node's place, 0..nnodes-1; node 0 hosts the coordinator, and "
        "its workers are ranks 0..nproc-1 (node-major, as torchrun)",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default="127.0.0.1",
        help="address the workers reach the coordinator at (default 127.0.0.1)",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        help="MASTER_PORT for the workers; the coordinator listens on MASTER_PORT+1 "
        "(default: a free pair)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when ending workers (default 5)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="end the whole job after this many seconds (default: no limit)",
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="a failed worker does not end the job; the others go on without it",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help="with --elastic: start up to this many replacement workers (or new "
        "spares), each joining the running job (default 0; with --spares, "
        "--nproc)",
    )
    p.add_argument(
        "--min-nproc",
        type=int,
        default=None,
        metavar="MIN",
        help="with --elastic: generation 0 may form without workers that died "
        "after joining, down to MIN workers in all (torchrun's MIN of "
        "MIN:MAX; default: all, a replacement or spare takes the place)",
    )
    p.add_argument(
        "--spares",
        type=int,
        default=0,
        help="start this many warm spares with the job (implies --elastic): each "
        "imports everything and waits outside the group; when a worker fails, "
        "one takes its place at the next step boundary and a new spare is "
        "started (counted in --max-restarts)",
    )
    p.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        "--run-id",
        dest="run_id",
        default=None,
        help="the job's id, given to the workers as TORCHELASTIC_RUN_ID (default: "
        'a fresh one on a single node, as torchrun --standalone; "none" '
        "with --nnodes > 1, torchrun's default)",
    )
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="treat `script` as a module name, as `python -m` does",
    )
    p.add_argument("script", help="the worker script (or module, with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to every worker")
    a = p.parse_args(argv)
    if a.nproc < 1:
        p.error(f"--nproc must be >= 1, got {a.nproc}")
    if a.nnodes < 1 or not 0 <= a.node_rank < a.nnodes:
        p.error(
            f"--node-rank must be in 0..{a.nnodes - 1} (--nnodes {a.nnodes}), got {a.node_rank}"
        )
    if a.nnodes > 1 and a.node_rank > 0 and a.master_port is None:
        p.error(
            "--master-port is required on nodes other than 0: the port node 0's launcher "
            "prints (`MASTER_PORT=...`), or the one all nodes were given"
        )
    if a.master_port is not None and not 0 < a.master_port < 65535:
        p.error(
            f"--master-port must be in 1..65534 (the coordinator takes port+1), got {a.master_port}"
        )
    if a.min_nproc is not None and not 1 <= a.min_nproc <= a.nnodes * a.nproc:
        p.error(f"--min-nproc must be in 1..{a.nnodes * a.nproc}, got {a.min_nproc}")
    if a.spares < 0:
        p.error(f"--spares must be >= 0, got {a.spares}")
    if a.spares:
        a.elastic = True
    if a.max_restarts is None:
        a.max_restarts = a.nproc if a.spares else 0
    if a.grace < 0 or (a.timeout is not None and a.timeout <= 0):
        p.error("--grace must be >= 0 and --timeout > 0")
    return a
