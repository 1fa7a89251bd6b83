"""Run N local workers of one script, torchrun-style:

    python -m collectives.launch --nproc 4 train.py --lr 0.1
    python -m collectives.launch --nproc 2 -m mypackage.worker
    python -m collectives.launch --nnodes 2 --node-rank 0 --nproc 2 --master-addr A train.py
    python -m collectives.launch --nnodes 2 --node-rank 1 --nproc 2 --master-addr A \
        --master-port P train.py          # P: the MASTER_PORT node 0 printed (or given to both)

Several nodes: one launcher per node with the same --nnodes, --nproc and --master-addr (an
address of node 0); node 0's launcher hosts the coordinator; ranks are node-major, and each
worker also gets GROUP_RANK (its node). With --elastic a node replaces its own failed workers.

The launcher
  * hosts the job's coordinator (rendezvous and heartbeats, see membership/server.py) in this process,
    so that the death of any worker, rank 0 included, can be diagnosed; with --elastic, as a
    child process that it starts again at the same address when it dies (hosting.py);
  * ties its children's lives to its own: killed (even SIGKILL), it leaves no worker running
    (a parent-death signal, hosting.py);
  * gives each worker RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    and COLLECTIVES_COORDINATOR=host:port (what cl.init_process_group() reads), and the rest of
    torchrun's worker environment (torchrun_env below: GROUP_RANK, ROLE_RANK, ...);
  * sets OMP_NUM_THREADS=1 for the workers when it is unset and this host runs more than one,
    with torchrun's notice (each worker's intra-op threads would otherwise fight for the
    same cores: the DDP tutorial's shape, 3 workers on 2 cores, ran 5-14 steps/s with torch's
    default of 2 threads each against 169-212 with 1);
  * authenticates every socket of the job (docs/security.md): it uses the secret in its own
    environment (COLLECTIVES_JOB_SECRET or _FILE) when there is one, else makes one for this
    job (`secrets`) and gives it to its workers and replacements as COLLECTIVES_JOB_SECRET;
    COLLECTIVES_INSECURE=1 turns that off for the coordinator and the workers alike;
  * prefixes every line a worker prints, on stdout or stderr, with "[rank R] ";
  * forwards SIGINT / SIGTERM to the workers (a second one kills them);
  * when a worker exits non-zero, ends the others (SIGTERM, then SIGKILL after --grace seconds)
    and exits non-zero itself, naming the rank and its exit code;
  * with --elastic, lets the others go on instead (they reconstruct the group without it) and
    starts a replacement, up to --max-restarts times, that joins the running job
    (COLLECTIVES_JOIN=1, no RANK: cl.init_process_group waits to be admitted). The job then
    succeeds when every worker still in it at the end exits 0.

Ports. MASTER_PORT is left free for torch.distributed's own store, exactly as under torchrun,
so a script that also calls torch.distributed.init_process_group(init_method="env://") works;
the coordinator listens on MASTER_PORT + 1 (the port init_process_group uses under torchrun).
Without --master-port the coordinator binds any free port (it is printed) and MASTER_PORT is
the one below it, checked free: that port is only kept for a torch store the script may start.

Every wait is bounded: workers are polled, signals escalate to SIGKILL after --grace seconds,
and --timeout (off by default) bounds the whole job.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

from ..common import secret as shared
from ..transport.zmq import security
from .hosting import CoordinatorProcess, CoordinatorThread, dies_with_parent
from .output import Prefixer
from .reporter import ExitReporter

POLL_S = 0.05


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


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def job_keys(nnodes: int = 1):
    """(keys for the coordinator, the secret to give the workers or None). The environment's
    secret, which the workers inherit; none when COLLECTIVES_INSECURE=1; else a new one --
    on one node only: the launchers of several nodes cannot agree on a secret by themselves."""
    try:
        keys = security.from_environment()
    except ValueError as exc:
        raise SystemExit(f"[launch] {exc}") from None
    if keys is security.AUTO and nnodes > 1:
        raise SystemExit(
            "[launch] --nnodes > 1: every node needs the same job secret, "
            "COLLECTIVES_JOB_SECRET or COLLECTIVES_JOB_SECRET_FILE (or, on a "
            "network you trust, COLLECTIVES_INSECURE=1); see docs/security.md"
        )
    if keys is security.AUTO:
        keys = security.JobKeys(shared.generate(), "launcher")
        return keys, keys.secret.decode()
    return keys, None


def start_coordinator(
    host: str,
    master_port: int | None,
    world_size: int,
    keys=security.AUTO,
    process: bool = False,
    min_world_size: int | None = None,
):
    """(MASTER_PORT, the running coordinator on MASTER_PORT + 1): on a thread of this process,
    or (process=True, --elastic) a child process that check() restarts (hosting.py)."""
    kind = CoordinatorProcess if process else CoordinatorThread
    if master_port is not None:
        try:
            return master_port, kind(
                host, master_port + 1, world_size, keys, environment(), min_world_size
            ).start()
        except Exception as exc:
            raise SystemExit(
                f"[launch] cannot host the coordinator at {host}:{master_port + 1} "
                f"(MASTER_PORT + 1): {exc}"
            ) from None
    for _ in range(100):  # the coordinator on any free port C, whose neighbour C - 1 is free
        coordinator = kind(host, 0, world_size, keys, environment(), min_world_size).start()
        port = coordinator.port - 1
        if port > 0 and _port_is_free(host, port):
            return port, coordinator
        coordinator.stop()
    raise SystemExit(f"[launch] found no free pair of ports on {host}")


def environment() -> dict:
    """A copy of the launcher's environment for a child (the launcher reads nothing of it)."""
    return dict(os.environ)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


