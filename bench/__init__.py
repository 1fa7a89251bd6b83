"""bench: nccl-tests style benchmarks of collectives against torch.distributed Gloo and NCCL.

    python -m bench                                   # all_reduce, 2 ranks, 4 B .. 64 MiB
    python -m bench --collective all_gather --nproc 3 --max-bytes 1M --json r.json --plot r.png
    python -m bench.costmodel r.json [--write]        # alpha-beta fits, ring/tree crossovers
    python -m pytest bench/micro --benchmark-only     # micro-benchmarks (not part of `make test`)

Modules: spec (sizes, buffers, checks, busbw), runner (spawns one process per rank), worker
(the per-rank interleaved loop), backends (one adapter per backend), limit (raw pyzmq ring:
the loopback limit), report (tables), plot (PNG), costmodel (fits and crossovers).
"""
