"""The core layer: ProcessGroup and its methods (group.py), reduce ops (ops.py), turning user
buffers into flat arrays (buffers.py), the per-group executor and Work handles (work.py), the
exceptions (errors.py), the "auto" algorithm choice (tuning.py) and the environment (config.py).

Core knows nothing of membership, teaching, training or the torch backend: those build on it.
"""
