"""Chaos: random real faults every few seconds while the survivors train and check all_reduces.

    python -m bench chaos [--minutes 30] [--nproc 8] [--kinds sigkill,sigstop,...] [--out P]
                          [--hosts] [--every S] [--baseline] [--slow-rate 40mbit] [--count N]

A standalone coordinator (`python -m collectives.coordinator`) and --nproc workers
(bench/stress/chaos_worker.py: a checked all_reduce and a training step per step) run under this
supervisor. After the job is steady (every live worker stepping in one generation of all of
them), it waits 1-4 s, injects one fault of a random kind into a random worker
(bench/stress/chaos_faults.py: SIGKILL, SIGSTOP then SIGCONT, SIGTERM, a delayed link, a dropped
link, a coordinator SIGKILL and restart on the same address) and watches the
job recover (--every S: a fault every S s instead). With --hosts each worker runs on a
network-namespace host of its own and the coordinator on one more (tests/support/netns.py;
needs root), and two kinds need those real links (bench/stress/chaos_net.py): a host pair held
slow by tc for the rest of the run (slowlink: routed around, nothing fails) and a host cut off
for a few seconds (partition). Every worker that exits is replaced by a new one that joins the running job; a
stopped or evicted one rejoins by itself. At the end the workers agree to stop after the same
step and must all hold identical parameters.

Measured per fault: detection, from the fault to the first survivor that knows (its
PeerFailure or Evicted, or a reconstructed group; for a link fault this includes the op
timeout, since the link is slowed at the target's next step); recovery, from there to the
first correct step of the new generation. A hang is an op, reconstruct or admission wait of a
worker past --hang-after s (the worker's watchdog), a worker silent for longer (this
supervisor's), or a fault not recovered within --recover-within s. Exit status 1 if there was
any hang, wrong result (a bad sum, diverged parameters, differing final params_sha256), a
worker that crashed (an exit the faults do not explain), or a coordinator lost for good (a
restart that took longer than --coordinator-grace: every worker says so and ends, and the run
stops there). Each restart is timed, kill to listening, and the members' wait for it.

Throughput: training steps per second over the fault window (each step one global batch,
whatever the world size). --baseline first runs the same job for as long with no fault and
reports the share of its throughput kept under faults.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import random
import re
import secrets
import signal
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.netns import Hosts  # noqa: E402  (network-namespace hosts)
from support.procs import ProcessSet, clean_env  # noqa: E402  (the tests' process harness)

from bench.stress import chaos_faults as faults  # noqa: E402
from bench.stress.chaos_net import Network  # noqa: E402
from bench.stress import resources  # noqa: E402
from bench.stress.chaos_worker import LOST_EXIT  # noqa: E402

EXPECTED_EXIT = {"sigkill": {-9}, "sigterm": {143, -15}}
NET = 87  # the hosts' link-local subnet (169.254.NET.x) and namespace names' number
TAG = "cs"  # this bench's namespaces: cshI_NET_PID, never another run's


class Worker:
    def __init__(self, name, proc, host):
        self.name, self.proc, self.pid = name, proc, proc.pid
        self.host = host  # its namespace host (--hosts), None on the loopback
        self.stopped = False
        self.last_seen = time.monotonic()
        self.last_step = None  # its latest step event
        self.expected_exit: set = set()


class Job(ProcessSet):
    """The coordinator process and the workers, with the events they report."""

    def __init__(self, tmp, a, rng, hosts=None):
        super().__init__(tmp)
        self.a, self.rng, self.hosts = a, rng, hosts
        # --hosts: worker i on host i, the coordinator on host nproc
        self.net = None if hosts is None else Network(hosts, a.nproc, a.slow_rate, a.slow_pairs)
        self.coord_ip = "127.0.0.1" if hosts is None else hosts.ips[a.nproc]
        self.control = str(pathlib.Path(tmp) / "control")
        os.makedirs(self.control)
        self.env = clean_env(
            COLLECTIVES_JOB_SECRET=secrets.token_hex(16),
            COLLECTIVES_HEARTBEAT_INTERVAL=a.heartbeat_interval,
            COLLECTIVES_HEARTBEAT_TIMEOUT=a.heartbeat_timeout,
            # how long the members wait for a restarted coordinator: its restart (kill, the
            # pause, a Python start-up in a namespace on a loaded host, the members' reconnect)
            # must fit, or every member ends with CoordinatorLost
            COLLECTIVES_COORDINATOR_GRACE=a.coordinator_grace,
            # on hosts, the schedules for a core per rank (as tests/support/failslow_runs.py
            # runs them): the ring-shaped ones that a slow link slows and a reroute avoids
            **({} if hosts is None else {"COLLECTIVES_CROWDED": "0"}),
        )
        self.workers: dict[str, Worker] = {}
        self.coordinators = 0
        self.restarts: list[float] = []  # s from each coordinator kill to its successor listening
        self.killed_at: float | None = None
        self.port = 0
        self.coord_name = None
        self.start_coordinator()

    def start_coordinator(self):
        self.coordinators += 1
        name = f"coordinator{self.coordinators}"
        port_file = pathlib.Path(self.tmp) / f"{name}.port"
        self.spawn(
            name,
            [
                *self.prefix(self.a.nproc),
                sys.executable,
                "-m",
                "collectives.coordinator",
                "--host",
                self.coord_ip,
                "--port",
                self.port,
                "--port-file",
                port_file,
                "--world-size",
                self.a.nproc,
                "--heartbeat-interval",
                self.a.heartbeat_interval,
            ],
            self.env,
        )
        self.port = int(self.wait_for_file(port_file, 30, f"port from {name}"))
        self.coord_name = name
        if self.killed_at is not None:
            self.restarts.append(time.monotonic() - self.killed_at)
            self.killed_at = None

    def kill_coordinator(self):
        os.kill(self.procs[self.coord_name].pid, signal.SIGKILL)
        self.killed_at = time.monotonic()

    def away(self) -> list[float]:
        """How long each member found the coordinator away, from the library's warning
        ("the coordinator at ... is back after X s") in the workers' stderr."""
        found = []
        for name in self.workers:
            found += [float(x) for x in re.findall(r"is back after ([0-9.]+) s", self.stderr(name))]
        return found

    def prefix(self, host: int) -> list[str]:
        return [] if self.hosts is None else self.hosts.prefix(host)

    def start_worker(self, rank: int | None, host: int):
        name = f"w{len(self.workers)}"
        env = dict(self.env, COLLECTIVES_COORDINATOR=f"{self.coord_ip}:{self.port}")
        if rank is None:
            env["COLLECTIVES_JOIN"] = "1"
        else:
            env.update(RANK=str(rank), WORLD_SIZE=str(self.a.nproc))
        proc = self.spawn(
            name,
            [
                *self.prefix(host),
                sys.executable,
                ROOT / "bench" / "stress" / "chaos_worker.py",
                "--timeout",
                self.a.op_timeout,
                "--hang-after",
                self.a.hang_after,
                "--control",
                self.control,
                "--world-size",
                self.a.nproc,
                "--count",
                self.a.count,
            ],
            env,
        )
        self.workers[name] = Worker(name, proc, None if self.hosts is None else host)

    def live(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.proc.poll() is None]

    def poll(self) -> list[dict]:
        """Take the events that came since the last call."""
        new = []
        while not self.events.empty():
            e = self.events.get()
            self.seen.append(e)
            new.append(e)
            w = self.workers.get(e["proc"])
            if w is not None:
                w.last_seen = time.monotonic()
                if e["event"] == "step":
                    w.last_step = e
        return new

    def steady(self) -> bool:
        """Every live worker's latest step is recent, correct, in one generation of all of them."""
        live = self.live()
        steps = [w.last_step for w in live]
        if not live or any(s is None or time.time() - s["t"] > 2.0 for s in steps):
            return False
        return len({(s["gen"], s["ws"]) for s in steps}) == 1 and steps[0]["ws"] == len(live)


