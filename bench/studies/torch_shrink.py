"""From a SIGKILL to the survivors' first op on the shrunk group: dist.shrink_group through
the torch backend against the library's own reconstruct().

    python -m bench torch_shrink [--trials 10] [--world 4]
                                 [--out bench/results/torch_shrink/kill_to_first_op]

Each trial is a fresh job of `world` workers (bench/studies/torch_shrink_worker.py: a 16 KiB
all_reduce every 20 ms) with a standalone coordinator (python -m collectives.coordinator),
the same for both APIs: "torch" (dist.init_process_group("collectives") with
COLLECTIVES_TORCH_ELASTIC=1, a TCPStore this process hosts; after the failure,
dist.shrink_group(collectives.torch.failed_ranks())) and "library" (cl.init_process_group;
pg.reconstruct()). Once every worker has done 5 ops, the last rank is SIGKILLed; the figure
is the time from the kill to the moment the last survivor completed its first all_reduce on
the new group (checked: the sum over the survivors), and "detect" the time to the last
survivor's failure. The trials of the two APIs alternate. Median and p95 (nearest rank) with
min, max and n; written to OUT.txt and OUT.json with the command that made them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "torch_shrink_worker.py")
APIS = ("torch", "library")


def summary(v: list[float]) -> dict:
    s = sorted(v)
    return {
        "n": len(s),
        "median": statistics.median(s),
        "p95": s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)],
        "min": s[0],
        "max": s[-1],
    }


class Trial:
    """One job: a coordinator, `world` workers, their JSON events (one reader per process)."""

    def __init__(self, api: str, world: int, tmp: str):
        self.api, self.world, self.tmp = api, world, tmp
        self.events: list[dict] = []
        self.cond = threading.Condition()
        self.procs: list[subprocess.Popen] = []
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "COLLECTIVES_"))
        }
        self.env.update(
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore",
            PYTHONPATH=ROOT,
            COLLECTIVES_JOB_SECRET=secrets.token_hex(16),
            COLLECTIVES_PROGRESS="off",
            SHRINK_API=api,
        )

    def _read(self, p: subprocess.Popen) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()

    def _wait(self, what: str, count: int, timeout: float) -> list[dict]:
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [e for e in self.events if e.get("event") == what]
                if len(got) >= count:
                    return got
                if time.monotonic() > end:
                    with open(os.path.join(self.tmp, f"{self.api}-0.err")) as f:
                        tail = f.read()[-3000:]
                    raise RuntimeError(
                        f"{self.api}: {len(got)}/{count} '{what}' in {timeout} s; rank 0's "
                        f"stderr:\n{tail}"
                    )
                self.cond.wait(0.1)

    def run(self) -> dict:
        port_file = os.path.join(self.tmp, f"coord-{self.api}-{time.monotonic_ns()}")
        coord = subprocess.Popen(
            [sys.executable, "-m", "collectives.coordinator", "--port", "0", "--port-file",
             port_file, "--world-size", str(self.world), "--quiet"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.procs.append(coord)
        store = None
        try:
            end = time.monotonic() + 30
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                if time.monotonic() > end or coord.poll() is not None:
                    raise RuntimeError("the coordinator did not start")
                time.sleep(0.05)
            env = dict(self.env, COLLECTIVES_COORDINATOR=f"127.0.0.1:{open(port_file).read()}")
            if self.api == "torch":
                from datetime import timedelta

                import torch.distributed as dist

                store = dist.TCPStore(
                    "127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=60),
                )  # fmt: skip
                env.update(
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(store.port),
                    COLLECTIVES_TORCH_ELASTIC="1",
                    TORCHELASTIC_USE_AGENT_STORE="True",  # every rank a client of this store
                )
            for r in range(self.world):
                p = subprocess.Popen(
                    [sys.executable, WORKER],
                    env=dict(env, RANK=str(r), WORLD_SIZE=str(self.world)),
                    stdout=subprocess.PIPE,
                    stderr=open(os.path.join(self.tmp, f"{self.api}-{r}.err"), "w"),
                    text=True,
                )
                self.procs.append(p)
                threading.Thread(target=self._read, args=(p,), daemon=True).start()
            self._wait("ready", self.world, 60)
            victim = self.procs[-1]
            t_kill = time.time()
            victim.send_signal(signal.SIGKILL)
            n = self.world - 1
            first = self._wait("first_op", n, 120)
            failures = self._wait("failure", n, 5)
            shrunk = self._wait("shrunk", n, 5)
            if not all(e["ok"] for e in first):
                raise RuntimeError(f"{self.api}: a wrong sum on the new group")
            for p in self.procs[1:-1]:
                p.wait(30)
            return {
                "api": self.api,
                "kill_to_first_op": max(e["t"] for e in first) - t_kill,
                "detect": max(e["t"] for e in failures) - t_kill,
                "shrink": max(e["t"] for e in shrunk) - max(e["t"] for e in failures),
            }
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            del store


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10, help="per API")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument(
        "--out", default=os.path.join(ROOT, "bench/results/torch_shrink/kill_to_first_op")
    )
    a = ap.parse_args(argv)
    command = "python -m bench torch_shrink " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.trials):
            for api in APIS if i % 2 == 0 else APIS[::-1]:
                row = Trial(api, a.world, tmp).run()
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines = [
        f"# {command}",
        f"# {a.world} workers, the last one SIGKILLed; seconds from the kill",
        f"{'api':8} {'what':17} {'median':>8} {'p95':>8} {'min':>8} {'max':>8} {'n':>3}",
    ]
    stats = {}
    for api in APIS:
        for what in ("kill_to_first_op", "detect", "shrink"):
            s = summary([r[what] for r in rows if r["api"] == api])
            stats[f"{api}/{what}"] = s
            lines.append(
                f"{api:8} {what:17} {s['median']:8.3f} {s['p95']:8.3f} {s['min']:8.3f} "
                f"{s['max']:8.3f} {s['n']:3d}"
            )
    ratio = stats["torch/kill_to_first_op"]["median"] / stats["library/kill_to_first_op"]["median"]
    lines.append(f"shrink_group / reconstruct(), median kill_to_first_op: {ratio:.2f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".txt", "w") as f:
        f.write(text)
    with open(a.out + ".json", "w") as f:
        json.dump({"command": command, "rows": rows, "stats": stats, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
