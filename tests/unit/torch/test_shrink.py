"""collectives/torch/shrink.py's agreement, in one process over a torch HashStore: the
survivors of a shrink_group proceed only when every rank they count wrote the same list.

Invariants: agree() returns on every survivor when all wrote the same list; a different list
raises CollectiveMismatch on whoever reads it, naming both lists and the difference; a rank
reported gone but kept raises naming it; a survivor that never writes is a CollectiveTimeout
naming it; attempts and generations never read each other's keys.
"""

from __future__ import annotations

import threading

import pytest

from collectives.common.errors import CollectiveMismatch, CollectiveTimeout

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from collectives.torch.shrink import ShrinkRequest, agree  # noqa: E402


def req(rank, exclude, size=4, generation=0, attempt=1):
    return ShrinkRequest(rank, size, generation, attempt, tuple(exclude))


def run_all(store, requests, timeout=5.0, gone=()):
    """agree() for every request on its own thread; {rank: None or the exception}."""
    out = {}

    def one(r):
        try:
            agree(store, r, timeout, lambda: tuple(gone))
            out[r.rank] = None
        except Exception as exc:
            out[r.rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out


def test_the_same_list_everywhere_agrees():
    store = dist.HashStore()
    out = run_all(store, [req(r, [3]) for r in range(3)])
    assert out == {0: None, 1: None, 2: None}


def test_a_different_list_raises_on_every_rank_that_reads_it():
    store = dist.HashStore()
    out = run_all(store, [req(0, [3]), req(1, [3]), req(2, [1, 3])])
    assert all(isinstance(e, CollectiveMismatch) for e in out.values()), out
    assert "rank 2 excludes [1, 3]" in str(out[0])
    assert "it also excludes [1]" in str(out[0])
    assert "rank 0 excludes [3]" in str(out[2]) and "leaves in [1]" in str(out[2])


def test_a_rank_reported_gone_but_kept_is_named():
    store = dist.HashStore()
    out = run_all(store, [req(r, [3]) for r in range(3)], gone=(2, 3))
    for e in out.values():
        assert isinstance(e, CollectiveMismatch) and "rank(s) [2] failed too" in str(e), e


def test_a_survivor_that_never_writes_times_out_named():
    store = dist.HashStore()
    out = run_all(store, [req(0, [3]), req(1, [3])], timeout=0.3)
    for e in out.values():
        assert isinstance(e, CollectiveTimeout) and "rank(s) [2]" in str(e), e


def test_attempts_and_generations_keep_apart():
    store = dist.HashStore()
    run_all(store, [req(0, [3]), req(1, [3]), req(2, [1, 3])])  # attempt 1 disagreed
    assert run_all(store, [req(r, [3], attempt=2) for r in range(3)]) == {0: None, 1: None, 2: None}
    again = [req(r, [2], size=3, generation=5, attempt=1) for r in range(2)]
    assert run_all(store, again) == {0: None, 1: None}
