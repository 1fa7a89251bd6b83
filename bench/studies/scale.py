"""The scaling curve on one host: all_reduce of 4 B and 1 MiB, reconstruct() and failure
detection against the world size.

    python -m bench scale [--worlds 2,4,8,16,32,64] [--out bench/results/scale/one_host]

For each world size n: a standalone coordinator and n worker processes (bench/studies/scale_worker.py)
on this host (the default transport: ipc, shared memory for large payloads). Each worker
times all_reduce with algorithm "auto" (median over repeats of the mean over back-to-back
ops, each repeat after a barrier; the slowest rank's figure is the op's time), then loops on
a 4-byte all_reduce until rank n-1 is SIGKILLed. "detect" is from the kill to the last
survivor's PeerFailure (the coordinator declares a rank dead after --heartbeat-timeout s
without a beat, so that is its floor); "reconstruct" is the slowest survivor's
pg.reconstruct() (from the failure to the new group of n-1); every result is checked exactly,
before and after the kill. Then each curve is fitted as a + b*log2(n) and as a + b*n (least
squares) and the better fit is stated, with the log-log slope k (time ~ n^k; |k| < 0.15 is
called constant).

Writes OUT.json (every figure), OUT.txt (the table and fits) and OUT.png (log-log plot).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import signal
import secrets
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.ports import coordinator_process  # noqa: E402  (the tests' process harness)
from support.procs import ProcessSet, clean_env  # noqa: E402

METRICS = {
    "4 B": "all_reduce 4 B",
    "1 MiB": "all_reduce 1 MiB",
    "reconstruct": "reconstruct()",
    "detect": "failure detection",
}


def one_world(n: int, a) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ps = ProcessSet(tmp)
        try:
            # a standalone coordinator and its ranks share the job's secret (docs/security.md)
            env = clean_env(
                COLLECTIVES_HEARTBEAT_TIMEOUT=a.heartbeat_timeout,
                COLLECTIVES_HEARTBEAT_INTERVAL=a.heartbeat_interval,
                COLLECTIVES_JOB_SECRET=secrets.token_hex(32),
            )
            address = coordinator_process(
                ps, "coordinator", n, env=env, args=["--heartbeat-interval", a.heartbeat_interval]
            )
            started = time.time()
            for r in range(n):
                ps.spawn(
                    f"w{r}",
                    [
                        sys.executable,
                        "-m",
                        "bench.studies.scale_worker",
                        "--iters",
                        a.iters,
                        "--reps",
                        a.reps,
                    ],
                    dict(env, RANK=str(r), WORLD_SIZE=str(n), COLLECTIVES_COORDINATOR=address),
                )
            names = [f"w{r}" for r in range(n)]

            def each(event, who, timeout):
                return [
                    ps.wait_for(
                        lambda e, w=w: e["proc"] == w and e["event"] == event,
                        timeout,
                        f"{event} from {w}",
                        ends=lambda e, w=w: e["proc"] == w and e["event"] == "exit",
                    )
                    for w in who
                ]

            joined = each("joined", names, a.deadline)
            timings = [e for e in ps.seen if e["event"] == "timing"]
            each("looping", names, a.deadline)
            timings = [e for e in ps.seen if e["event"] == "timing"]
            assert all(e["ok"] for e in timings), [e for e in timings if not e["ok"]]
            row = {
                "n": n,
                "start_s": max(e["t"] for e in joined) - started,
                "init_s": max(e["init_s"] for e in joined),
            }
            for size in ("4 B", "1 MiB"):
                mine = [e for e in timings if e["size"] == size]
                assert len(mine) == n, (size, len(mine))
                row[size] = max(e["seconds"] for e in mine)
                row[f"{size} algorithm"] = mine[0]["algorithm"]
            time.sleep(0.5)
            victim = f"w{n - 1}"
            killed = time.time()
            os.kill(ps.procs[victim].pid, signal.SIGKILL)
            survivors = names[:-1]
            detected = each("detected", survivors, a.deadline)
            assert all(e["failed"] == [n - 1] for e in detected), detected
            rebuilt = each("reconstructed", survivors, a.deadline)
            checked = each("checked", survivors, a.deadline)
            assert all(e["ok"] and e["ws"] == n - 1 for e in checked), checked
            row["detect"] = max(e["t"] for e in detected) - killed
            row["reconstruct"] = max(e["seconds"] for e in rebuilt)
            ps.wait(survivors, 60)
            return row
        finally:
            ps.close()


def fit(ns, ys) -> dict:
    """Least squares of y = a + b*f(n) for f = log2 and f = identity, with R^2 each, and the
    log-log slope k of y ~ c * n^k."""

    def linear(xs):
        m = len(xs)
        mx, my = sum(xs) / m, sum(ys) / m
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        a = my - b * mx
        ss = sum((y - my) ** 2 for y in ys) or 1e-30
        r2 = 1 - sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / ss
        return a, b, r2

    out = {}
    for name, f in (("log n", math.log2), ("n", float)):
        a, b, r2 = linear([f(n) for n in ns])
        out[name] = {"a": a, "b": b, "r2": r2}
    lx = [math.log(n) for n in ns]
    ly = [math.log(max(y, 1e-9)) for y in ys]
    m = len(lx)
    mx, my = sum(lx) / m, sum(ly) / m
    out["k"] = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sum((x - mx) ** 2 for x in lx)
    # Flat where the log-log slope is near 0 (then neither fit explains much but noise).
    out["better"] = (
        "constant" if abs(out["k"]) < 0.15 else max(("log n", "n"), key=lambda k: out[k]["r2"])
    )
    return out


def _growth(f) -> str:
    return "constant" if f["better"] == "constant" else f"grows like {f['better']}"


def _t(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def report(rows, fits, a) -> str:
    out = [
        f"collectives on one host ({os.cpu_count()} cores), heartbeat interval "
        f"{a.heartbeat_interval} s, timeout {a.heartbeat_timeout} s; all_reduce with "
        f"algorithm auto (the slowest rank's median over {a.reps} x {a.iters} ops)",
        f"{'n':>4} {'4 B':>12} {'(alg)':>7} {'1 MiB':>12} {'(alg)':>7} {'reconstruct':>12} "
        f"{'detect':>10} {'init':>10}",
    ]
    for r in rows:
        out.append(
            f"{r['n']:>4} {_t(r['4 B']):>12} {r['4 B algorithm']:>7} {_t(r['1 MiB']):>12} "
            f"{r['1 MiB algorithm']:>7} {_t(r['reconstruct']):>12} {_t(r['detect']):>10} "
            f"{_t(r['init_s']):>10}"
        )
    out.append("")
    out.append("fits, y = a + b*f(n) by least squares (R^2), and the log-log slope k (y ~ n^k):")
    for key, name in METRICS.items():
        f = fits[key]
        lg, ln = f["log n"], f["n"]
        out.append(
            f"  {name:18} log n: {_t(lg['a'])} + {_t(lg['b'])}*log2 n (R^2 {lg['r2']:.3f});"
            f"  n: {_t(ln['a'])} + {_t(ln['b'])}*n (R^2 {ln['r2']:.3f});  k = {f['k']:.2f}"
            f"  -> {_growth(f)}"
        )
    return "\n".join(out) + "\n"


def plot(rows, fits, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    for i, (key, name) in enumerate(METRICS.items()):
        f = fits[key]
        color = plt.get_cmap("tab10")(i)
        ax.plot(
            ns,
            [r[key] for r in rows],
            "o-",
            color=color,
            label=f"{name} ({_growth(f)}, k={f['k']:.2f})",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns)
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlabel("world size (processes on one 2-core host)")
    ax.set_ylabel("seconds")
    ax.set_title("collectives: scaling on one host")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m bench scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--worlds", default="2,4,8,16,32,64")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--heartbeat-interval", type=float, default=0.5)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument(
        "--deadline", type=float, default=600.0, help="seconds to wait for each stage of a world"
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale" / "one_host"))
    a = p.parse_args(argv)
    rows = []
    for n in [int(v) for v in a.worlds.split(",")]:
        t0 = time.monotonic()
        rows.append(one_world(n, a))
        r = rows[-1]
        print(
            f"n={n}: 4 B {_t(r['4 B'])}, 1 MiB {_t(r['1 MiB'])}, reconstruct "
            f"{_t(r['reconstruct'])}, detect {_t(r['detect'])} ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
    ns = [r["n"] for r in rows]
    fits = {key: fit(ns, [r[key] for r in rows]) for key in METRICS} if len(rows) > 2 else {}
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "cores": os.cpu_count(),
        "heartbeat_interval": a.heartbeat_interval,
        "heartbeat_timeout": a.heartbeat_timeout,
        "iters": a.iters,
        "reps": a.reps,
        "command": "python -m bench scale " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows, "fits": fits}, indent=1))
    if fits:
        text = report(rows, fits, a)
        out.with_suffix(".txt").write_text(text)
        sys.stdout.write(text)
        plot(rows, fits, out.with_suffix(".png"))
        print(f"wrote {out}.json, .txt, .png")


if __name__ == "__main__":
    main()
