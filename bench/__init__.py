"""bench: nccl-tests style benchmarks of collectives against torch.distributed Gloo and NCCL.

    python -m bench                                   # all_reduce, 2 ranks, 4 B .. 64 MiB
    python -m bench --collective all_gather --nproc 3 --max-bytes 1M --json r.json --plot r.png
    python -m bench costmodel r.json [--write]        # alpha-beta fits, ring/tree crossovers
    python -m bench --list                            # every study
    python -m pytest bench/micro --benchmark-only     # micro-benchmarks (not part of `make test`)

Packages: harness/ (spec: sizes, buffers, checks, busbw; runner: one process per rank; worker:
the per-rank interleaved loop; backends: one adapter per backend; report: tables; plot: PNG;
costmodel: fits and crossovers; cli: the harness's command line), floors/ (limit: the raw
pyzmq ring; collective: the latency and copy floors; pyfloor: pure Python's fastest exchange),
studies/ (one question each: smallop, registered, ddp_speed, train_speed, scale, multihost,
fault_recovery, coordinator_load) and stress/ (soak, chaos, and what they check).
The registry of studies is bench/__main__.py.
"""
