"""The soak and chaos runs' own checkers (bench/stress/resources.py, bench/stress/chaos.py, bench/stress/soak_ops.py)
can fail: a leak and a wrong result are caught. The runs themselves, in miniature:
tests/system/test_soak_chaos.py.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.stress import chaos, resources, soak_ops  # noqa: E402


@pytest.mark.fast
def test_the_checkers_catch_a_leak_and_a_wrong_result():
    """The runs below can fail: one fd more, one thread more or one slot not handed back
    between the middle and the end is a leak in both tables; one wrong element is a wrong
    result; and the ops drawn are the same for every rank (the seed alone decides)."""
    flat = {k: 1 for k in resources.FIELDS}
    for field in ("fds", "threads", "shm_slots", "arenas", "ipc_endpoints"):
        end = dict(flat, **{field: 1 + resources.BOUNDS[field] + 1})
        text, failures = resources.table({0: {"start": flat, "middle": flat, "end": end}})
        assert len(failures) == 1 and field in failures[0] and "LEAK" in text
        events = [
            {"event": "sample", "proc": "w0", "phase": "early", "ws": 8, **flat},
            {"event": "sample", "proc": "w0", "phase": "end", "ws": 8, **end},
        ]
        assert len(chaos._leaks(events)[0]) == 1
    assert resources.table({0: {"start": flat, "middle": flat, "end": flat}})[1] == []
    op = soak_ops.draw(0, 0, 4)
    assert op == soak_ops.draw(0, 0, 4) and op.count > 0
    assert np.array_equal(soak_ops.inputs(0, op, 1, 4), soak_ops.inputs(0, op, 1, 4))
    want = np.arange(6, dtype=np.int32)
    op = soak_ops.Op(0, "all_reduce", "ring", "int32", "SUM", 6, 0, False)
    assert soak_ops.check(want.copy(), want, op) is None
    bad = want.copy()
    bad[4] += 1
    assert "1 of 6 elements wrong, first at [4]" in soak_ops.check(bad, want, op)
