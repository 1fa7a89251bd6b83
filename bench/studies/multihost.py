"""all_reduce across hosts joined by a slow link: 2 hosts x 2 ranks, 1 Gbit/s.

    python -m bench multihost [--rate 1gbit] [--reps 3] [--min-bytes 64K] [--max-bytes 64M]
                              [--insecure] [--transport auto|ipc] [--segment-bytes 4M]
                              [--out bench/results/multihost/2x2_1gbit]

Needs root (network namespaces, tc). The hosts are two network namespaces, each with a veth to
a third namespace holding a bridge (the switch), on link-local addresses 169.254.79.1-2 that
exist only inside them; each host's veth sends through a token bucket (`tc qdisc add dev DEV
root tbf rate 1gbit burst 256kb latency 50ms`), so every direction of the link between the
hosts carries at most 1 Gbit/s (netem does not exist here). Ranks 0, 1 live on host 0 and 2, 3
on host 1; a standalone coordinator runs on host 0. Within a host the ranks talk through shared
memory (payloads) and ipc (the messages that name them), across hosts over tcp (chosen per
pair, and checked: a host's ranks run in its network namespace only, sharing the mount
namespace as the processes of a real host do -- tests/support/netns.py).

Backends, interleaved size by size (bench/studies/multihost_worker.py): this library's flat ring
(algorithm="ring"), its hierarchical all_reduce (algorithm="hierarchical"), torch.distributed
Gloo (GLOO_SOCKET_IFNAME set to the host's veth), and "tcp", the link's floor for hierarchical:
its cross-host bytes alone, over plain TCP between the same leader processes, both directions
at once (no ZeroMQ, no CURVE, no work within a host) -- what TCP itself gets out of this link
in the same repeats, to set hierarchical's time against. Each op runs after a barrier; an op's time is
its slowest rank's; the figure is the median over the repeats. Columns as nccl-tests: size,
count, type, redop, time (us), algbw = size/time, busbw = algbw x 2(n-1)/n, #wrong.

What must cross the link for N bytes: hierarchical sends N over each host's link (its k = 2
leaders 2(H-1)/H N/k each, H = 2 hosts); a flat ring over the 4 ranks 1.5 N (the rank at each host's edge sends
2(n-1)/n N). At the link's rate that takes N*8/rate (and 1.5x that) -- printed beside the
measured times.

Every namespace, and every process in them, is removed at the end, whatever happens (also on
SIGTERM/SIGINT). Writes OUT.json, OUT.txt and OUT.png (busbw against size, log-log).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.netns import Hosts  # noqa: E402  (the tests' namespace hosts)
from support.procs import ProcessSet, clean_env  # noqa: E402  (the tests' process harness)

NET = 79  # 169.254.79.x: link-local, our namespaces only
IPS = [f"169.254.{NET}.{i}" for i in (1, 2)]
BACKENDS = ("ring", "hierarchical", "gloo", "tcp")
NPROC = 2  # ranks per host


LINK_CHECK = r"""
import socket, sys, time
role, addr = sys.argv[1], sys.argv[2]
if role == "server":
    s = socket.socket(); s.bind((addr, 0)); s.listen(1)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); got = 0; t0 = None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        t0 = t0 or time.perf_counter(); got += len(b)
    print(got, time.perf_counter() - t0, flush=True)
else:
    c = socket.create_connection((addr, int(sys.argv[3])))
    buf = b"\0" * (1 << 20)
    for _ in range(int(sys.argv[4])): c.sendall(buf)
    c.close()
