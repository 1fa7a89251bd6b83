"""Fault recovery figures at 4 ranks: time from a fault to PeerFailure on every survivor, and
from there to a working new group, for SIGKILL, SIGSTOP, SIGTERM and a stalled link.

    python -m bench fault_recovery [--repeats 5] [--heartbeat-timeout 1.0] [--json FILE]

Each repeat starts a fresh 4-rank job (tests/support/fault_worker.py: all_reduce in a loop,
reconstructing after failures), waits until it runs, injects the fault into rank 2, and
reads the workers' timestamped events. "detect" is from the fault to the last survivor
learning of it: its PeerFailure, or, for a survivor already blocked in its step-boundary
reconstruct(), the coordinator's declaration; "recover" is from there to that survivor's
reconstruct() returning the new group. The stalled link is `delay:1->2:60s` with a 2 s op timeout, so "detect"
includes that timeout. Medians with min and max over the repeats.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import signal
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from support.cluster import Cluster  # noqa: E402  (the same harness the fault tests use)

SURVIVORS = ["w0", "w1", "w3"]


def one_run(kind: str, hb_timeout: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"COLLECTIVES_FAULTS": "delay:1->2:60s"} if kind == "stall" else {}
        args = ["--timeout", "2", "--seconds", "60"] if kind == "stall" else ["--seconds", "60"]
        c = Cluster(4, pathlib.Path(tmp), heartbeat_timeout=hb_timeout, worker_args=args, env=env)
        try:
            if kind == "stall":
                # The delay rule holds from op #0, so the fault starts with the first op.
                c.start()
                start = max(
                    c.wait_for(lambda e, n=n: e["proc"] == n and e["event"] == "joined", 30)["t"]
                    for n in ["w0", "w1", "w2", "w3"]
                )
            else:
                c.start()
                c.wait_steps(["w0", "w1", "w2", "w3"], ws=4, timeout=30)
                sig = {
                    "sigkill": signal.SIGKILL,
                    "sigstop": signal.SIGSTOP,
                    "sigterm": signal.SIGTERM,
                }[kind]
                start = c.signal("w2", sig)
            detect, recover = [], []
            for n in SURVIVORS:
                rec = c.wait_for(
                    lambda e, n=n: (
                        e["proc"] == n and e["event"] == "reconstructed" and e["t"] > start
                    ),
                    30,
                    f"{n} reconstructing",
                )
                declared = [
                    t
                    for t, what in c.coordinator.events
                    if "removed" in what and start < t <= rec["t"]
                ]
                fail = [
                    e["t"]
                    for e in c.seen
                    if e["proc"] == n and e["event"] == "failure" and start < e["t"] <= rec["t"]
                ]
                # A survivor blocked in reconstruct() learns of the failure when the
                # coordinator declares it; one inside an op, when its PeerFailure is raised.
                found = fail[0] if fail else declared[0]
                detect.append(found - start)
                recover.append(rec["t"] - found)
            return max(detect), max(recover)
        finally:
            c.close()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench fault_recovery")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--heartbeat-timeout", type=float, default=1.0)
    p.add_argument("--kinds", default="sigkill,sigstop,sigterm,stall")
    p.add_argument("--json")
    a = p.parse_args(argv)
    rows = {}
    print(
        f"4 ranks, heartbeat interval 0.2 s, heartbeat timeout {a.heartbeat_timeout:g} s, "
        f"{a.repeats} repeats; seconds, median [min, max]"
    )
    print(f"{'fault':10} {'fault -> PeerFailure':>28} {'PeerFailure -> new group':>28}")
    for kind in a.kinds.split(","):
        runs = [one_run(kind, a.heartbeat_timeout) for _ in range(a.repeats)]
        d = [r[0] for r in runs]
        g = [r[1] for r in runs]
        rows[kind] = {"detect": d, "recover": g}
        fmt = lambda v: f"{statistics.median(v):7.3f} [{min(v):.3f}, {max(v):.3f}]"  # noqa: E731
        print(f"{kind:10} {fmt(d):>28} {fmt(g):>28}", flush=True)
    if a.json:
        pathlib.Path(a.json).write_text(
            json.dumps(
                {
                    "heartbeat_timeout": a.heartbeat_timeout,
                    "repeats": a.repeats,
                    "results": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
