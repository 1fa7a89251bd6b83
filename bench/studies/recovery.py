"""From a SIGKILL to every survivor's next completed op, at the library's default settings.

    python -m bench recovery [--kills 20] [--baseline-kills 5] [--spare-kills 10]
                             [--modes launcher,env,standalone] [--out bench/results/recovery/kill_to_next_op]

A job of 4 workers (bench/studies/recovery_worker.py: a 16 KiB all_reduce every 50 ms, reconstruct()
at every step boundary, default heartbeats and deadlines) runs until it is steady; one member
is SIGKILLed from outside; the figure is the time from the kill to the moment the last
survivor completed an all_reduce of the new generation (without the dead rank). A
replacement then joins, the job is steady at 4 again, and the next member is killed.
"detect" is from the kill to the last survivor learning of it (its PeerFailure, or the new
generation's first op when the death fell between two ops).

Three ways to run a job:
  launcher    python -m collectives.launch --nproc 4 --elastic (it hosts the coordinator in a
              child process and starts the replacements); any rank may be killed
  env         bare environment variables: rank 0 hosts the coordinator (MASTER_PORT=0 there);
              rank 0 is never killed (its death ends such a job); replacements with
              COLLECTIVES_JOIN=1
  standalone  python -m collectives.coordinator apart; any rank may be killed
  hosts       two network-namespace hosts of 2 workers each and the standalone coordinator on
              a third (root; tests/support/netns.py): the killed worker's host lives on, so
              its kernel closes the dead process's connections across the link

Each with every crash witness (the default, membership/liveness.py) and with heartbeats alone
(COLLECTIVES_FAILURE_DETECTION=none: the 5 s heartbeat timeout). Median and p95 (nearest
rank) with min, max and n; written to OUT.txt and OUT.json with the command that made them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "recovery_worker.py")
WORLD = 4
LINE = re.compile(r"^(?:\[(?:rank|join) \d+\] )?(\{.*\})\s*$")


class Job:
    """One job's processes and the events they print (read by one thread per process)."""

    def __init__(self, mode: str, tmp: str, witnesses: bool):
        self.mode, self.tmp = mode, tmp
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "COLLECTIVES_"))
        }
        self.env.update(
            STOP_FILE=os.path.join(tmp, "stop"), PYTHONUNBUFFERED="1", COLLECTIVES_PROGRESS="off"
        )
        if not witnesses:
            self.env["COLLECTIVES_FAILURE_DETECTION"] = "none"
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.spared: set[int] = set()  # pids never to kill (rank 0 hosting, in env mode)
        self.address = None
        self.n = 0
        self.hosts = None  # mode "hosts": the namespaces (support.netns.Hosts)
        self.host_of: dict[int, int] = {}  # worker pid -> its host, in mode "hosts"

    def _spawn(self, argv, env) -> subprocess.Popen:
        self.n += 1
        err = open(os.path.join(self.tmp, f"p{self.n}.err"), "wb")
        p = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
        p.err_path = err.name  # type: ignore[attr-defined]
        self.procs.append(p)
        threading.Thread(target=self._read, args=(p,), daemon=True).start()
        return p

    def _read(self, p):
        for raw in p.stdout:
            m = LINE.match(raw.decode(errors="replace"))
            if m:
                try:
                    e = json.loads(m.group(1))
                except ValueError:
                    continue
                with self.lock:
                    self.events.append(e)

    def _worker(self, rank: int | None, extra: dict, host: int | None = None) -> subprocess.Popen:
        env = dict(self.env, **extra)
        if rank is None:
            env["COLLECTIVES_JOIN"] = "1"
        else:
            env.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
        prefix = self.hosts.prefix(host) if host is not None else []
        p = self._spawn([*prefix, sys.executable, WORKER], env)
        if host is not None:
            self.host_of[p.pid] = host
        return p

    def _start_hosts(self):
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from support.netns import Hosts  # the namespaces the multihost tests use

        self.hosts = Hosts(3, net=81).__enter__()
        ips = self.hosts.ips
        self.env["COLLECTIVES_JOB_SECRET"] = secrets.token_hex(24)
        port_file = os.path.join(self.tmp, "port")
        coordinator = [sys.executable, "-m", "collectives.coordinator", "--host", ips[2]]
        self._spawn(
            [
                *self.hosts.prefix(2),
                *coordinator,
                "--port",
                "0",
                "--port-file",
                port_file,
                "--world-size",
                str(WORLD),
                "--quiet",
            ],
            self.env,
        )
        port = int(_wait_text(port_file, 60))
        self.address = {"COLLECTIVES_COORDINATOR": f"{ips[2]}:{port}"}
        for r in range(WORLD):
            self._worker(r, self.address, host=r // 2)

    def start(self):
        if self.mode == "hosts":
            self._start_hosts()
        elif self.mode == "launcher":
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "collectives.launch",
                    "--nproc",
                    str(WORLD),
                    "--elastic",
                    "--max-restarts",
                    "1000",
                    "--timeout",
                    "3600",
                    WORKER,
                ],
                self.env,
            )
        elif self.mode == "standalone":
            # a standalone coordinator needs the job's secret given (docs/security.md)
            self.env["COLLECTIVES_JOB_SECRET"] = secrets.token_hex(24)
            port_file = os.path.join(self.tmp, "port")
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "collectives.coordinator",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--port-file",
                    port_file,
                    "--world-size",
                    str(WORLD),
                    "--quiet",
                ],
                self.env,
            )
            port = _wait_text(port_file, 60)
            self.address = {"COLLECTIVES_COORDINATOR": f"127.0.0.1:{int(port)}"}
            for r in range(WORLD):
                self._worker(r, self.address)
        else:
            p0 = self._worker(0, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})
            self.spared.add(p0.pid)
            found = _wait_match(p0.err_path, r"hosts the coordinator at \S+:(\d+)", 60)
            self.address = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": found}
            for r in range(1, WORLD):
                self._worker(r, self.address)

    def replace(self, victim: int):
        if self.mode != "launcher":  # the elastic launcher starts its own
            self._worker(None, self.address, self.host_of.get(victim))

    def steady(self):
        """(generation, member pids) once WORLD members have each done 3 steps in the
        newest generation; else None."""
        with self.lock:
            steps = [e for e in self.events if e["event"] == "step"]
        if not steps:
            return None
        gen = max(e["gen"] for e in steps)
        counts: dict[int, int] = {}
        for e in steps:
            if e["gen"] == gen:
                assert e["ok"], e
                counts[e["pid"]] = counts.get(e["pid"], 0) + 1
        if len(counts) == WORLD and min(counts.values()) >= 3:
            return gen, sorted(counts)
        return None

    def after(self, pid: int, since: float, gen: int):
        """(first sign of the failure, first step of a later generation) of `pid` after
        `since`; each None until it happened."""
        with self.lock:
            mine = [e for e in self.events if e["pid"] == pid and e["t"] > since]
        step = next((e["t"] for e in mine if e["event"] == "step" and e["gen"] > gen), None)
        sign = next(
            (
                e["t"]
                for e in mine
                if e["event"] == "failure" or (e["event"] == "step" and e["gen"] > gen)
            ),
            None,
        )
        return sign, step

    def close(self):
        open(self.env["STOP_FILE"], "w").close()
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        if self.hosts is not None:
            self.hosts.__exit__(None, None, None)


