"""python -m bench: the benchmark command line. See bench/__init__.py for examples."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys

from . import backends as B
from .spec import COLLECTIVES, OPS, Spec, parse_size, size_range


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="nccl-tests style benchmark of this library's algorithms against "
        "torch.distributed Gloo (and NCCL with 2+ GPUs), with the loopback "
        "limit (a raw ring over the same transport) measured in the same run.",
    )
    p.add_argument("--collective", choices=COLLECTIVES, default="all_reduce")
    p.add_argument(
        "--backends",
        default="ring,tree,auto,gloo,nccl",
        help=f"comma-separated subset of {','.join(B.KNOWN)} (default %(default)s)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="also run each of this library's backends on a group without "
        "authentication (COLLECTIVES_INSECURE=1) as NAME-insecure: what "
        "CURVE costs, measured in the same run",
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks, one process each")
    p.add_argument("--min-bytes", default="4", help="smallest size (e.g. 4, 1K)")
    p.add_argument("--max-bytes", default="64M", help="largest size (e.g. 1M, 64M)")
    p.add_argument("--step", type=int, default=2, choices=(2, 4), help="size multiplier")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", choices=OPS, default="sum")
    p.add_argument(
        "--iters",
        type=int,
        default=20,
        help="timed operations per repeat (scaled down above 4 MiB)",
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed operations per size")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is shown")
    p.add_argument(
        "--transport",
        choices=("tcp", "ipc", "shm"),
        default="shm",
        help="how this library's ranks talk (COLLECTIVES_TRANSPORT) and what the "
        "limit measures: tcp or ipc sockets, or shm (ipc plus shared memory "
        "for large payloads, the library's default on one host)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="deadline of every operation (s)")
    p.add_argument("--no-limit", action="store_true", help="do not measure the loopback limit")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--json", metavar="FILE", help="write all figures (with min/max) here")
    p.add_argument("--plot", metavar="FILE.png", help="write the busbw / latency plot here")
    p.add_argument(
        "--no-model",
        action="store_true",
        help="do not print the alpha-beta cost model after the tables",
    )
    return p.parse_args(argv)


def spec_from(args) -> Spec:
    names = tuple(dict.fromkeys(b.strip() for b in args.backends.split(",") if b.strip()))
    if args.insecure:  # each library backend followed by its twin without authentication
        names = tuple(
            dict.fromkeys(
                x for b in names for x in ((b, f"{b}-insecure") if b in B.LIBRARY else (b,))
            )
        )
    for b in names:
        if b not in B.KNOWN:
            sys.exit(f"python -m bench: unknown backend {b!r}; choose from {', '.join(B.KNOWN)}")
    if args.nproc < 2:
        sys.exit("python -m bench: --nproc must be at least 2")
    for flag in ("iters", "repeats"):
        if getattr(args, flag) < 1:
            sys.exit(f"python -m bench: --{flag} must be at least 1")
    import numpy as np

    try:
        dtype = np.dtype(args.dtype).name
    except TypeError:
        sys.exit(f"python -m bench: unknown dtype {args.dtype!r}")
    try:
        sizes = size_range(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step)
    except ValueError as exc:
        sys.exit(f"python -m bench: {exc}")
    return Spec(
        collective=args.collective,
        backends=names,
        nproc=args.nproc,
        sizes=sizes,
        dtype=dtype,
        op=args.op,
        iters=args.iters,
        warmup=max(args.warmup, 0),
        repeats=args.repeats,
        transport=args.transport,
        limit=not args.no_limit,
        progress=not args.no_progress,
        timeout=args.timeout,
    )


def meta_for(spec: Spec) -> dict:
    import numpy
    import zmq

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    mem = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores{mem}, "
        f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "torch": torch_version,
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "collective": spec.collective,
        "backends": list(spec.backends),
        "nproc": spec.nproc,
        "sizes": list(spec.sizes),
        "dtype": spec.dtype,
        "op": spec.op,
        "iters": spec.iters,
        "warmup": spec.warmup,
        "repeats": spec.repeats,
        "transport": spec.transport,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = spec_from(args)
    from . import report, runner

    if "nccl" in spec.backends:
        _, why = B.cuda_gpus()  # decided here: no worker needs to touch CUDA to learn it
        if why:
            spec.backends = tuple(b for b in spec.backends if b != "nccl")
            skipped_nccl = why
        else:
            skipped_nccl = None
    else:
        skipped_nccl = None
    meta = meta_for(spec)
    try:
        result = runner.run(spec)
    except runner.BenchError as exc:
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 1
    if skipped_nccl:
        result["skipped"] = {"nccl": skipped_nccl, **result["skipped"]}
    result = {"meta": meta, **result}
    print(report.render(result))
    if not args.no_model:
        from . import costmodel

        text = costmodel.summary(result)
        if text:
            print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"# wrote {args.json}")
    if args.plot:
        from .plot import plot

        plot(result, args.plot)
        print(f"# wrote {args.plot}")
    wrong = sum(r["wrong"] or 0 for r in result["results"])
    return 2 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