class Fault:
    def __init__(self, kind, target, gen):
        self.kind, self.target, self.gen = kind, target, gen
        self.t = time.time()
        self.detected = self.recovered = None


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench chaos", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="of faults (default 30)")
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument(
        "--kinds",
        default=None,
        help=f"fault kinds, from {','.join(faults.KINDS)} (default: all; without --hosts: "
        f"all but {','.join(sorted(faults.HOSTS_ONLY))})",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--hosts",
        action="store_true",
        help="each worker on a network-namespace host of its own, the coordinator on one "
        "more (needs root); adds the kinds slowlink and partition",
    )
    p.add_argument(
        "--every",
        type=float,
        default=None,
        help="a fault every S s (from the last one's injection, once the job is steady "
        "and the last one recovered); default: 1-4 s after the last recovery",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="first a fault-free run of the same length and options: the throughput kept",
    )
    p.add_argument("--slow-rate", default="40mbit", help="a slow link's rate (tc; slowlink)")
    p.add_argument(
        "--slow-pairs", type=int, default=2, help="the most host pairs held slow at once"
    )
    p.add_argument(
        "--count", type=int, default=256, help="elements (float32) of the checked all_reduce"
    )
    p.add_argument("--heartbeat-interval", type=float, default=0.2)
    p.add_argument("--heartbeat-timeout", type=float, default=2.0)
    p.add_argument("--op-timeout", type=float, default=3.0)
    p.add_argument(
        "--hang-after",
        type=float,
        default=30.0,
        help="an op, reconstruct or admission wait longer than this is a hang",
    )
    p.add_argument(
        "--coordinator-grace",
        type=float,
        default=20.0,
        help="s the members wait for a restarted coordinator (COLLECTIVES_COORDINATOR_GRACE; "
        "the library's default, 3 heartbeat timeouts, is shorter than a restart on a loaded "
        "host: bench/results/chaos/README.md)",
    )
    p.add_argument(
        "--recover-within",
        type=float,
        default=60.0,
        help="a fault not recovered from within this many seconds is a hang",
    )
    p.add_argument("--out", default=None, help="write PATH.json and PATH.txt")
    p.add_argument(
        "--events",
        action="store_true",
        help="with --out, also every event of the run (and of the baseline) as "
        "PATH.events.jsonl: the steps' timeline, the faults, the errors",
    )
    a = p.parse_args(argv)
    if a.kinds is None:
        a.kinds = ",".join(faults.KINDS if a.hosts else faults.DEFAULT_KINDS)
    a.kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in a.kinds if k not in faults.KINDS]
    if bad or not a.kinds:
        p.error(f"--kinds: unknown {bad}; choose from {','.join(faults.KINDS)}")
    needs_hosts = sorted(set(a.kinds) & faults.HOSTS_ONLY)
    if needs_hosts and not a.hosts:
        p.error(f"--kinds: {','.join(needs_hosts)}: only with --hosts (they need real links)")
    if a.every is not None and a.every <= 0:
        p.error("--every must be > 0")
    if a.nproc < 3:
        p.error("--nproc must be >= 3 (a fault leaves at least 2 survivors)")
    return a