def _wait_text(path: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        time.sleep(0.05)
    raise SystemExit(f"bench.recovery: nothing in {path} after {timeout:g} s")


def _wait_match(path: str, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, open(path, errors="replace").read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise SystemExit(f"bench.recovery: no {pattern!r} in {path} after {timeout:g} s")


def _until(what, timeout: float, why: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.02)
    raise TimeoutError(f"bench.recovery: no {why} within {timeout:g} s")


def run(mode: str, witnesses: bool, kills: int, rng: random.Random) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        job = Job(mode, tmp, witnesses)
        recover, detect = [], []
        try:
            job.start()
            for _ in range(kills):
                gen, members = _until(job.steady, 180, f"steady job of {WORLD} ({mode})")
                victim = rng.choice([p for p in members if p not in job.spared])
                killed_at = time.time()
                os.kill(victim, signal.SIGKILL)
                survivors = [p for p in members if p != victim]

                def done():
                    seen = [job.after(p, killed_at, gen) for p in survivors]
                    return seen if all(s[1] is not None for s in seen) else None

                seen = _until(done, 60, "recovery of every survivor")
                recover.append(max(s[1] for s in seen) - killed_at)
                detect.append(max(s[0] for s in seen) - killed_at)
                print(
                    f"  {mode:10} {'witnesses' if witnesses else 'heartbeats':10} "
                    f"kill {len(recover):2}: detect {detect[-1]:.3f} s, "
                    f"recovered {recover[-1]:.3f} s",
                    flush=True,
                )
                job.replace(victim)
        finally:
            job.close()
        return {"recover": recover, "detect": detect}


ROOT = os.path.dirname(os.path.dirname(HERE))
DIGITS = os.path.join(ROOT, "examples", "train_digits.py")
WAITS = re.compile(r"\[train_digits\] joiner pid (\d+) waits to be admitted")
IS_RANK = re.compile(r"\[train_digits\] (?:launch rank \d+|joiner) pid (\d+) is rank")
FIRST = re.compile(
    r"\[train_digits\] joiner pid (\d+): first committed step \d+ .* "
    r"at t=([\d.]+)"
)


def run_spares(kills: int, rng: random.Random) -> dict:
    """The digits example under `collectives.launch --nproc 4 --spares 1`: from the SIGKILL of
    a member to the first committed step of the spare that takes its place. Each kill waits
    for a new spare to be waiting first (it prints so before it asks to be admitted)."""
    lines: list[tuple[float, str]] = []
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "COLLECTIVES_"))
    }
    env.update(PYTHONUNBUFFERED="1", COLLECTIVES_PROGRESS="off")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            str(WORLD),
            "--spares",
            "1",
            "--max-restarts",
            str(kills + 2),
            "--timeout",
            "3600",
            DIGITS,
            "--epochs",
            "100000",
            "--no-progress",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def read():
        for raw in p.stdout:
            lines.append((time.time(), raw.decode(errors="replace")))

    threading.Thread(target=read, daemon=True).start()

    def matches(rx, since=0.0):
        return [(t, m) for t, line in list(lines) for m in [rx.search(line)] if m and t >= since]

    out = []
    killed: set[int] = set()
    try:
        since = 0.0
        for _ in range(kills):
            _until(lambda: matches(WAITS, since), 300, "a waiting spare")
            members = {int(m.group(1)) for _, m in matches(IS_RANK)} - killed
            time.sleep(1.0)  # a few steps at full size
            victim = rng.choice(sorted(members))
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            first = _until(
                lambda: [m for _, m in matches(FIRST, killed_at)],
                120,
                "the spare's first committed step",
            )
            out.append(float(first[0].group(2)) - killed_at)
            since = killed_at
            print(
                f"  digits     spare      kill {len(out):2}: replacement's first committed "
                f"step {out[-1]:.3f} s",
                flush=True,
            )
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    return {"first_step": out}