"""


def link_rate(hosts: Hosts, mib: int = 48) -> float:
    """Bytes per second that one TCP stream gets from host 0 to host 1 (checks the tbf)."""
    server = subprocess.Popen(
        [*hosts.prefix(1), sys.executable, "-c", LINK_CHECK, "server", IPS[1]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = server.stdout.readline().strip()
        subprocess.run(
            [*hosts.prefix(0), sys.executable, "-c", LINK_CHECK, "client", IPS[1], port, str(mib)],
            check=True,
            timeout=120,
        )
        got, seconds = server.stdout.readline().split()
        server.wait(30)
        return int(got) / float(seconds)
    finally:
        if server.poll() is None:
            server.kill()


def run(a, hosts: Hosts, tmp: pathlib.Path) -> list[dict]:
    n = NPROC * len(IPS)
    ps = ProcessSet(tmp)
    # the hosts share the job's secret (docs/security.md): the coordinator and every rank
    job = (
        {"COLLECTIVES_INSECURE": "1"}
        if a.insecure
        else {"COLLECTIVES_JOB_SECRET": secrets.token_hex(32)}
    )
    job["COLLECTIVES_TRANSPORT"] = a.transport
    try:
        port_file = tmp / "coordinator.port"
        ps.spawn(
            "coordinator",
            [
                *hosts.prefix(0),
                sys.executable,
                "-m",
                "collectives.coordinator",
                "--host",
                IPS[0],
                "--port",
                "0",
                "--port-file",
                port_file,
                "--world-size",
                n,
            ],
            clean_env(**job),
        )
        port = int(ps.wait_for_file(port_file, 30, "the coordinator's port"))
        for r in range(n):
            h = r // NPROC
            ps.spawn(
                f"rank{r}",
                [
                    *hosts.prefix(h),
                    sys.executable,
                    "-m",
                    "bench.studies.multihost_worker",
                    "--sizes",
                    ",".join(map(str, a.sizes)),
                    "--backends",
                    a.backends,
                    "--reps",
                    a.reps,
                    "--master-ip",
                    IPS[0],
                    *(["--segment-bytes", _bytes(a.segment_bytes)] if a.segment_bytes else []),
                ],
                clean_env(
                    **job,
                    RANK=r,
                    WORLD_SIZE=n,
                    COLLECTIVES_COORDINATOR=f"{IPS[0]}:{port}",
                    COLLECTIVES_SOCKET_IFNAME=hosts.devs[h],
                    GLOO_SOCKET_IFNAME=hosts.devs[h],
                ),
            )
        results = ps.wait([f"rank{r}" for r in range(n)], a.deadline)
        for r, res in enumerate(results):
            if res.code != 0:
                raise RuntimeError(f"rank {r} exited {res.code}:\n{res.output[-3000:]}")
        while not ps.events.empty():  # every event the ranks printed
            ps.seen.append(ps.events.get_nowait())
        joined = {e["rank"]: e for e in ps.seen if e.get("event") == "joined"}
        assert sorted(joined) == list(range(n)), sorted(joined)
        for r, e in joined.items():  # shared memory within a host, tcp across
            for peer, kind in e["kinds"].items():
                same = int(peer) // NPROC == r // NPROC
                want = ("shm" if a.transport == "auto" else a.transport) if same else "tcp"
                if kind != want:
                    raise RuntimeError(
                        f"rank {r} reaches rank {peer} over {kind}, not {want}: "
                        "a host's ranks share memory, as on a real host"
                    )
            assert e["hosts"] == [q // NPROC for q in range(n)], e["hosts"]
        return [e for e in ps.seen if e.get("event") == "op"]
    finally:
        ps.close()


def summarize(ops, a, rate_bps: float, measured_rate: float) -> dict:
    n = NPROC * len(IPS)
    factor = 2 * (n - 1) / n
    rows = []
    for size in a.sizes:
        row = {"size": size, "count": size // 4}
        for b in a.backends.split(","):
            mine = [e for e in ops if e["size"] == size and e["backend"] == b]
            reps = sorted({e["rep"] for e in mine})
            slowest = [max(e["seconds"] for e in mine if e["rep"] == rep) for rep in reps]
            t = statistics.median(slowest)
            row[b] = {
                "time_s": t,
                "algbw": size / t / 1e9,
                "busbw": size / t / 1e9 * factor,
                "wrong": sum(e["wrong"] for e in mine),
                "reps": slowest,
                # where the time goes: the ranks' CPU seconds (summed) and how busy
                # the machine's cores were (every process) during the op
                "cpu_s": statistics.median(
                    sum(e.get("cpu", 0) for e in mine if e["rep"] == rep) for rep in reps
                ),
                "busy": statistics.median(
                    max(e.get("busy", 0) for e in mine if e["rep"] == rep) for rep in reps
                ),
            }
        # what must cross each host's link, and how long that takes at the link's rate
        row["link_bytes"] = {"hierarchical": size, "ring": 1.5 * size}
        row["link_s"] = {k: v * 8 / rate_bps for k, v in row["link_bytes"].items()}
        rows.append(row)
    return {
        "hosts": len(IPS),
        "ranks_per_host": NPROC,
        "rate": a.rate,
        "rate_bps": rate_bps,
        "measured_tcp_Bps": measured_rate,
        "busbw_factor": factor,
        "rows": rows,
        "security": "none (COLLECTIVES_INSECURE=1)" if a.insecure else "CURVE",
        "within_host": "shared memory" if a.transport == "auto" else a.transport,
        "segment_bytes": _bytes(a.segment_bytes) if a.segment_bytes else None,
        "command": "python -m bench multihost " + " ".join(a.argv),
    }


def _size(b) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def report(res) -> str:
    backends = [b for b in BACKENDS if b in res["rows"][0]]
    out = [
        f"all_reduce, {res['hosts']} hosts x {res['ranks_per_host']} ranks, links "
        f"{res['rate']} (tbf); one TCP stream measured {res['measured_tcp_Bps'] * 8 / 1e9:.3f} "
        f"Gbit/s; float32 sum; busbw = algbw x {res['busbw_factor']:g}; median of the "
        "slowest rank over the repeats",
        f"sockets: {res.get('security', 'CURVE')}; within a host: "
        f"{res.get('within_host', 'shared memory')}; segments: "
        f"{_size(res['segment_bytes']) if res.get('segment_bytes') else 'the default'}",
    ]
    head = f"{'size':>9} {'count':>9} {'type':>7} {'redop':>5}"
    for b in backends:
        label = "tcp floor us" if b == "tcp" else b + " us"
        head += f" | {label:>14} {'algbw':>6} {'busbw':>6} {'#wrong':>6}"
    out.append(head)
    for row in res["rows"]:
        line = f"{_size(row['size']):>9} {row['count']:>9} {'float':>7} {'sum':>5}"
        for b in backends:
            c = row[b]
            line += (
                f" | {c['time_s'] * 1e6:>14.0f} {c['algbw']:>6.3f} {c['busbw']:>6.3f} "
                f"{c['wrong']:>6}"
            )
        out.append(line)
    big = res["rows"][-1]
    n = big["size"]
    out.append("")
    out.append(
        f"At {_size(n)}: hierarchical must send {n:,} B over each host's link (its "
        f"k leaders 2(H-1)/H N/k each: N), a flat ring {int(1.5 * n):,} B (1.5 N). At "
        f"{res['rate']} that takes {big['link_s']['hierarchical'] * 1e3:.0f} ms and "
        f"{big['link_s']['ring'] * 1e3:.0f} ms."
    )
    tcp = res["measured_tcp_Bps"]
    out.append(
        f"  (one TCP stream moved {tcp * 8 / 1e9:.3f} Gbit/s of payload over this link: "
        f"headers take the rest; at that rate N takes {n / tcp * 1e3:.0f} ms)"
    )
    for name, label in (("hierarchical", "hierarchical"), ("ring", "flat ring   ")):
        c = big.get(name)
        if c:
            best = min(c["reps"])
            out.append(
                f"  {label}: {c['time_s'] * 1e3:.0f} ms (median; best {best * 1e3:.0f}) ="
                f" {c['time_s'] / big['link_s'][name]:.2f}x (best "
                f"{best / big['link_s'][name]:.2f}x) the time of its bytes at the "
                f"link's rate" + (" (target <= 1.15x)" if name == "hierarchical" else "")
            )
    cores = os.cpu_count()
    for name in backends:
        c = big[name]
        out.append(
            f"  {name}: the {res['hosts'] * res['ranks_per_host']} ranks used "
            f"{c['cpu_s']:.2f} CPU-s per op ({c['cpu_s'] / c['time_s'] / cores:.0%} of "
            f"this machine's {cores} cores over the op); the cores were "
            f"{c['busy']:.0%} busy (every process of the machine, the kernel's "
            "network path included)"
        )
    h, floor = big.get("hierarchical"), big.get("tcp")
    if h and floor:
        ratios = [a / b for a, b in zip(h["reps"], floor["reps"])]
        out.append(
            f"  bare TCP, the same bytes over plain sockets between the same processes, "
            f"in the same repeats: {floor['time_s'] * 1e3:.0f} ms (median) = "
            f"{floor['time_s'] / big['link_s']['hierarchical']:.2f}x the time at the "
            f"link's rate; hierarchical / bare TCP, repeat by repeat: "
            f"{statistics.median(ratios):.2f}x (median) [{min(ratios):.2f}-"
            f"{max(ratios):.2f}]"
        )
    if h and big.get("gloo"):
        out.append(
            f"  hierarchical busbw / Gloo busbw: {h['busbw'] / big['gloo']['busbw']:.2f}x "
            "(target >= 1.3x)"
        )
    return "\n".join(out) + "\n"


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    sizes = [row["size"] for row in res["rows"]]
    for i, b in enumerate(b for b in BACKENDS if b in res["rows"][0]):
        label = {
            "ring": "collectives flat ring",
            "hierarchical": "collectives hierarchical",
            "gloo": "torch.distributed Gloo",
            "tcp": "bare TCP, hierarchical's bytes (floor)",
        }[b]
        ax.plot(
            sizes,
            [row[b]["busbw"] for row in res["rows"]],
            "o-",
            color=plt.get_cmap("tab10")(i),
            label=label,
        )
    rate = res["rate_bps"] / 8 / 1e9 * res["busbw_factor"]
    ax.axhline(
        rate,
        color="grey",
        linestyle="--",
        label=f"link bound, hierarchical (N over the link): {rate:.3f} GB/s",
    )
    ax.axhline(
        rate / 1.5,
        color="grey",
        linestyle=":",
        label=f"link bound, flat ring (1.5 N): {rate / 1.5:.3f} GB/s",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([_size(s) for s in sizes], fontsize=8)
    ax.set_xlabel("all_reduce size (float32)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{res['hosts']} hosts x {res['ranks_per_host']} ranks, {res['rate']} links")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _bytes(text: str) -> int:
    text = text.strip().upper()
    for unit, k in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(unit):
            return int(float(text[:-1]) * k)
    return int(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench multihost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rate", default="1gbit", help="tbf rate of each host's link")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--min-bytes", default="64K")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument(
        "--segment-bytes",
        default=None,
        help="the ranks' pipelining unit (init_process_group(segment_bytes=...); "
        "default: the library's)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="COLLECTIVES_INSECURE=1: no CURVE (to measure what CURVE costs)",
    )
    p.add_argument(
        "--transport",
        default="auto",
        choices=("auto", "ipc"),
        help="within a host: auto (shared memory) or ipc (every payload on a "
        "socket, encrypted like the link: what a host's ranks in separate "
        "containers would do)",
    )
    p.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "multihost" / "2x2_1gbit"))
    a = p.parse_args(argv)
    a.argv = list(argv if argv is not None else sys.argv[1:])
    if os.geteuid() != 0 or not all(map(shutil.which, ("ip", "tc", "nsenter"))):
        print(
            "bench.studies.multihost needs root, ip, tc and nsenter (network namespaces)",
            file=sys.stderr,
        )
        return 2
    a.sizes, s = [], _bytes(a.min_bytes)
    while s <= _bytes(a.max_bytes):
        a.sizes.append(s)
        s *= 4
    rate_bps = float(a.rate.lower().replace("gbit", "e9").replace("mbit", "e6"))

    def stop(signum, frame):
        raise SystemExit(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)
    with (
        Hosts(len(IPS), NET, rate=a.rate, tag="clb") as hosts,
        tempfile.TemporaryDirectory() as tmp,
    ):
        measured = link_rate(hosts)
        print(
            f"link check: one TCP stream host 0 -> host 1: {measured * 8 / 1e9:.3f} Gbit/s",
            flush=True,
        )
        ops = run(a, hosts, pathlib.Path(tmp))
    res = summarize(ops, a, rate_bps, measured)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    text = report(res)
    out.with_suffix(".txt").write_text(text)
    sys.stdout.write(text)
    plot(res, out.with_suffix(".png"))
    print(f"wrote {out}.json, .txt, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