OMP_NOTICE = (
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
    "default, to avoid your system being overloaded, please further tune the "
    "variable for optimal performance in your application as needed."
)


def omp_threads(nproc: int) -> str | None:
    """torchrun's rule: OMP_NUM_THREADS=1 for the workers when it is unset and a host runs
    more than one worker (None: leave the environment as it is)."""
    return "1" if "OMP_NUM_THREADS" not in environment() and nproc > 1 else None


def torchrun_env(
    rank: int,
    world_size: int,
    nproc: int,
    nnodes: int,
    node_rank: int,
    run_id: str,
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict:
    """What torchrun's agent gives a worker besides RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
    and MASTER_PORT (torch/distributed/elastic/agent/server/local_elastic_agent.py,
    _start_workers), with the same values for this launcher's one role, "default"."""
    return dict(
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node_rank),
        GROUP_WORLD_SIZE=str(nnodes),
        ROLE_RANK=str(rank),
        ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(world_size),
        TORCHELASTIC_RESTART_COUNT=str(restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(max_restarts),
        TORCHELASTIC_RUN_ID=run_id,
        # No agent hosts a store here: rank 0's init_process_group hosts it at MASTER_PORT,
        # as under torchrun with a rendezvous other than c10d's.
        TORCHELASTIC_USE_AGENT_STORE="False",
        TORCH_NCCL_ASYNC_ERROR_HANDLING=environment().get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # torchrun's agent names the signals it handles and its workers inherit the name;
        # this launcher forwards these two (torchrun: also SIGHUP and SIGQUIT).
        TORCHELASTIC_SIGNALS_TO_HANDLE="SIGINT,SIGTERM",
    )


def worker_env(
    local_rank: int,
    nproc: int,
    addr: str,
    port: int,
    joiner: bool = False,
    nnodes: int = 1,
    node_rank: int = 0,
    secret: str | None = None,
    run_id: str = "none",
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict:
    """A worker's environment, torchrun's contract: ranks are node-major (node i's workers
    are ranks i*nproc .. i*nproc+nproc-1). restart_count: 0 for the first workers, k for the
    k-th replacement (--elastic)."""
    env = environment()
    if secret is not None:  # the job's secret, made by the launcher (docs/security.md)
        env["COLLECTIVES_JOB_SECRET"] = secret
    rank, world_size = node_rank * nproc + local_rank, nnodes * nproc
    env.update(
        torchrun_env(
            rank, world_size, nproc, nnodes, node_rank, run_id, restart_count, max_restarts
        )
    )
    omp = omp_threads(nproc)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(local_rank),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        COLLECTIVES_COORDINATOR=f"{addr}:{port + 1}",
        PYTHONUNBUFFERED="1",
    )  # lines appear when printed, not when a buffer fills
    # Workers write into our pipes, so they cannot see whether the output is a terminal:
    # tell them (a live bar there, plain lines into a log), unless the user chose.
    env.setdefault("COLLECTIVES_PROGRESS", "bar" if _is_terminal(sys.stderr) else "lines")
    if joiner:  # a replacement: no rank of its own until the members admit it
        del env["RANK"], env["ROLE_RANK"]
        env["COLLECTIVES_JOIN"] = "1"
    return env


def _signal_all(procs, sig):
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass


def end_workers(procs, grace: float):
    """SIGTERM every live worker, SIGKILL what is left after `grace` seconds, reap them all."""
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and None in [p.poll() for p in procs]:
        time.sleep(POLL_S)
    _signal_all(procs, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): give up, say so
            print(f"[launch] worker pid {p.pid} did not die after SIGKILL", file=sys.stderr)


def _workers_done(procs, spares) -> bool:
    """Whether every worker not started as a spare has ended, one of them successfully."""
    workers = [p for i, p in enumerate(procs) if i not in spares]
    return all(p.returncode is not None for p in workers) and any(
        p.returncode == 0 for p in workers
    )


def _end_spares(procs, spares, lost, grace: float, say):
    """The spares still running `grace` s after the workers ended are ended (SIGTERM: a spare
    waiting to be admitted withdraws and exits), and their exit codes are no failure."""
    deadline = time.monotonic() + grace
    waiting = [i for i in spares if procs[i].poll() is None]
    while waiting and time.monotonic() < deadline:
        time.sleep(POLL_S)
        waiting = [i for i in waiting if procs[i].poll() is None]
    if waiting:
        say(f"ending {len(waiting)} spare(s) not needed")
    _signal_all([procs[i] for i in waiting], signal.SIGTERM)
    lost.update(waiting)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def main(argv=None) -> int:
    a = parse_args(argv)
    say = lambda msg: print(f"[launch] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    world_size = a.nnodes * a.nproc
    first = a.node_rank * a.nproc  # this node's first rank
    keys, secret = job_keys(a.nnodes)
    run_id = a.run_id or (uuid.uuid4().hex if a.nnodes == 1 else "none")
    if omp_threads(a.nproc) is not None:
        say(OMP_NOTICE)
    if a.node_rank == 0:
        port, coordinator = start_coordinator(
            a.master_addr,
            a.master_port,
            world_size,
            keys,
            process=a.elastic,
            min_world_size=a.min_nproc,
        )
        say(f"coordinator listening on {coordinator.address}; MASTER_PORT={port}")
    else:  # node 0's launcher hosts it; our workers reach it at MASTER_PORT + 1
        port, coordinator = a.master_port, None
        say(
            f"node {a.node_rank} of {a.nnodes}: ranks {first}..{first + a.nproc - 1}, "
            f"coordinator at {a.master_addr}:{port + 1}"
        )
    # a worker that ends is reported to the coordinator at once (reporter.py)
    reporter = ExitReporter(f"{a.master_addr}:{port + 1}", keys)
    reported: set[int] = set()
    cmd = [sys.executable, "-u"] + (["-m"] if a.module else []) + [a.script] + a.args
    procs: list[subprocess.Popen] = []
    prefixers: list[Prefixer] = []
    signals = []  # signals received, in order

    def on_signal(signum, frame):
        signals.append(signum)
        # First signal: pass it on and let the workers shut down; second: no more patience.
        _signal_all(procs, signum if len(signals) == 1 else signal.SIGKILL)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = None  # (rank, code) of the first worker that failed
    labels: list[str] = []
    lost: set[int] = set()  # --elastic: workers whose failure the job went on without

    spares: set[int] = set()  # indices in procs of the processes started as spares

    def spawn(rank, joiner=False, spare=False):
        # Own session: a Ctrl-C in the terminal reaches the launcher only, which forwards
        # it once, instead of every worker getting it twice.
        restarts = len(procs) - a.nproc + 1 if joiner else 0
        env = worker_env(
            rank,
            a.nproc,
            a.master_addr,
            port,
            joiner,
            a.nnodes,
            a.node_rank,
            secret,
            run_id,
            restarts,
            a.max_restarts,
        )
        if spare:  # admitted only into the place of a worker that failed (formation.py)
            env["COLLECTIVES_SPARE"] = "1"
            spares.add(len(procs))
        p = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # the launcher SIGKILLed: no worker goes on (hosting.py)
            preexec_fn=dies_with_parent(signal.SIGTERM),
        )
        procs.append(p)
        reporter.started(p.pid)
        labels.append(
            f"{'spare' if spare else 'replacement'} {len(procs) - a.nproc}"
            if joiner
            else f"rank {first + rank}"
        )
        prefix = (
            (b"[join %d] " % (len(procs) - a.nproc)) if joiner else b"[rank %d] " % (first + rank)
        )
        prefixers.append(Prefixer(p.stdout, sys.stdout.buffer, prefix))
        prefixers.append(Prefixer(p.stderr, sys.stderr.buffer, prefix))

    try:
        for rank in range(a.nproc):
            spawn(rank)
        for _ in range(a.spares):
            spawn(0, joiner=True, spare=True)
        restarts = 0
        ended_spares = False

        deadline = None if a.timeout is None else time.monotonic() + a.timeout
        while None in [p.poll() for p in procs]:  # poll every one (sets returncode)
            for i, p in enumerate(procs):
                if p.returncode not in (None, 0) and i not in reported:
                    reported.add(i)
                    reporter.ended(p.pid, p.returncode)
            if a.elastic and coordinator is not None and not signals:
                coordinator.check(say)  # died? the same address again (hosting.py)
            if signals:
                grace_end = time.monotonic() + a.grace
                while time.monotonic() < grace_end and None in [p.poll() for p in procs]:
                    time.sleep(POLL_S)
                break
            if spares and not ended_spares and _workers_done(procs, spares):
                # the job is over: the spares still waiting are not needed (one admitted
                # ends with the others)
                ended_spares = True
                _end_spares(procs, spares, lost, a.grace, say)
                continue
            bad = [
                (r, p.returncode)
                for r, p in enumerate(procs)
                if p.returncode not in (None, 0) and r not in lost
            ]
            if bad and a.elastic:
                for i, code in bad:
                    lost.add(i)
                    more = restarts < a.max_restarts and not ended_spares
                    what = "a new spare" if a.spares else "a replacement"
                    say(
                        f"{labels[i]} failed ({_describe(code)}); the others go on without it"
                        + (f"; starting {what}" if more else "")
                    )
                    if more:
                        restarts += 1
                        spawn(i % a.nproc, joiner=True, spare=bool(a.spares))
                continue
            if bad:
                failed = bad[0]
                for pf in prefixers[2 * failed[0] : 2 * failed[0] + 2]:
                    pf.thread.join(timeout=1)  # its last words (a traceback) first
                say(
                    f"{labels[failed[0]]} failed ({_describe(failed[1])}); ending the other workers"
                )
                break
            if deadline is not None and time.monotonic() > deadline:
                say(f"the job ran past --timeout {a.timeout:g} s; ending the workers")
                failed = (None, None)
                break
            time.sleep(POLL_S)
    finally:
        end_workers(procs, a.grace)
        for pf in prefixers:
            pf.thread.join(timeout=2)  # a grandchild holding the pipe must not hang us
        reporter.close()
        if coordinator is not None:
            coordinator.stop()
        for s, h in old_handlers.items():
            signal.signal(s, h)

    if signals:
        name = signal.Signals(signals[0]).name
        say(f"interrupted by {name}; workers ended")
        return 128 + signals[0]
    if failed is None:  # a worker may have failed after the others finished
        bad = [
            (r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0 and r not in lost
        ]
        if a.elastic and len(lost) == len(procs):
            bad = [(r, procs[r].returncode) for r in sorted(lost)][:1]
        failed = bad[0] if bad else None
        if failed:
            say(f"{labels[failed[0]]} failed ({_describe(failed[1])})")
    if failed is None:
        return 0
    if failed[0] is None:
        return 124
    code = failed[1]
    return code if 0 < code < 256 else 128 + (-code if code < 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
