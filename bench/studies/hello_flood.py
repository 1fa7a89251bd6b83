"""What a flood of CURVE HELLOs from an outsider costs a job (docs/security.md, "Denial of
service").

    python -m bench hello_flood [--rate 2000] [--seconds 6] [--repeats 3] [--json FILE]

A 2-rank job over tcp (COLLECTIVES_TRANSPORT=tcp, keyed with a job secret) runs back-to-back
4-byte all_reduces; each op's latency is recorded with the time it ended. The run alternates
quiet windows and flood windows (`--repeats` of each, `--seconds` long): in a flood window
processes without the secret (`--flooders` of them) open TCP connections to both ranks' ports
at `--rate` a second in all, each carrying a ZMTP greeting and one CURVE HELLO (200 bytes, a
random short-term key, a box that cannot open): the most expensive thing an outsider can make
a server do before it is refused, since a HELLO is decrypted (a Curve25519 key agreement)
before anything can check who sent it -- ZeroMQ asks the ZAP handler only at the INITIATE that
follows, so no per-address limit inside ZeroMQ can come first. Printed per window kind: ops/s,
latency p50 and p90 (us), the ranks' CPU (% of one core, user + system, both ranks), and the
HELLOs actually sent per second; medians over the windows, with min-max.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECRET = secrets.token_hex(32)
GREETING = (
    b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" + b"\0" * 31
)


def hello() -> bytes:
    """A CURVE HELLO command (RFC 26): version 1.0, 72 bytes of padding, a random client
    short-term key, a nonce and an 80-byte signature box nobody can open."""
    body = (
        b"\x05HELLO"
        + b"\x01\x00"
        + b"\0" * 72
        + secrets.token_bytes(32)
        + secrets.token_bytes(8)
        + secrets.token_bytes(80)
    )
    return b"\x04" + bytes([len(body)]) + body


# --- the job's ranks ------------------------------------------------------------------------
def worker(outdir: str):
    import numpy as np

    import collectives as cl

    pg = cl.init_process_group(timeout=60)
    ep = pg.transport.tcp_endpoint
    Path(outdir, f"rank{pg.rank}.json").write_text(json.dumps({"pid": os.getpid(), "tcp": ep}))
    stop = Path(outdir, "stop")
    ends, lats = [], []
    flag = np.zeros(1, np.int64)
    while True:
        flag[0] = stop.exists()
        t0 = time.perf_counter()
        pg.all_reduce(flag, op=cl.ReduceOp.MAX)
        t1 = time.perf_counter()
        ends.append(time.time())
        lats.append(t1 - t0)
        if flag[0]:
            break
    Path(outdir, f"lat{pg.rank}.json").write_text(json.dumps({"end": ends, "lat": lats}))
    pg.destroy()


# --- the outsider ---------------------------------------------------------------------------
def flood(targets: list[tuple[str, int]], rate: float, seconds: float, out: str):
    """Connect to the targets in turn at `rate` a second for `seconds`; each connection sends
    a greeting and a HELLO and is closed. Writes how many were sent."""
    msg = GREETING + hello()
    sent, start = 0, time.monotonic()
    held = []  # (when, socket): closed after a moment, once the server has read it
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        due = int((now - start) * rate)
        while sent < due:
            host, port = targets[sent % len(targets)]
            try:
                s = socket.create_connection((host, port), timeout=1.0)
                s.sendall(msg)
                held.append((now, s))
            except OSError:
                pass
            sent += 1
        while held and now - held[0][0] > 0.3:
            held.pop(0)[1].close()
        time.sleep(0.0005)
    for _, s in held:
        s.close()
    Path(out).write_text(json.dumps({"sent": sent, "seconds": time.monotonic() - start}))


# --- the driver -----------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_job(tmp: Path) -> tuple[list[subprocess.Popen], list[dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLECTIVES_")}
    env.update(
        COLLECTIVES_JOB_SECRET=SECRET,
        COLLECTIVES_TRANSPORT="tcp",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
    )
    log = open(tmp / "job.log", "w")
    me = [sys.executable, "-m", "bench.studies.hello_flood"]
    r0 = subprocess.Popen(
        [*me, "--worker", str(tmp)],
        env=dict(env, RANK="0", MASTER_PORT="0"),
        stdout=log,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    port = None
    for line in r0.stderr:
        if "hosts the coordinator at" in line:
            port = line.strip().rsplit(":", 1)[1]
            break
    if port is None:
        raise RuntimeError("rank 0 did not start: see " + str(tmp / "job.log"))
    r1 = subprocess.Popen(
        [*me, "--worker", str(tmp)],
        env=dict(env, RANK="1", MASTER_PORT=port),
        stdout=log,
        stderr=log,
        cwd=ROOT,
        start_new_session=True,
    )
    infos = []
    for r in range(2):
        path = tmp / f"rank{r}.json"
        deadline = time.monotonic() + 60
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {r} did not join: see {tmp / 'job.log'}")
            time.sleep(0.05)
        infos.append(json.loads(path.read_text()))
    return [r0, r1], infos


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench hello_flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rate", type=float, default=2000.0, help="HELLOs a second, in all")
    p.add_argument("--seconds", type=float, default=6.0, help="length of each window")
    p.add_argument(
        "--flooders",
        type=int,
        default=4,
        help="processes sharing the flood (one Python process sends ~500/s)",
    )
    p.add_argument("--repeats", type=int, default=3, help="quiet and flood windows each")
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument(
        "--flood", nargs=4, metavar=("TARGETS", "RATE", "SECONDS", "OUT"), help=argparse.SUPPRESS
    )
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker)
        return 0
    if a.flood:
        targets = [(h, int(port)) for h, port in (t.rsplit(":", 1) for t in a.flood[0].split(","))]
        flood(targets, float(a.flood[1]), float(a.flood[2]), a.flood[3])
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="hello-flood-"))
    procs, infos = start_job(tmp)
    targets = ",".join(i["tcp"].removeprefix("tcp://") for i in infos)
    windows = []  # (kind, start, end, cpu seconds of both ranks, HELLOs/s)
    try:
        time.sleep(1.0)  # warm
        for i in range(2 * a.repeats):
            kind = "quiet" if i % 2 == 0 else "flood"
            cpu0 = sum(cpu_seconds(i["pid"]) for i in infos)
            t0 = time.time()
            rate = 0.0
            if kind == "flood":
                outs = [tmp / f"flood{i}-{j}.json" for j in range(a.flooders)]
                fl = [
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bench.studies.hello_flood",
                            "--flood",
                            targets,
                            str(a.rate / a.flooders),
                            str(a.seconds),
                            str(out),
                        ],
                        cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)),
                    )
                    for out in outs
                ]
                for f in fl:
                    f.wait(a.seconds + 60)
                done = [json.loads(out.read_text()) for out in outs]
                rate = sum(d["sent"] / d["seconds"] for d in done)
            else:
                time.sleep(a.seconds)
            t1 = time.time()
            cpu1 = sum(cpu_seconds(i["pid"]) for i in infos)
            windows.append((kind, t0, t1, cpu1 - cpu0, rate))
        (tmp / "stop").touch()
        for pr in procs:
            pr.wait(60)
    finally:
        for pr in procs:
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
    lat = json.loads((tmp / "lat0.json").read_text())
    rows = {}
    for kind, t0, t1, cpu, rate in windows:
        inside = [x for e, x in zip(lat["end"], lat["lat"]) if t0 + 0.5 <= e <= t1]
        inside.sort()
        r = rows.setdefault(
            kind, {"ops_s": [], "p50_us": [], "p90_us": [], "cpu_pct": [], "hello_s": []}
        )
        r["ops_s"].append(len(inside) / (t1 - t0 - 0.5))
        r["p50_us"].append(1e6 * inside[len(inside) // 2])
        r["p90_us"].append(1e6 * inside[int(len(inside) * 0.9)])
        r["cpu_pct"].append(100 * cpu / (t1 - t0))
        r["hello_s"].append(rate)
    result = {kind: {k: summary(v) for k, v in r.items()} for kind, r in rows.items()}
    print(
        f"2 ranks over tcp, keyed; 4-byte all_reduce back to back; {a.repeats} x "
        f"{a.seconds:g} s windows of each kind; medians (min-max)"
    )
    print(
        f"{'window':8} {'HELLO/s':>16} {'ops/s':>18} {'p50 us':>20} {'p90 us':>20} "
        f"{'ranks CPU %':>18}"
    )
    for kind in ("quiet", "flood"):
        r = result[kind]
        cells = [
            f"{r[k]['median']:.0f} ({r[k]['min']:.0f}-{r[k]['max']:.0f})"
            for k in ("hello_s", "ops_s", "p50_us", "p90_us", "cpu_pct")
        ]
        print(
            f"{kind:8} {cells[0]:>16} {cells[1]:>18} {cells[2]:>20} {cells[3]:>20} {cells[4]:>18}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "result": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