def run(a, inject: bool = True) -> dict:
    """One run: --minutes of faults (or, inject=False, of none: the baseline)."""
    rng = random.Random(a.seed)
    out = {"faults": [], "hangs": [], "crashes": [], "lost": [], "replacements": 0}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        # the namespaces go last, whatever happened: every process inside them dies with them
        hosts = stack.enter_context(Hosts(a.nproc + 1, NET, tag=TAG)) if a.hosts else None
        job = Job(tmp, a, rng, hosts)
        out["events"] = job.seen
        try:
            for r in range(a.nproc):
                job.start_worker(r, r)
            _wait(
                job,
                lambda: (_tick(job, out, None), job.steady())[1],
                180,
                "the first steady job",
                out,
            )
            begin = time.monotonic()
            end = begin + a.minutes * 60
            out["window"] = [time.time(), _latest_step(job)]

            def after(since):  # when the next fault is due
                return since + (a.every if a.every is not None else rng.uniform(1, 4))

            next_at, pending = after(begin), None
            while time.monotonic() < end and not out["lost"]:
                _tick(job, out, pending)
                if pending is not None:
                    if pending.recovered is not None:
                        pending = None
                        if a.every is None:
                            next_at = after(time.monotonic())
                    elif time.time() - pending.t > a.recover_within:
                        out["hangs"].append(
                            f"{pending.kind} into {pending.target}: no "
                            f"recovery within {a.recover_within:g} s"
                        )
                        pending, next_at = None, after(time.monotonic())
                elif inject and time.monotonic() >= next_at and job.steady():
                    pending = _inject(job, rng, a, out)
                    if a.every is not None:
                        next_at = after(time.monotonic())
                time.sleep(0.05)
            # the throughput: steps of the fault window (the recovery from its last fault
            # and the stop are not in it)
            out["window"] += [time.time(), _latest_step(job)]
            if out["lost"]:  # the members gave up on the coordinator: nothing can go on
                return out
            # the end: the last fault recovered from, every replacement admitted; then all
            # stop together
            if pending is not None and not _wait(
                job,
                lambda: (_tick(job, out, pending), pending.recovered)[1],
                a.recover_within,
                f"recovery from {pending.kind} into {pending.target}",
                out,
            ):
                pending = None
            _wait(
                job,
                lambda: (_tick(job, out, None), job.steady())[1],
                a.recover_within,
                "a steady job before stopping",
                out,
            )
            (pathlib.Path(job.control) / "stop").write_text("stop")
            _wait(
                job,
                lambda: (_tick(job, out, None), not job.live())[1],
                60,
                "every worker to stop",
                out,
            )
        finally:
            job.poll()
            _keep_outputs(job, a, out)
            out["coordinators"] = job.coordinators
            out["restarts"] = job.restarts
            out["away"] = job.away()
            out["slow_pairs"] = [] if job.net is None else [list(p) for p in job.net.slow]
            for w in job.workers.values():
                if w.stopped:
                    os.kill(w.pid, signal.SIGCONT)
            job.close()
    return out


