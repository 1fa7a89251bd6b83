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
    torchrun's worker environment (environment.py, torchrun_env: GROUP_RANK, ROLE_RANK, ...);
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

This file runs the job (main); arguments.py reads the command line, environment.py makes a
worker's environment, hosting.py hosts the coordinator, workers.py ends the workers,
output.py prefixes their lines and reporter.py tells the coordinator of a worker's exit.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

from .arguments import parse_args
from .environment import OMP_NOTICE, omp_threads, worker_env
from .hosting import dies_with_parent, job_keys, start_coordinator
from .output import Prefixer
from .reporter import ExitReporter
from .workers import POLL_S, describe_exit, end_spares, signal_all, workers_done, end_workers


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
        signal_all(procs, signum if len(signals) == 1 else signal.SIGKILL)

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
            if spares and not ended_spares and workers_done(procs, spares):
                # the job is over: the spares still waiting are not needed (one admitted
                # ends with the others)
                ended_spares = True
                end_spares(procs, spares, lost, a.grace, say)
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
                        f"{labels[i]} failed ({describe_exit(code)}); the others go on without it"
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
                    f"{labels[failed[0]]} failed ({describe_exit(failed[1])}); ending the other workers"
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
            say(f"{labels[failed[0]]} failed ({describe_exit(failed[1])})")
    if failed is None:
        return 0
    if failed[0] is None:
        return 124
    code = failed[1]
    return code if 0 < code < 256 else 128 + (-code if code < 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
