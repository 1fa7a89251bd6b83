"""The group layer: ProcessGroup and its methods (group.py), all_to_all, gather and scatter
(exchanges.py), send and recv (p2p.py), the per-group executor and Work handles (work.py),
turning user buffers into flat arrays (buffers.py), registered buffers (alloc.py) and the
"auto" algorithm choice (tuning.py).

The group knows nothing of membership, teaching, training or the torch backend: those build on it.
"""
