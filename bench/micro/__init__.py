"""pytest-benchmark micro-benchmarks; not part of `make test` (testpaths = tests). Run:

    .venv/bin/python -m pytest bench/micro --benchmark-only

test_kernels.py   the in-place reduction kernels (ops.reduce_into) per dtype and op, 1 MiB
test_header.py    wire header encode/decode (transport/base.py), the per-message overhead
test_inproc.py    ring vs tree vs direct all_reduce over the in-process transport (threads)
"""
