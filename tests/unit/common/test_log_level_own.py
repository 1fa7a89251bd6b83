"""The library's log lines follow COLLECTIVES_DEBUG alone (common/logs.py).

Invariant: with COLLECTIVES_DEBUG unset, the "collectives" logger has a level of its own,
WARN, so a framework that sets the root logger to INFO (Ray, Lightning do) gets none of the
library's per-op INFO lines -- only its warnings; a level the program gave that logger itself
is kept; COLLECTIVES_DEBUG=INFO still turns the per-op lines on.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from collectives.common import logs

pytestmark = pytest.mark.fast


class _Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def root_at_info():
    """The root logger at INFO with a handler that keeps what reaches it, as a framework's;
    the "collectives" logger's level, handlers and propagation restored afterwards."""
    root, lib = logging.getLogger(), logging.getLogger("collectives")
    saved = (root.level, lib.level, list(lib.handlers), lib.propagate)
    catch = _Catch()
    root.addHandler(catch)
    root.setLevel(logging.INFO)
    lib.handlers, lib.propagate = [], True
    yield lib, catch
    root.removeHandler(catch)
    root.setLevel(saved[0])
    lib.setLevel(saved[1])
    lib.handlers, lib.propagate = saved[2], saved[3]


def _one_all_reduce(inproc_world):
    import threading

    _, pgs = inproc_world(2)
    bufs = [np.ones(4, np.float32) for _ in pgs]
    threads = [threading.Thread(target=pg.all_reduce, args=(b,)) for pg, b in zip(pgs, bufs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(np.array_equal(b, np.full(4, 2, np.float32)) for b in bufs)


def test_root_at_info_gets_no_per_op_lines(root_at_info, inproc_world):
    lib, catch = root_at_info
    lib.setLevel(logging.NOTSET)  # as at import, before setup
    logs.setup(None)  # COLLECTIVES_DEBUG unset
    assert lib.level == logging.WARNING
    _one_all_reduce(inproc_world)
    logging.getLogger("collectives.group.group").warning("a survived fault")
    mine = [r for r in catch.records if r.name.startswith("collectives")]
    assert [r.levelno for r in mine] == [logging.WARNING], [r.getMessage() for r in mine]


def test_a_level_the_program_set_is_kept(root_at_info):
    lib, _ = root_at_info
    lib.setLevel(logging.ERROR)
    logs.setup(None)
    assert lib.level == logging.ERROR


def test_collectives_debug_info_still_shows_them(root_at_info, inproc_world):
    lib, catch = root_at_info
    lib.setLevel(logging.INFO)  # what setup("INFO") sets (without its stderr handler)
    _one_all_reduce(inproc_world)
    assert any(
        "all_reduce of 4 x <f4" in r.getMessage()
        for r in catch.records
        if r.name.startswith("collectives")
    ), [r.getMessage() for r in catch.records]
