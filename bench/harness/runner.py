"""Spawn one worker process per rank, hand out addresses, collect and aggregate the timings.

The parent process is only a post office: it hosts the rendezvous points -- this library's
coordinator and, when a torch backend is asked for, torch's TCPStore, each bound to port 0 --
relays the raw-socket addresses between workers, then waits for the results while watching
that every worker is alive. Workers are always reaped, even on error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import multiprocessing as mp
import statistics
import time

from collectives.membership.server import Coordinator

from . import worker
from .backends import TORCH
from .report import LIMITS
from .spec import Spec, busbw_factor, root_of


class BenchError(RuntimeError):
    pass


@contextlib.contextmanager
def rendezvous(spec: Spec):
    """{"collectives": coordinator port, "collectives_insecure": one without authentication
    or None, "gloo": TCPStore port or None} for the workers, each bound here to port 0 and
    kept open for the whole run."""
    coordinator = Coordinator("127.0.0.1", 0, spec.nproc).start()
    # NAME-insecure backends: a second coordinator without authentication (--insecure)
    insecure = (
        Coordinator("127.0.0.1", 0, spec.nproc, keys=None).start()
        if any(b.endswith("-insecure") for b in spec.backends)
        else None
    )
    store = None
    if any(b in TORCH for b in spec.backends):
        try:
            import torch.distributed as dist

            store = dist.TCPStore(
                "127.0.0.1",
                0,
                spec.nproc,
                True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=spec.timeout + 60),
            )
        except ImportError:
            pass  # the torch backends skip themselves ("torch is not installed")
    try:
        yield {
            "collectives": coordinator.port,
            "collectives_insecure": insecure.port if insecure else None,
            "gloo": store.port if store else None,
        }
    finally:
        coordinator.stop()
        if insecure is not None:
            insecure.stop()
        del store


def run(spec: Spec) -> dict:
    """Run the benchmark; return {"results": [row, ...], "skipped": {backend: reason}}."""
    external = "mpi" in spec.backends
    if external:  # half the repeats before the workers, half after: drift shows in both
        first = max(1, spec.repeats // 2)
        mpi_runs = [_run_mpi(dataclasses.replace(spec, repeats=first))]
    with rendezvous(spec) as ports:
        payloads = _run(spec, ports)
    if external:
        if spec.repeats - first > 0:
            mpi_runs.append(_run_mpi(dataclasses.replace(spec, repeats=spec.repeats - first)))
        payloads = payloads + _merge_runs(mpi_runs)
    return aggregate(spec, payloads)


def _run_mpi(spec: Spec) -> list[dict]:
    """The `mpi` backend: bench/harness/mpi_worker.py under mpiexec (MPICH from pip), one payload per
    rank; a single payload saying why it was skipped if it cannot run here."""
    import importlib.util
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    def skipped(why):
        return [{"records": [], "skipped": {"mpi": why}}]

    if importlib.util.find_spec("mpi4py") is None:
        return skipped("mpi4py is not installed (pip install -e '.[bench]')")
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which(
        "mpiexec"
    )
    if mpiexec is None:
        return skipped("no mpiexec (pip install mpich)")
    with tempfile.TemporaryDirectory(prefix="bench-mpi-") as d:
        spec_path, out_path = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(spec_path, "w") as f:
            json.dump(dataclasses.asdict(spec), f)
        cmd = [
            mpiexec,
            "-n",
            str(spec.nproc),
            sys.executable,
            "-m",
            "bench.harness.mpi_worker",
            spec_path,
            out_path,
        ]
        # every wait has a deadline: the whole sweep, generously
        limit = 120 + spec.timeout * len(spec.sizes)
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=limit,
                cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            )
        except subprocess.TimeoutExpired:
            return skipped(f"mpiexec did not finish within {limit:g} s")
        if done.returncode != 0 or not os.path.exists(out_path):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return skipped(f"mpiexec failed (exit {done.returncode}): {tail[0]}")
        with open(out_path) as f:
            return json.load(f)


def _merge_runs(runs: list[list[dict]]) -> list[dict]:
    """Several mpiexec runs' payloads as one per rank: each record's repeats concatenated."""
    if any(len(r) != len(runs[0]) for r in runs):
        return runs[0]
    merged = []
    for parts in zip(*runs):
        recs: dict = {}
        for part in parts:
            for rec in part["records"]:
                key = (rec["backend"], rec["size"])
                if key in recs:
                    recs[key] = dict(recs[key], times=recs[key]["times"] + rec["times"])
                else:
                    recs[key] = rec
        skipped = {k: v for part in parts for k, v in part["skipped"].items()}
        merged.append({"records": list(recs.values()), "skipped": skipped})
    return merged


def _run(spec: Spec, ports: dict) -> dict:
    ctx = mp.get_context("spawn")  # fresh interpreters: no forked zmq contexts or torch state
    conns, procs = [], []
    ok = False
    try:
        for rank in range(spec.nproc):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=worker.main,
                name=f"bench-rank{rank}",
                daemon=True,
                args=(rank, dataclasses.asdict(spec), ports, child),
            )
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        addresses = [_expect(c, p, "address", spec.timeout + 60) for c, p in zip(conns, procs)]
        for c in conns:
            c.send(addresses)
        payloads = [_expect(c, p, "done", None) for c, p in zip(conns, procs)]
        ok = True
    finally:
        for p in procs:  # after a failure the others may sit in a barrier: do not wait long
            p.join(10 if ok else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return payloads


def _expect(conn, proc, kind, timeout):
    """The next message from one worker, which must be `kind`; raise if it failed or died."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not conn.poll(0.2):
        if not proc.is_alive() and not conn.poll(0):
            raise BenchError(f"{proc.name} exited (code {proc.exitcode}) before sending {kind}")
        if deadline is not None and time.monotonic() > deadline:
            raise BenchError(f"{proc.name} sent no {kind} within {timeout:g} s")
    got, payload = conn.recv()
    if got == "error":
        raise BenchError(f"benchmark worker failed on {payload}")
    if got != kind:
        raise BenchError(f"{proc.name} sent {got!r} where {kind!r} was expected")
    return payload


