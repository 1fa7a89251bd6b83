"""Data-parallel training of a small MLP on scikit-learn's bundled digits (no download),
over collectives, surviving failures.

    python -m collectives.launch --nproc 4 examples/train_digits.py --epochs 20
    python -m collectives.launch --nproc 4 --elastic examples/train_digits.py --kill-rank 2 \
        --kill-at-step 30                    # the other three go on
    python -m collectives.launch --nproc 4 --elastic --max-restarts 1 examples/train_digits.py \
        --kill-rank 2 --kill-at-step 60 --await-world-size 4   # a replacement joins
    python examples/train_digits.py            # alone: one rank, its own coordinator

Every live rank ends with exactly one line on stdout:
    final rank=R world_size=K generation=G step=S test_acc=A params_sha256=H
and every member holds the same parameters, so every H is the same.

Fault flags (the rank numbers are the launch ranks, RANK at start-up; steps are committed
optimizer steps):
  --kill-rank R --kill-at-step S    rank R SIGKILLs itself inside the first all_reduce of
                                    step S (a crash, no goodbye)
  --stall-rank R --stall-at-step S  rank R stops inside that all_reduce for --stall-seconds
                                    (its heartbeat goes on): the others' collective times out,
                                    the coordinator evicts R, R gets cl.Evicted and rejoins
  --slow-links-around R --slow-at-step S [--slow-seconds T]
                                    at step S the links into and out of rank R (R-1 -> R and
                                    R -> R+1) hold every message for T s (default 60), in this
                                    and every later generation: an unstable network. The
                                    all_reduce stalls, the coordinator blames R (it is on both
                                    slow links; where the op shows only one, the ranks' link
                                    probes show the other) and evicts it, the others drop
                                    the stalled step and go on (make demo-stall)
  --leave-when-evicted              an evicted rank exits (0) instead of rejoining
  --term-rank R --term-at-step S    rank R sends itself SIGTERM at step S (preemption: it
                                    leaves the group at once and exits 0; the others go on)
  --join-at-step S                  launch rank 0 starts one more worker at once (importing
                                    torch takes seconds); it waits in
                                    cl.init_process_group(join=True) and the members admit
                                    it at step S (ElasticTrainer.grow)
  --await-world-size K              at the end, wait until K members are back (a replacement
                                    started by `launch --elastic --max-restarts` needs seconds
                                    to import torch; without this it may find the job over)
Faults from outside work too: every worker prints `[train_digits] launch rank R pid P ...`;
kill -KILL / -STOP (then -CONT: it is evicted and rejoins) / -TERM (it leaves at once and
exits 0) that pid, and the others go on. --print-every N makes rank 0 print its step.
They need the library's failure recovery (pg.reconstruct, cl.PeerFailure, joiners); a library
without it refuses them with a clear message instead of hanging.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

import collectives as cl

SPARE_TIMEOUT = 24 * 3600.0  # a spare waits to be admitted while the job runs
JOIN_TIMEOUT = 90.0  # a joiner (or an evicted rank) may wait this long to be admitted


def say(line, stream=None):
    """One write per line: rank 0 and the joiner it starts share a pipe, and print() writes
    the text and the newline separately, so two processes' lines could interleave."""
    stream = stream or sys.stderr
    stream.write(line + "\n")
    stream.flush()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=64, help="global batch size (all ranks)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--no-overlap", action="store_true", help="no gradient hooks")
    p.add_argument("--timeout", type=float, default=5.0, help="collective deadline (s)")
    p.add_argument(
        "--admit-every",
        type=int,
        default=10,
        help="let joiners in every N steps (one coordinator round trip)",
    )
    p.add_argument("--checkpoint", default=None, help="atomic checkpoint file, each epoch")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--print-every",
        type=int,
        default=0,
        metavar="N",
        help="rank 0 prints a `step S world_size K generation G` line every N "
        "committed steps (for logs and tests; 0: never)",
    )
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--kill-at-step", type=int, default=30)
    p.add_argument("--stall-rank", type=int, default=None)
    p.add_argument("--stall-at-step", type=int, default=30)
    p.add_argument("--stall-seconds", type=float, default=12.0)
    p.add_argument("--slow-links-around", type=int, default=None, metavar="R")
    p.add_argument("--slow-at-step", type=int, default=40)
    p.add_argument("--slow-seconds", type=float, default=60.0)
    p.add_argument(
        "--leave-when-evicted",
        action="store_true",
        help="an evicted rank leaves the job instead of rejoining it",
    )
    p.add_argument("--term-rank", type=int, default=None)
    p.add_argument("--term-at-step", type=int, default=30)
    p.add_argument("--join-at-step", type=int, default=None)
    p.add_argument(
        "--await-world-size",
        type=int,
        default=None,
        metavar="K",
        help="after training, wait (up to 90 s) until the group has K members "
        "again, admitting a replacement that is still starting up, so that it "
        "ends with the others (useful with launch --elastic --max-restarts)",
    )
    p.add_argument("--joiner", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def load_data(seed=0):
    """scikit-learn's bundled digits: 1797 8x8 images, read straight from the file that
    sklearn.datasets.load_digits reads (importing sklearn itself costs seconds per worker),
    split 75/25 per class with a fixed seed, standardised with the training split's stats."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        sys.exit("train_digits: needs scikit-learn (pip install scikit-learn) for its data set")
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
    data = np.loadtxt(path, delimiter=",")
    x, y = (data[:, :-1] / 16.0).astype(np.float32), data[:, -1].astype(np.int64)
    rng = np.random.RandomState(seed)
    test = np.zeros(len(y), bool)
    for c in range(10):  # stratified: 25 % of every class is held out
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: len(idx) // 4]] = True
    xtr, ytr, xte, yte = x[~test], y[~test], x[test], y[test]
    mean, std = xtr.mean(0), xtr.std(0) + 1e-3
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return (t((xtr - mean) / std), t(ytr)), (t((xte - mean) / std), t(yte))


def make_model(hidden, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def params_sha256(model) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def require_fault_support(args):
    """Refuse fault flags, clearly, when the library cannot recover from faults."""
    wanted = [
        f
        for f, v in (
            ("--kill-rank", args.kill_rank),
            ("--stall-rank", args.stall_rank),
            ("--slow-links-around", args.slow_links_around),
            ("--term-rank", args.term_rank),
            ("--join-at-step", args.join_at_step),
        )
        if v is not None
    ]
    if args.joiner:
        wanted.append("--joiner")
    if not wanted:
        return
    missing = []
    if not hasattr(cl.ProcessGroup, "reconstruct"):
        missing.append("ProcessGroup.reconstruct")
    if not hasattr(cl, "inject_faults"):
        missing.append("cl.inject_faults")
    if "join" not in inspect.signature(cl.init_process_group).parameters:
        missing.append("init_process_group(join=True)")
    if missing:
        sys.exit(
            f"train_digits: {', '.join(wanted)} need(s) the library's failure recovery "
            f"({', '.join(missing)}), which this version of collectives lacks"
        )


def standalone_env():
    """`python examples/train_digits.py` without a launcher: one rank, and this process hosts
    the coordinator on any free port (a joiner it starts inherits the address)."""
    if "RANK" in os.environ or "COLLECTIVES_JOIN" in os.environ:
        return None
    from collectives.membership.server import Coordinator

    coordinator = Coordinator("127.0.0.1", 0, 1).start()
    os.environ.update(RANK="0", WORLD_SIZE="1", COLLECTIVES_COORDINATOR=coordinator.address)
    return coordinator


class Faults:
    """The on_step hook: fires each requested fault once, at a step boundary."""

    def __init__(self, args, launch_rank, world_size):
        self.args, self.launch_rank, self.world_size = args, launch_rank, world_size
        self.stalled = self.killed = self.grown = self.termed = self.slowed = False
        self.slowed_in = None  # the generation whose links were slowed last
        self.child = None
        self.printed = -1
        self.first_step = None  # a joiner: the step it started at (its first one is said)

    def __call__(self, tr):
        a, pg = self.args, tr.pg
        if a.joiner and self.first_step is None:
            self.first_step = tr.step
        elif a.joiner and self.first_step is not None and tr.step > self.first_step >= 0:
            self.first_step = -1  # said once (bench/studies/recovery.py times it)
            say(
                f"[train_digits] joiner pid {os.getpid()}: first committed step {tr.step} as "
                f"rank {pg.rank} of {pg.world_size} at t={time.time():.3f}"
            )
        if (
            a.print_every
            and pg.rank == 0
            and tr.step % a.print_every == 0
            and tr.step != self.printed
        ):
            self.printed = tr.step
            say(
                f"[train_digits] step {tr.step} world_size {pg.world_size} generation "
                f"{pg.generation}"
            )
        # kill and stall go through the library's fault injection, armed for this rank's next
        # collective (the first gradient bucket of this step): the rank dies, or stops with its
        # heartbeat still going, in the middle of an all_reduce the others are waiting in.
        if a.kill_rank == self.launch_rank and tr.step >= a.kill_at_step and not self.killed:
            self.killed = True
            self._arm(pg, f"kill:{pg.rank}@op={pg._seq}", f"SIGKILL at step {tr.step}")
        if a.stall_rank == self.launch_rank and tr.step >= a.stall_at_step and not self.stalled:
            self.stalled = True
            self._arm(
                pg,
                f"stall:{pg.rank}@op={pg._seq}:{a.stall_seconds}s",
                f"stall {a.stall_seconds:g} s at step {tr.step}",
            )
        if a.slow_links_around is not None and (
            (tr.step >= a.slow_at_step and not self.slowed)
            or (self.slowed and pg.generation != self.slowed_in)
        ):
            self._slow_links(pg, tr.step)
        if a.term_rank == self.launch_rank and tr.step >= a.term_at_step and not self.termed:
            self.termed = True
            say(
                f"[train_digits] launch rank {self.launch_rank} (rank {pg.rank}): SIGTERM "
                f"to itself at step {tr.step}"
            )
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's preemption would
        if (
            a.join_at_step is not None
            and not a.joiner
            and tr.step >= a.join_at_step
            and not self.grown
        ):
            # every member, at the same step: admit the joiner rank 0 started at launch
            # (reconstruct until it is in; it needed the head start to import torch)
            self.grown = True
            if not tr.grow(tr.pg.world_size + 1, timeout=JOIN_TIMEOUT):
                say("[train_digits] no joiner arrived")

    def _slow_links(self, pg, step):
        """Every rank at the same step boundary installs the rules whose receiving end it is
        (a link fault acts where the messages arrive). The rules name launch ranks and are
        installed again in every later generation: the network stays slow, as a real one
        would, so the wrong rank's eviction would show as a second stall."""
        a = self.args
        r, n = a.slow_links_around, self.world_size
        spec = (
            f"delay:{(r - 1) % n}->{r}:{a.slow_seconds:g}s;"
            f"delay:{r}->{(r + 1) % n}:{a.slow_seconds:g}s"
        )
        again = self.slowed
        self.slowed, self.slowed_in = True, pg.generation
        for rule in cl.inject_faults(pg, spec, by_launch_rank=True):
            say(
                f"[train_digits] step {step}: link {rule.src}->{rule.rank} "
                f"{'still slow in generation %d' % pg.generation if again else 'slowed'}: it "
                f"holds every message for {rule.seconds:g} s (fault delay:{rule.src}->"
                f"{rule.rank})"
            )

    def start(self):
        """Launch rank 0 starts the joiner process at once; it waits to be admitted."""
        if self.args.join_at_step is not None and self.launch_rank == 0 and not self.args.joiner:
            self.child = spawn_joiner()

    def _arm(self, pg, spec, what):
        say(
            f"[train_digits] launch rank {self.launch_rank} (rank {pg.rank}): {what} (fault {spec})"
        )
        cl.inject_faults(pg, spec)

    def reap(self, timeout=60.0):
        if self.child is None:
            return
        try:
            self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def spawn_joiner():
    argv = [a for a in sys.argv[1:]]
    env = dict(os.environ, COLLECTIVES_JOIN="1")
    env.pop("RANK", None)
    say("[train_digits] starting a joiner")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--joiner"], env=env)


def join_group(args):
    # a warm spare (the launcher's --spares) waits for a failure as long as the job runs
    spare = os.environ.get("COLLECTIVES_SPARE") == "1"
    pg = cl.init_process_group(
        join=True, timeout=SPARE_TIMEOUT if spare else max(JOIN_TIMEOUT, args.timeout)
    )
    pg.timeout = args.timeout  # the long deadline was for the admission wait only
    return pg


def main(argv=None):
    args = parse_args(argv)
    # A replacement started by `collectives.launch --elastic --max-restarts K` has no RANK and
    # COLLECTIVES_JOIN=1: it is a joiner too.
    args.joiner = args.joiner or (
        "RANK" not in os.environ and os.environ.get("COLLECTIVES_JOIN", "") not in ("", "0")
    )
    require_fault_support(args)
    torch.set_num_threads(1)  # N workers share few cores: one thread each, no oversubscription
    standalone_env()
    (xtr, ytr), (xte, yte) = load_data(args.seed)
    model = make_model(args.hidden, args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    if args.joiner:
        say(f"[train_digits] joiner pid {os.getpid()} waits to be admitted")
        pg = join_group(args)
        launch_rank = -1
    else:
        pg = cl.init_process_group(timeout=args.timeout)
        launch_rank = pg.rank
    rejoin = None
    if (
        hasattr(cl.ProcessGroup, "reconstruct")
        and not args.leave_when_evicted
        and "join" in inspect.signature(cl.init_process_group).parameters
    ):

        def rejoin():
            return join_group(args)

    # Who is who, so that a test or an operator can signal a worker from outside
    # (kill -STOP <pid>, kill -TERM <pid>, ...).
    say(
        f"[train_digits] {'joiner' if args.joiner else f'launch rank {launch_rank}'} "
        f"pid {os.getpid()} is rank {pg.rank} of {pg.world_size} (generation "
        f"{pg.generation})"
    )
    faults = Faults(args, launch_rank, int(os.environ.get("WORLD_SIZE", pg.world_size)))
    faults.start()
    trainer = cl.ElasticTrainer(
        model,
        optimizer,
        pg,
        (xtr, ytr),
        global_batch=args.batch,
        epochs=args.epochs,
        seed=args.seed,
        bucket_mb=args.bucket_mb,
        overlap=not args.no_overlap,
        checkpoint=args.checkpoint,
        progress=not args.no_progress,
        admit_every=args.admit_every,
        on_step=faults,
        rejoin=rejoin,
        joiner=args.joiner,
    )
    t0 = time.perf_counter()
    try:
        summary = trainer.fit()
    except cl.Evicted as exc:
        if rejoin is not None:
            raise
        say(f"[train_digits] launch rank {launch_rank} evicted, leaving the job: {exc}")
        trainer.pg.close()
        faults.reap()
        return 0
    elapsed = time.perf_counter() - t0
    if summary["left"]:
        say(f"[train_digits] launch rank {launch_rank} left (preempted) at step {summary['step']}")
        teardown(trainer.pg, faults)
        return 0
    if args.await_world_size and trainer.pg.world_size < args.await_world_size:
        if not trainer.grow(args.await_world_size, timeout=JOIN_TIMEOUT):
            say(f"[train_digits] the group did not get back to {args.await_world_size} members")
    pg = trainer.pg
    model.eval()
    with torch.no_grad():
        test_acc = float((model(xte).argmax(1) == yte).float().mean())
    if pg.rank == 0:
        say(
            f"[train_digits] {summary['step']} steps in {elapsed:.2f} s = "
            f"{summary['step'] / elapsed:.1f} steps/s at world size {pg.world_size}"
        )
    say(
        f"final rank={pg.rank} world_size={pg.world_size} generation={pg.generation} "
        f"step={summary['step']} test_acc={test_acc:.4f} params_sha256={params_sha256(model)}",
        sys.stdout,
    )
    try:
        pg.barrier()  # nobody tears down (rank 0 may host the coordinator) before all are done
    except cl.CollectiveError as exc:  # somebody died after training: our result stands
        say(f"[train_digits] final barrier: {exc}")
    teardown(pg, faults)
    return 0


def teardown(pg, faults):
    try:
        faults.reap()
    finally:
        try:
            pg.destroy()
        except cl.CollectiveError as exc:
            say(f"[train_digits] destroy: {exc}")


if __name__ == "__main__":
    sys.exit(main())
