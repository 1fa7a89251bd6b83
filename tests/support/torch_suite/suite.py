"""PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
DistributedTest._DistTestBase), run the way PyTorch's test/distributed/test_distributed_spawn.py
runs it, with one switch: COLLECTIVES_SUITE=collectives makes every process group the tests
create a "collectives" group instead of a Gloo one.

    BACKEND=gloo WORLD_SIZE=3 TEMP_DIR=$(mktemp -d) python tests/support/torch_suite/suite.py \
        --json out.json [test_name ...]          # default: every test of the suite

How the switch works, and why BACKEND stays "gloo": the suite decides, when it is imported,
which tests a backend runs (decorators like `skip_but_pass_in_sandcastle_if(BACKEND !=
"gloo")`) and inside a test which branch to take (`if BACKEND == "gloo": ...`). A fallback for
Gloo must do whatever Gloo does, so the suite runs Gloo's selection and Gloo's branches, and
only the groups change: torch's one function that creates every process group
(distributed_c10d._new_process_group_helper: init_process_group, new_group, new_subgroups,
split_group, DeviceMesh) gets "collectives" wherever it was given "gloo". A test that still
made a Gloo group would fail here (NoGlooGroup), so a pass is a pass over this library.

Each test runs in WORLD_SIZE processes started with `spawn`; they import this file again (as
__mp_main__), so the switch is installed in them too. Results go to --json as
{test name: [outcome, detail]}, outcome one of passed, failed, skipped.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import unittest

import torch
import torch.distributed as dist

SWITCH = os.environ.get("COLLECTIVES_SUITE", "")
if SWITCH == "collectives":
    import collectives.torch  # noqa: F401  (registers the backend)
    from torch.distributed import distributed_c10d as c10d

    class NoGlooGroup(RuntimeError):
        """A Gloo group was about to be made although the suite runs over collectives."""

    _helper = c10d._new_process_group_helper

    def _switched(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        name = str(backend)
        if "gloo" in name:
            backend = name.replace("gloo", "collectives")
        if "gloo" in str(backend):
            raise NoGlooGroup(f"a Gloo group ({backend!r}) in a collectives run")
        return _helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)

    c10d._new_process_group_helper = _switched

    # dist.monitored_barrier refuses every group that is not Gloo's before the group sees
    # the call (torch checks the backend's name). A collectives group gets the call itself
    # (its monitored_barrier does what Gloo's does); anything else goes to torch unchanged.
    # The tests that pass through this are counted apart (test_torch_suite.py: SHIMMED).
    from collectives.torch import CollectivesProcessGroup

    _monitored = c10d.monitored_barrier

    def _monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        pg = group if group is not None else c10d._get_default_group()
        if not isinstance(pg, CollectivesProcessGroup):
            return _monitored(group, timeout, wait_all_ranks)
        if c10d._rank_not_in_group(group):
            return None
        if isinstance(timeout, (int, float)):
            from datetime import timedelta

            timeout = timedelta(seconds=timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    c10d.monitored_barrier = dist.monitored_barrier = _monitored_barrier
elif SWITCH:
    raise SystemExit(f"COLLECTIVES_SUITE={SWITCH!r}: expected 'collectives' or nothing")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

torch.backends.cuda.matmul.allow_tf32 = False


START = os.environ.get("COLLECTIVES_SUITE_START", "fork")


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As in PyTorch's test/distributed/test_distributed_spawn.py, except that the ranks are
    forked by default (COLLECTIVES_SUITE_START=spawn for spawn): a spawned rank imports torch
    and the suite again, 10-40 s per test on a busy 2-core machine; a forked one starts at
    once. Nothing has created a process group, a thread pool or a socket in the parent when
    it forks (each test's ranks make their own), which is what fork needs."""

    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def all_test_names() -> list[str]:
    return sorted(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes: dict[str, list] = {}

    def _name(self, test):
        return test.id().rsplit(".", 1)[-1]

    def addSuccess(self, test):
        self.outcomes[self._name(test)] = ["passed", ""]

    def addSkip(self, test, reason):
        self.outcomes[self._name(test)] = ["skipped", str(reason)]

    def addFailure(self, test, err):
        self.outcomes[self._name(test)] = ["failed", self._exc_info_to_string(err, test)[-4000:]]

    def addError(self, test, err):
        self.outcomes[self._name(test)] = ["failed", self._exc_info_to_string(err, test)[-4000:]]

    def addExpectedFailure(self, test, err):
        self.outcomes[self._name(test)] = ["passed", "expected failure"]

    def addUnexpectedSuccess(self, test):
        self.outcomes[self._name(test)] = ["failed", "unexpected success"]


def run(names, json_path=None, verbose=True) -> dict:
    outcomes = {}
    for name in names:
        t0 = time.monotonic()
        result = _Result()
        try:
            TestDistBackendWithSpawn(name).run(result)
            outcome = result.outcomes.get(name, ["failed", "no outcome recorded"])
        except Exception:
            outcome = ["failed", traceback.format_exc()[-4000:]]
        outcome.append(round(time.monotonic() - t0, 1))
        outcomes[name] = outcome
        if verbose:
            print(f"{outcome[0]:8s} {outcome[2]:6.1f} s  {name}", flush=True)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(outcomes, f, indent=1, sort_keys=True)
    return outcomes


def main(argv):
    json_path = None
    if argv[:1] == ["--json"]:
        json_path, argv = argv[1], argv[2:]
    for var in ("BACKEND", "WORLD_SIZE", "TEMP_DIR"):
        if var not in os.environ:
            raise SystemExit(f"set {var} (BACKEND=gloo WORLD_SIZE=3 TEMP_DIR=$(mktemp -d))")
    run(argv or all_test_names(), json_path)


if __name__ == "__main__":
    main(sys.argv[1:])