def aggregate(spec: Spec, payloads: list[dict]) -> dict:
    """Per (backend, size): the slowest rank per repeat, then median / min / max over repeats.
    #wrong is summed over ranks, as nccl-tests does."""
    skipped: dict[str, str] = {}
    for p in payloads:
        for name, why in p["skipped"].items():
            skipped.setdefault(name, why)
    by_key: dict[tuple, list] = {}
    for p in payloads:
        for rec in p["records"]:
            by_key.setdefault((rec["backend"], rec["size"]), []).append(rec)
    factor = busbw_factor(spec.collective, spec.nproc)
    rows = []
    for (backend, size), recs in by_key.items():
        if len(recs) != spec.nproc:
            continue  # a backend dropped by some rank only: no honest figure exists
        per_rep = [max(ts) for ts in zip(*(r["times"] for r in recs))]
        med = statistics.median(per_rep)
        wrongs = [r["wrong"] for r in recs]
        algbw = size / med / 1e9
        rows.append(
            {
                "backend": backend,
                "size": size,
                "count": recs[0]["count"],
                "type": spec.dtype,
                "redop": spec.op if spec.collective not in ("broadcast", "all_gather") else "none",
                "root": root_of(spec.collective),
                "iters": recs[0]["iters"],
                "time_us": med * 1e6,
                "time_us_min": min(per_rep) * 1e6,
                "time_us_max": max(per_rep) * 1e6,
                "times_us": [t * 1e6 for t in per_rep],
                "algbw_gbs": algbw,
                "busbw_gbs": algbw * factor,
                "wrong": None if any(w is None for w in wrongs) else sum(wrongs),
            }
        )
    rows = _best_limit(rows)
    order = {name: i for i, name in enumerate((*spec.backends, *LIMITS))}
    rows.sort(key=lambda r: (order.get(r["backend"], 99), r["size"]))
    return {"results": rows, "skipped": skipped}


def _best_limit(rows: list[dict]) -> list[dict]:
    """Fold the limit's segment-size variants into one `limit` row per size: the fastest
    (by median), with the segment it used and every variant's median kept."""
    out, best = [], {}
    for r in rows:
        if not r["backend"].startswith("limit/"):
            out.append(r)
            continue
        seg = int(r["backend"].split("/")[1])
        variants = best.get(r["size"], {}).get("segments_us", {})
        variants[seg] = r["time_us"]
        cur = best.get(r["size"])
        if cur is None or r["time_us"] < cur["time_us"]:
            cur = dict(r, backend="limit", segment=seg)
        cur["segments_us"] = variants
        best[r["size"]] = cur
    return out + list(best.values())
