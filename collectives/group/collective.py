"""The collectives of a ProcessGroup: all_reduce (and its plan cache), reduce, broadcast,
all_gather, reduce_scatter and barrier.

Each checks its arguments before any byte moves, describes the operation in a short
descriptor (kind, count, dtype, op, algorithm, root) that travels in every message header so
that ranks calling different things find out, picks an algorithm from the tables below, and
runs it through the group's core (core.py, GroupCore.submit) over an OpChannel for this one
operation. The public methods, with the docstrings help() shows, are ProcessGroup's (group.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import rerouted, smallop, tuning
from .buffers import stage, stage_in_out
from .core import GroupCore
from .tuning import pick as _pick
from ..algorithms import barrier as barrier_alg
from ..algorithms import (
    direct,
    double_tree,
    gloo_ring,
    halving_doubling,
    hierarchical,
    naive,
    ring,
    tree,
)
from ..algorithms.rooted import release, rooted_broadcast
from ..common.channel import Channel
from ..common.ops import ReduceOp, as_op, check_op_dtype
from ..common.types import Buffer
from ..transport.wire import Descriptor, HeaderForms
from .work import Work

ALL_REDUCE: dict[str, Callable[..., Any]] = {
    "ring": ring.all_reduce,
    "tree": tree.all_reduce,
    "naive": naive.all_reduce,
    "direct": direct.all_reduce,
    "hierarchical": hierarchical.all_reduce,
    "gloo_ring": gloo_ring.all_reduce,
    "halving_doubling": halving_doubling.all_reduce,
    "double_tree": double_tree.all_reduce,
}
NEEDS_HOSTS = ("hierarchical",)  # these take the host map too (transport.hosts)
ROOTED = ("tree",)  # broadcast and reduce
SCATTER_GATHER = ("ring",)  # all_gather and reduce_scatter
_PLANS_MAX = 256  # all_reduce plans kept per group (sizes x dtypes x ops in use)


@dataclasses.dataclass(frozen=True, slots=True)
class AllReducePlan:
    """What every all_reduce of one (count, dtype, op, algorithm asked) runs: made once, with
    its arguments checked then, and reused by every later call with the same inputs."""

    algorithm: str  # what "auto" picked, or the one asked for
    run: Callable[..., Any]  # (channel, array, op): the algorithm, under the plan in force
    desc: Descriptor  # what every message of the op carries (never modified: shared)
    headers: HeaderForms  # its data headers, prebuilt (wire.py)


class Collectives:
    """The collectives of one ProcessGroup, over its core."""

    def __init__(self, core: GroupCore):
        self.core = core
        # all_reduce's plan per (count, dtype, op, algorithm asked). The same inputs pick the
        # same on every call; bounded (_PLANS_MAX).
        self.plans: dict[tuple[int, np.dtype[Any], ReduceOp, str], AllReducePlan] = {}

    def all_reduce(
        self,
        buf: Buffer,
        op: ReduceOp | str,
        algorithm: str,
        async_op: bool,
        timeout: float | None,
    ) -> Work | None:
        name = "all_reduce"
        if type(op) is not ReduceOp:
            op = as_op(op)
        staged = stage(buf, "buf", name)
        arr = staged.array
        key = (arr.size, arr.dtype, op, algorithm)
        plan = self.plans.get(key)
        if plan is None:
            # validated once per plan: the key holds everything the check reads
            check_op_dtype(op, arr.dtype)
            plan = self._plan_all_reduce(name, arr, op, algorithm)
            if len(self.plans) >= _PLANS_MAX:
                self.plans.clear()
            self.plans[key] = plan
        return self.core.submit(
            name,
            plan.desc,
            timeout,
            async_op,
            staged,
            plan.run,
            headers=plan.headers,
            args=(arr, op),
        )

    def _plan_all_reduce(
        self, name: str, arr: np.ndarray, op: ReduceOp, algorithm: str
    ) -> AllReducePlan:
        """The plan of an all_reduce of `arr`: what "auto" picks, the descriptor every message
        of the op carries and its headers."""
        core = self.core
        hosts = core.hosts
        auto = algorithm == "auto"
        if auto:
            algorithm = tuning.all_reduce_algorithm(
                arr.nbytes, core.world_size, hosts, core.crowded
            )
        fn: Callable[..., Any] = _pick(ALL_REDUCE, algorithm, name)
        if algorithm == "direct":
            fn = smallop.direct_all_reduce  # direct itself for a buffer it does not fit
        elif algorithm == "naive":
            fn = smallop.naive_all_reduce  # likewise
        if algorithm in NEEDS_HOSTS:
            fn = functools.partial(fn, hosts=hosts)
        # fail-slow: the coordinator's plan, and what it makes of this size (group/rerouted.py)
        fn = rerouted.all_reduce(
            core.schedules, algorithm, fn, auto, hosts if algorithm in NEEDS_HOSTS else None
        )
        desc = Descriptor(name, arr.size, arr.dtype.str, op.value, algorithm, None)
        return AllReducePlan(algorithm, fn, desc, HeaderForms(desc))

    def reduce(
        self,
        buf: Buffer,
        dst: int,
        op: ReduceOp | str,
        algorithm: str,
        async_op: bool,
        timeout: float | None,
    ) -> Work | None:
        name = "reduce"
        op = as_op(op)
        self.core.check_rank(dst, "dst", name)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(op, arr.dtype)
        algorithm = "tree" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ROOTED), algorithm, name)
        desc = Descriptor(name, arr.size, arr.dtype.str, op.value, algorithm, dst)

        def run(ch: Channel) -> None:
            tree.reduce(ch, arr, op, root=dst)
            release(ch, dst)

        return self.core.submit(name, desc, timeout, async_op, staged, run)

    def broadcast(
        self, buf: Buffer, src: int, algorithm: str, async_op: bool, timeout: float | None
    ) -> Work | None:
        name = "broadcast"
        self.core.check_rank(src, "src", name)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(ReduceOp.SUM, arr.dtype)
        algorithm = "tree" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ROOTED), algorithm, name)
        desc = Descriptor(name, arr.size, arr.dtype.str, None, algorithm, src)

        def run(ch: Channel) -> None:
            rooted_broadcast(ch, arr, src)

        return self.core.submit(name, desc, timeout, async_op, staged, run)

    def all_gather(
        self, out: Buffer, buf: Buffer, algorithm: str, async_op: bool, timeout: float | None
    ) -> Work | None:
        name = "all_gather"
        n = self.core.world_size
        src, dst = stage_in_out(buf, out, name)
        a, o = src.array, dst.array
        check_op_dtype(ReduceOp.SUM, a.dtype)
        shape: tuple[int, ...] = getattr(out, "shape", ())
        if o.size != n * a.size or (len(shape) and shape[0] != n and a.size):
            raise ValueError(
                f"{name}: out must have world_size ({n}) rows of buf's "
                f"{a.size} elements; got shape {tuple(shape)}"
            )
        algorithm = "ring" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(SCATTER_GATHER), algorithm, name)
        desc = Descriptor(name, a.size, a.dtype.str, None, algorithm, None)
        r = self.core.rank

        def run(ch: Channel) -> None:
            o[r * a.size : (r + 1) * a.size] = a
            ring.all_gather(ch, o)

        return self.core.submit(name, desc, timeout, async_op, dst, run)

    def reduce_scatter(
        self,
        out: Buffer,
        buf: Buffer,
        op: ReduceOp | str,
        algorithm: str,
        async_op: bool,
        timeout: float | None,
    ) -> Work | None:
        name = "reduce_scatter"
        n = self.core.world_size
        op = as_op(op)
        src, dst = stage_in_out(buf, out, name)
        a, o = src.array, dst.array
        check_op_dtype(op, a.dtype)
        if a.size != n * o.size:
            raise ValueError(
                f"{name}: buf must hold world_size ({n}) x out.size ({o.size}) = "
                f"{n * o.size} elements, got {a.size}"
            )
        algorithm = "ring" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(SCATTER_GATHER), algorithm, name)
        desc = Descriptor(name, o.size, o.dtype.str, op.value, algorithm, None)
        r = self.core.rank

        def run(ch: Channel) -> None:
            scratch = a.copy()
            ring.reduce_scatter(ch, scratch, op)
            o[...] = scratch[r * o.size : (r + 1) * o.size]

        return self.core.submit(name, desc, timeout, async_op, dst, run)

    def barrier(self, async_op: bool, timeout: float | None) -> Work | None:
        desc = Descriptor("barrier", 0, "", None, "dissemination", None)
        core = self.core

        def run(ch: Channel) -> None:
            barrier_alg.barrier(ch)

        return core.submit(
            "barrier", desc, timeout, async_op, None, run, commit=False, own_commit=True
        )