def summary(v: list[float]) -> dict:
    s = sorted(v)
    return {
        "n": len(s),
        "median": statistics.median(s),
        "p95": s[max(0, math.ceil(0.95 * len(s)) - 1)],
        "min": s[0],
        "max": s[-1],
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench recovery")
    p.add_argument("--kills", type=int, default=20, help="kills per mode, every witness on")
    p.add_argument(
        "--baseline-kills",
        type=int,
        default=5,
        help="kills per mode with heartbeats alone (each costs the 5 s timeout)",
    )
    p.add_argument("--modes", default="launcher,env,standalone")
    p.add_argument(
        "--spare-kills",
        type=int,
        default=10,
        help="kills in the digits example with one warm spare (0: skip)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--out",
        help="write OUT.txt and OUT.json",
        default=os.path.join(ROOT, "bench", "results", "recovery", "kill_to_next_op"),
    )
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    rows = []
    for mode in a.modes.split(","):
        for witnesses, kills in ((True, a.kills), (False, a.baseline_kills)):
            if kills > 0:
                r = run(mode, witnesses, kills, rng)
                rows.append(
                    {
                        "mode": mode,
                        "detection": "witnesses + heartbeats" if witnesses else "heartbeats alone",
                        "recover": summary(r["recover"]),
                        "detect": summary(r["detect"]),
                        "raw": r,
                    }
                )
    spare_rows = []
    if a.spare_kills > 0:
        r = run_spares(a.spare_kills, rng)
        spare_rows.append(
            {
                "mode": "digits, launcher --spares 1",
                "first_step": summary(r["first_step"]),
                "raw": r,
            }
        )
    command = "python -m bench recovery " + shlex.join(argv if argv is not None else sys.argv[1:])
    head = (
        f"{command}\n{WORLD} workers, 16 KiB all_reduce every 50 ms, default settings "
        "(heartbeat 0.5 s / 5 s, op deadline 30 s); SIGKILL of one member from outside.\n"
        "recovered: kill -> last survivor's first completed op of the new generation; "
        "detect: kill -> last survivor's PeerFailure (or that op). Seconds.\n\n"
        f"{'mode':11} {'detection':24} {'n':>3} {'recovered median':>17} {'p95':>7} "
        f"{'min':>7} {'max':>7}   {'detect median':>13} {'p95':>7}\n"
    )
    lines = [
        f"{r['mode']:11} {r['detection']:24} {r['recover']['n']:3} "
        f"{r['recover']['median']:17.3f} {r['recover']['p95']:7.3f} "
        f"{r['recover']['min']:7.3f} {r['recover']['max']:7.3f}   "
        f"{r['detect']['median']:13.3f} {r['detect']['p95']:7.3f}"
        for r in rows
    ]
    text = (head + "\n".join(lines) + "\n") if rows else f"{command}\n"
    for r in spare_rows:
        s = r["first_step"]
        text += (
            f"\n{WORLD} workers of examples/train_digits.py under `collectives.launch "
            "--spares 1`: SIGKILL of a member -> the spare's first committed step\n"
            f"n {s['n']}  median {s['median']:.3f}  p95 {s['p95']:.3f}  min {s['min']:.3f}"
            f"  max {s['max']:.3f}\n"
        )
    print("\n" + text)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".txt", "w") as f:
        f.write(text)
    with open(a.out + ".json", "w") as f:
        json.dump({"command": command, "rows": rows, "spares": spare_rows}, f, indent=1)


if __name__ == "__main__":
    main()