def _keep_outputs(job, a, out):
    """After a hang or a crash, every process's output -- the watchdogs' stack dumps of the
    hung threads included -- is kept (OUT.procs/, or a new temp dir), for whoever looks."""
    if not (out["hangs"] or out["crashes"] or out["lost"]):
        return
    dest = (
        pathlib.Path(str(a.out) + ".procs")
        if a.out
        else pathlib.Path(tempfile.mkdtemp(prefix="chaos-procs-"))
    )
    dest.mkdir(parents=True, exist_ok=True)
    for name in list(job.procs):
        (dest / f"{name}.log").write_text(job.text(name) + "\n--- stderr ---\n" + job.stderr(name))
    out["kept"] = str(dest)


def _wait(job, done, timeout, what, out):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.1)
    out["hangs"].append(f"no {what} within {timeout:g} s")
    return False


def _tick(job, out, pending):
    """Read events; replace workers that exited; note hangs and crashes; time the fault."""
    for e in job.poll():
        w = job.workers.get(e["proc"])
        if e["event"] == "hang":
            out["hangs"].append(f"{e['proc']}: {e['what']} ran {e['seconds']} s")
        elif e["event"] == "coordinator_lost":
            out["lost"].append(f"{e['proc']} (rank {e['rank']}): {e['error']}")
        elif e["event"] == "exit" and w is not None:
            stopping = (pathlib.Path(job.control) / "stop").exists() or bool(out["lost"])
            lost = e["code"] == LOST_EXIT and out["lost"]  # said so: the run's failure
            if not (e["code"] in w.expected_exit or (stopping and e["code"] == 0) or lost):
                out["crashes"].append(
                    f"{w.name} exited with status {e['code']}: {job.stderr(w.name)[-600:]}"
                )
            if not stopping:
                job.start_worker(None, w.host)
                out["replacements"] += 1
        if pending is not None and e["t"] > pending.t:
            if pending.detected is None and (
                e["event"] in ("failure", "evicted", "error")
                or (e["event"] == "reconstructed" and e["gen"] > pending.gen)
            ):
                pending.detected = e["t"]
            if (
                e["event"] == "step"
                and e["ok"]
                and pending.recovered is None
                and (e["gen"] > pending.gen or not faults.CHANGES_GENERATION[pending.kind])
            ):
                pending.detected = pending.detected or pending.t
                pending.recovered = e["t"]
    now = time.monotonic()
    for w in job.live():
        if not w.stopped and now - w.last_seen > job.a.hang_after + 15:
            out["hangs"].append(f"{w.name} silent for {now - w.last_seen:.0f} s")
            w.last_seen = now


def _latest_step(job) -> int:
    """The furthest step any worker has reported."""
    job.poll()
    return max((w.last_step["step"] for w in job.workers.values() if w.last_step), default=0)


def _inject(job, rng, a, out) -> Fault | None:
    # once --slow-pairs pairs are slow (for good), slowlink is drawn no more
    kinds = [k for k in a.kinds if k != "slowlink" or job.net.can_slow()]
    if not kinds:  # --kinds slowlink, and every pair it may slow is slow: the job runs on
        return None
    kind = rng.choice(kinds)
    target = rng.choice(job.live())
    gen = target.last_step["gen"]
    target.expected_exit = EXPECTED_EXIT.get(kind, set())
    f = Fault(kind, target.name, gen)
    faults.INJECT[kind](job, target)
    if kind == "coordinator":
        f.t = time.time()  # measured from the restart: it is away on purpose
    out["faults"].append(f)
    return f


def stats(values) -> str:
    if not values:
        return "-"
    v = sorted(values)
    p95 = v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))]
    return f"{statistics.median(v):.2f} / {p95:.2f} / {v[-1]:.2f}"


