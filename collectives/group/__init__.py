"""The group layer: ProcessGroup, the public face (group.py), over its core (core.py: state,
checks, op submission, life) and the collaborators that hold the core -- the collectives
(collective.py), all_to_all, gather and scatter (exchanges.py), send and recv (p2p.py),
registered buffers (alloc.py) -- plus the per-group executor and Work handles (work.py),
turning user buffers into flat arrays (buffers.py) and the "auto" algorithm choice (tuning.py).

The group knows nothing of membership, teaching, training or the torch backend: those build on it.
"""
