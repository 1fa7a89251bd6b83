"""The benchmark harness: one collective on every backend and size, nccl-tests style (`python -m bench`)."""