def summarize(out, a, wall: float) -> tuple[str, dict, list[str]]:
    events = out["events"]
    out["finals"] = [e for e in events if e["event"] == "final"]
    wrong = [e for e in events if e["event"] == "step" and not e["ok"]]
    diverged = [e for e in events if e["event"] == "diverged"]
    shas = {e["params_sha256"] for e in out["finals"]}
    gens = {e["gen"] for e in events if e["event"] == "reconstructed"}
    steps = max((e["step"] for e in out["finals"]), default=0)
    failures = []
    n_wrong = len(wrong) + len(diverged) + (1 if len(shas) > 1 else 0)
    if n_wrong:
        failures.append(
            f"{len(wrong)} wrong sums, {len(diverged)} divergences, "
            f"{len(shas)} distinct final params_sha256"
        )
    if not out["finals"]:
        failures.append("no worker finished")
    leaks, grew = _leaks(events)
    failures += leaks
    failures += [f"hang: {h}" for h in out["hangs"]]
    failures += [f"crash: {c}" for c in out["crashes"]]
    failures += [f"coordinator lost for good: {x}" for x in out["lost"][:1]]
    if out.get("kept"):
        failures.append(f"every process's output: {out['kept']}")
    rows = [
        f"chaos: {a.nproc} workers, {a.minutes:g} min of faults ({wall / 60:.1f} min in "
        f"all), heartbeat {a.heartbeat_interval:g} s / timeout {a.heartbeat_timeout:g} s, "
        f"op timeout {a.op_timeout:g} s, hang bound {a.hang_after:g} s",
        f"{'fault':12} {'count':>5} {'detect s (median / p95 / max)':>30} "
        f"{'recover s (median / p95 / max)':>31}",
    ]
    record = {
        "nproc": a.nproc,
        "minutes": a.minutes,
        "kinds": a.kinds,
        "seed": a.seed,
        "heartbeat_timeout": a.heartbeat_timeout,
        "op_timeout": a.op_timeout,
        "hang_after": a.hang_after,
        "faults": {},
    }
    every = [f for f in out["faults"] if f.recovered is not None]
    for kind in a.kinds + ["all"]:
        mine = every if kind == "all" else [f for f in every if f.kind == kind]
        count = len(out["faults"]) if kind == "all" else sum(f.kind == kind for f in out["faults"])
        d = [f.detected - f.t for f in mine]
        r = [f.recovered - f.detected for f in mine]
        rows.append(f"{kind:12} {count:>5} {stats(d):>30} {stats(r):>31}")
        record["faults"][kind] = {"count": count, "detect": d, "recover": r}
    if len(out.get("window", [])) != 4:  # the run ended before its fault window did
        failures.append("no fault window measured")
        out["window"] = [0.0, 0, 1.0, 0]
    t0, s0, t1, s1 = out["window"]
    rate = (s1 - s0) / (t1 - t0)
    steps_ev = [e for e in events if e["event"] == "step" and e["t"] >= t0]
    rerouted = [e for e in steps_ev if e.get("rerouted")]
    rows += [
        f"throughput over the {(t1 - t0) / 60:.1f} min window: {s1 - s0} steps, "
        f"{rate:.2f} steps/s; steps reported on a rerouted schedule: "
        f"{len(rerouted)} of {len(steps_ev)}",
        f"reconstructions (generations formed): {len(gens)}; replacements started: "
        f"{out['replacements']}; rejoins after eviction: "
        f"{sum(1 for e in events if e['event'] == 'joined' and e.get('rejoin'))}; "
        f"coordinator starts: {out['coordinators']}; restarts, kill to listening s "
        f"(median / p95 / max): {stats(out.get('restarts', []))}; the members' wait for it "
        f"s: {stats(out.get('away', []))} (grace {a.coordinator_grace:g} s)",
        f"training steps: {steps}; hangs: {len(out['hangs'])}; wrong results: {n_wrong}; "
        f"crashes: {len(out['crashes'])}; finished workers: {len(out['finals'])}, "
        f"identical params: {len(shas) == 1}",
        f"resources of the {grew['workers']} workers sampled early and at the end at the "
        "same world size, largest growth (bound): "
        + ", ".join(f"{k} {grew[k]:+g} (+{resources.BOUNDS[k]})" for k in resources.FIELDS),
        "per worker: "
        + ", ".join(
            f"{p} {g['rejoins']} rejoins fds {g['fds']:+d}" for p, g in grew["by_worker"].items()
        ),
    ]
    record.update(
        reconstructions=len(gens),
        replacements=out["replacements"],
        hangs=out["hangs"],
        wrong=n_wrong,
        crashes=out["crashes"],
        finals=len(out["finals"]),
        identical_params=len(shas) == 1,
        steps=steps,
        lost=out["lost"],
        error_events=sum(1 for e in events if e["event"] == "error"),
        restarts_s=out.get("restarts", []),
        away_s=out.get("away", []),
        coordinator_grace=a.coordinator_grace,
        wall_s=round(wall),
        growth=grew,
        leaks=leaks,
        window_s=round(t1 - t0, 1),
        window_steps=s1 - s0,
        steps_per_s=rate,
        rerouted_reports=len(rerouted),
        step_reports=len(steps_ev),
        schedules=sorted({e["rerouted"] for e in rerouted}),
        slow_pairs=out.get("slow_pairs", []),
    )
    return "\n".join(rows), record, failures


