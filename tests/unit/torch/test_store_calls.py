"""collectives/torch/store_calls.py and the rendezvous over it: a store call ends by the
caller's deadline even where torch's own does not.

Invariants: a TCPStore whose server process is stopped (SIGSTOP) makes torch's wait block
past its timeout, yet the rendezvous's wait raises CollectiveTimeout within its deadline plus
the grace, naming the rank and what it waited for; the store's own timeout error comes back
as a CollectiveError naming the same; a call that answers returns its result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from collectives.common.errors import CollectiveError, CollectiveTimeout
from support import timing

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from collectives.torch import rendezvous, store_calls  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SERVER = (
    "import sys, time; from datetime import timedelta; import torch.distributed as dist\n"
    "s = dist.TCPStore('127.0.0.1', 0, is_master=True, timeout=timedelta(seconds=60),"
    " wait_for_workers=False)\n"
    "print(s.port, flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_call_that_answers_returns_its_result():
    assert store_calls.bounded(lambda: 7, 1.0, op="rendezvous", rank=0, what="x") == 7


def test_the_stores_own_timeout_is_a_collective_error_naming_what_was_awaited():
    store = dist.HashStore()
    with pytest.raises(CollectiveError, match="rank 1: .* waited for the addresses") as info:
        rendezvous._wait(store, ["never"], 1, 0.2, "the addresses of all 2 ranks")
    # The store's own error, at its 0.2 s, came before this module's deadline (0.2 s +
    # GRACE_S), which raises CollectiveTimeout; how soon after 0.2 s is the machine's business.
    assert not isinstance(info.value, CollectiveTimeout)


def test_a_store_whose_server_is_stopped_cannot_hold_the_wait_past_its_deadline():
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        port = int(server.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("present", b"1")
        os.kill(server.pid, signal.SIGSTOP)
        deadline = 0.5
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout, match="did not answer.*rank 0's secret file"):
            rendezvous._wait(client, ["never"], 3, deadline, "rank 0's secret file")
        took = time.monotonic() - t0
        assert took >= deadline + store_calls.GRACE_S  # torch's own wait did not end it
        assert took < timing.bound(deadline + store_calls.GRACE_S + 1.0, below=30.0)
    finally:
        server.kill()  # SIGKILL ends a stopped process too; the helper's receive then fails
        server.wait(timeout=30)