def _leaks(events) -> tuple[list[str], dict]:
    """Growth of each resource between a worker's early and end samples (taken at the same
    world size, since arenas mapped follow it): what reconstructions and rejoins left."""
    by = {}
    for e in events:
        if e["event"] == "sample":
            by.setdefault(e["proc"], {})[e["phase"]] = e
    pairs = [
        (p, s["early"], s["end"])
        for p, s in by.items()
        if len(s) == 2 and s["early"]["ws"] == s["end"]["ws"]
    ]
    grew = {
        k: max((end[k] - early[k] for _, early, end in pairs), default=0) for k in resources.FIELDS
    }
    grew["workers"] = len(pairs)
    # each worker's growth, with what its fds and threads were made of at both ends
    grew["by_worker"] = {
        p: {
            "rejoins": end.get("rejoins"),
            **{k: end[k] - early[k] for k in resources.FIELDS},
            **{
                f"{k}_{ph}": e.get(k)
                for k in ("fd_kinds", "threads_named")
                for ph, e in (("early", early), ("end", end))
            },
        }
        for p, early, end in pairs
    }
    leaks = [
        f"leak: {p}: {k} grew from {early[k]} to {end[k]} (bound +{resources.BOUNDS[k]})"
        for p, early, end in pairs
        for k in resources.FIELDS
        if end[k] - early[k] > resources.BOUNDS[k]
    ]
    return leaks, grew


def _write_events(path: pathlib.Path, out: dict, base: dict | None) -> None:
    """Every event, one JSON line each (`run`: "baseline" or "faults"), and each fault
    injected (event "inject": its kind, target and time)."""
    import json

    with path.open("w") as f:
        for name, o in (("baseline", base), ("faults", out)):
            if o is None:
                continue
            for e in o["events"]:
                f.write(json.dumps({"run": name, **e}) + "\n")
            for x in o["faults"]:
                row = {"run": name, "event": "inject", "kind": x.kind, "target": x.target}
                f.write(json.dumps({**row, "t": x.t, "gen": x.gen}) + "\n")


def main(argv=None) -> int:
    a = parse_args(argv)
    base, base_out = None, None
    if a.baseline:  # the same job for as long, with no fault: what the faults cost
        t0 = time.monotonic()
        base_out = run(a, inject=False)
        base = summarize(base_out, a, time.monotonic() - t0)
    t0 = time.monotonic()
    out = run(a)
    text, record, failures = summarize(out, a, time.monotonic() - t0)
    if a.events and a.out:
        _write_events(pathlib.Path(str(a.out) + ".events.jsonl"), out, base_out)
    if base is not None:
        b_text, b_record, b_failures = base
        kept = record["steps_per_s"] / b_record["steps_per_s"]
        text = "\n".join(
            [
                text,
                "",
                f"fault-free run of the same length and options (--baseline): "
                f"{b_record['steps_per_s']:.2f} steps/s over {b_record['window_s'] / 60:.1f} min; "
                f"throughput kept under faults: {kept:.1%}",
                *("  baseline " + ln for ln in b_text.splitlines()),
            ]
        )
        record["baseline"] = b_record
        record["kept"] = kept
        failures += [f"baseline: {f}" for f in b_failures]
    record["failures"] = failures
    return resources.conclude(
        text,
        record,
        failures,
        a.out,
        "no hang, no wrong result, every survivor holds the same parameters",
    )


if __name__ == "__main__":
    sys.exit(main())
