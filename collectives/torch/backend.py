"""torch.distributed backend "collectives": this library as a (pure Python) c10d process group.

    import collectives.torch                      # registers the backend (or call register())
    torch.distributed.init_process_group("collectives", init_method="env://", timeout=...)

How torch 2.13 drives a Python backend (distributed_c10d._new_process_group_helper):
  * `Backend.register_backend(name, creator, devices=[...])` stores `creator`; for a group on
    this backend torch calls `creator(prefix_store, group_rank, group_size, timeout)` and, since
    what it returns is a subclass of `torch.distributed.ProcessGroup`, uses that object itself
    as the group (the "Python process group" path torch's own test_c10d_pypg.py exercises).
  * Python code (dist.all_reduce, dist.reduce, ...) calls our methods directly by name, e.g.
    `group.allreduce([t], opts)`; C++ callers (DDP's reducer, its parameter broadcast and shape
    check) reach the ones the pybind trampoline forwards: allreduce, allgather, broadcast,
    barrier, reduce_scatter, send, recv and a few coalesced ones.
  * Every method returns a `torch.distributed.Work` subclass whose wait() and get_future()
    torch calls; the future's value is the list of output tensors, as Gloo's is.

Rendezvous: each rank binds a ZmqTransport and publishes its address_info() (msgpack) in the
c10d store torch hands us, then reads everyone else's, with the store's timeout. No extra port,
no coordinator: the job's own store (env://, tcp://, torchrun) is enough.

Threads: one executor thread per group runs the group's operations in issue order (every rank
numbers them the same way), each one blocking and bounded by the group's timeout (the
init_process_group timeout: torch has no watchdog for Python backends, the deadline is ours).
The executor completes the op's torch Future. A failed op completes it with the Python
exception (never with None: DDP's C++ reducer would take None for a tensor list and crash),
so future.wait(), work.wait() and DDP's backward raise it.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from datetime import timedelta

import msgpack
import torch
import torch.distributed as dist
from torch.futures import Future

from ..core.group import ProcessGroup as _ClProcessGroup
from ..core.errors import CollectiveError, CollectiveTimeout, PeerFailure
from ..core.ops import ReduceOp
from ..transport.zmq import ZmqTransport, local_ip_towards

log = logging.getLogger("collectives")

BACKEND_NAME = "collectives"
_KEY = "collectives/addr/{}"


# --- reduce ops ------------------------------------------------------------------------------
def _torch_op(opts) -> ReduceOp:
    """The library's ReduceOp for a torch ReduceOp (or an options object carrying one)."""
    op = getattr(opts, "reduceOp", opts)
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        if op == getattr(dist.ReduceOp, name):
            return ReduceOp[name]
    raise ValueError(f"the collectives backend does not support reduce op {op!r} "
                     "(supported: SUM, AVG, PRODUCT, MIN, MAX)")


# --- Work --------------------------------------------------------------------------------------
class _Work(dist.Work):
    """What our methods return to torch: wait() and get_future() over one queued _Op."""

    def __init__(self, op: "_Op"):
        super().__init__()
        self._op = op

    def wait(self, timeout: timedelta | None = None) -> bool:
        # The op itself has a deadline (the group timeout), so its future always completes; a
        # non-zero `timeout` from the caller only bounds this wait further.
        op = self._op
        op.start()
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if limit and limit > 0 and not _wait_done(op.future, limit):
            raise CollectiveError(f"{op.name}: Work.wait timed out after {limit:g} s "
                                  "(the operation is still running)", op=op.name)
        try:
            op.future.wait()
        except Exception:
            if op.error is not None:
                raise op.error from None   # the CollectiveError itself, not torch's wrapper
            raise
        return True

    def get_future(self) -> Future:
        self._op.start()   # whoever holds the future will wait on it: a posted recv must run
        return self._op.future

    def is_completed(self) -> bool:
        self._op.start()
        return self._op.future.done()

    def is_success(self) -> bool:
        return self._op.future.done() and self._op.error is None

    def exception(self):
        return self._op.error

    def result(self):
        self.wait()
        return self._op.future.value()


def _wait_done(fut: Future, limit: float) -> bool:
    done = threading.Event()
    fut.add_done_callback(lambda _f: done.set())
    return done.wait(limit)


# --- the executor --------------------------------------------------------------------------
class _Op:
    """One queued operation: the function to run and the torch Future that reports it.

    torch's Future.set_exception(exc) does not put the C++ future into an error state: it
    stores `exc` as the *value* and raises it only when Python unwraps it. DDP's C++ reducer
    reads that value as a tensor list and crashes the process. So the future handed to torch is
    a chained one, `source.then(_unwrap)`: when the op fails, _unwrap raises inside the chain,
    which torch records as a real C++ error -- value() and wait() raise it, in Python
    (RuntimeError naming the CollectiveError) and in C++ (DDP's backward raises). The original
    exception is kept in `error` so that Work.wait() can raise it with its own type.
    """

    __slots__ = ("name", "fn", "source", "future", "error", "post")
    _post_lock = threading.Lock()

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn
        self.source = Future()
        self.future = self.source.then(_unwrap)
        self.error: BaseException | None = None
        self.post = None    # for a deferred op: queues it (once), see _Executor.submit

    def start(self):
        """Queue a deferred op now (no-op for the others, and after the first call)."""
        with _Op._post_lock:
            post, self.post = self.post, None
        if post is not None:
            post()

    def succeed(self, value):
        self.source.set_result((True, [] if value is None else value))  # never None (DDP)

    def fail(self, exc: BaseException):
        if not isinstance(exc, Exception):   # KeyboardInterrupt etc. in the worker thread
            exc = CollectiveError(f"{self.name}: {exc!r}", op=self.name)
        self.error = exc
        self.source.set_result((False, exc))


def _unwrap(source: Future):
    ok, value = source.value()
    if not ok:
        raise value
    return value


class _Executor:
    """One thread running a group's ops in issue order; each op completes its torch Future."""

    def __init__(self, name: str):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.closed = False

    def submit(self, name: str, fn, deferred: bool = False) -> _Op:
        """Queue fn to run in issue order; deferred=True queues it only when its Work is
        first waited on or polled (a posted receive, see recv)."""
        op = _Op(name, fn)
        if deferred:
            op.post = lambda: self._enqueue(op)
        else:
            self._enqueue(op)
        return op

    def _enqueue(self, op: _Op):
        if self.closed:
            op.fail(CollectiveError(f"{op.name}: the process group was shut down", op=op.name))
        else:
            self._q.put(op)

    def _loop(self):
        broken = None   # the error that broke the group: later ops fail at once
        while True:
            op = self._q.get()
            if op is None:
                return
            if broken is not None:
                op.fail(CollectiveError(
                    f"{op.name}: not run, the group is broken since an earlier operation "
                    f"failed: {broken}", op=op.name, rank=broken.rank,
                    peer=broken.peer, generation=broken.generation))
                continue
            try:
                value = op.fn()
            except BaseException as exc:  # the future carries it to wait() / DDP
                if isinstance(exc, (CollectiveTimeout, PeerFailure)):
                    # A peer is dead or stuck: as after an NCCL watchdog timeout, the group
                    # is unusable; fail what is queued now rather than one timeout each.
                    broken = exc
                op.fail(exc)
            else:
                op.succeed(value)

    def stop(self, timeout: float):
        self.closed = True
        self._q.put(None)
        self._thread.join(timeout)
        # Anything still queued (the thread ended early or never got there) fails cleanly.
        while True:
            try:
                op = self._q.get_nowait()
            except queue.Empty:
                return
            if op is not None:
                op.fail(CollectiveError(f"{op.name}: the process group was shut down before "
                                        "this operation ran", op=op.name))


# --- rendezvous through the c10d store -------------------------------------------------------
def _store_host(store) -> str | None:
    """The host of the TCPStore under any PrefixStores, if there is one."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def _bind_host(store) -> str:
    explicit = os.environ.get("COLLECTIVES_BIND_HOST")
    if explicit:
        return explicit
    peer = os.environ.get("MASTER_ADDR") or _store_host(store)
    if not peer or peer == "localhost":
        return "127.0.0.1"
    return local_ip_towards(peer)


def connect(store, rank: int, size: int, timeout_s: float) -> _ClProcessGroup:
    """Bind a ZmqTransport, swap addresses through `store`, and return a collectives group."""
    t = ZmqTransport(rank, size, 0, transport=os.environ.get("COLLECTIVES_TRANSPORT", "auto"),
                     bind_host=_bind_host(store))
    try:
        store.set(_KEY.format(rank), msgpack.packb(t.address_info()))
        keys = [_KEY.format(r) for r in range(size)]
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception as exc:
            raise CollectiveError(f"rendezvous: rank {rank} timed out after {timeout_s:g} s "
                                  f"waiting in the c10d store for the addresses of all "
                                  f"{size} ranks ({exc})", op="rendezvous", rank=rank) from exc
        t.connect([msgpack.unpackb(store.get(k)) for k in keys])
    except BaseException:
        t.close()
        raise
    return _ClProcessGroup(t, timeout=timeout_s)


# --- peer death --------------------------------------------------------------------------------
class _PeerWatch:
    """Notices a dead peer long before the op timeout, as Gloo does from a closed connection.

    ZeroMQ hides connections, but a socket monitor reports them: when the connection to a
    peer drops and has not come back after `grace` seconds while this rank is inside a
    collective (or waiting on that peer), the transport is interrupted with PeerFailure, and
    the op in flight raises it at once. The grace covers a peer that finished its last op and
    exited normally: its final messages are already queued here and are read well within it.
    """

    def __init__(self, transport, grace: float = 2.0):
        import zmq
        self._zmq = zmq
        self.t = transport
        self.grace = grace
        self.monitors = {}                 # monitor socket -> peer
        for peer, sock in transport.dealers.items():
            mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            self.monitors[mon] = peer
        self.down: dict[int, float] = {}    # peer -> when its connection dropped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"collectives-peerwatch-rank{transport.rank}")
        self._thread.start()

    def _loop(self):
        from zmq.utils.monitor import recv_monitor_message
        zmq, t = self._zmq, self.t
        poller = zmq.Poller()
        for mon in self.monitors:
            poller.register(mon, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for mon, _ in poller.poll(100):
                    event = recv_monitor_message(mon)["event"]
                    peer = self.monitors[mon]
                    if event == zmq.EVENT_DISCONNECTED:
                        self.down.setdefault(peer, time.monotonic())
                    elif event == zmq.EVENT_CONNECTED:
                        self.down.pop(peer, None)
                now = time.monotonic()
                for peer, since in list(self.down.items()):
                    if now - since < self.grace or t.failure is not None:
                        continue
                    progress = t.progress()
                    if progress.in_op or progress.waiting_on == peer:
                        t.interrupt(PeerFailure(
                            f"rank {t.rank}: the connection to rank {peer} closed "
                            f"{now - since:.1f} s ago and did not come back (the process died "
                            "or left); the group is unusable", failed_ranks=[peer],
                            rank=t.rank, peer=peer, generation=t.generation))
        finally:
            for mon in self.monitors:
                mon.close(linger=0)

    def stop(self):
        """Stop watching. Call before the transport closes (its context waits for us).

        The monitors are switched off first, while the thread still reads our ends of their
        pipes: switching one off makes libzmq send a last event into its PAIR socket, and a
        PAIR send whose peer has already closed blocks for ever (seen: destroy_process_group
        hanging now and then on a loaded machine, when the thread had closed them first)."""
        for sock in self.t.dealers.values():
            try:
                sock.disable_monitor()
            except Exception:  # already closed
                pass
        self._stop.set()
        self._thread.join(5.0)


# --- the process group -------------------------------------------------------------------------
class CollectivesProcessGroup(dist.ProcessGroup):
    """torch.distributed.ProcessGroup over a collectives.ProcessGroup (ZeroMQ transport)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | float):
        super().__init__(rank, size)
        self._timeout_s = (timeout.total_seconds() if isinstance(timeout, timedelta)
                           else float(timeout))
        self._pg = connect(store, rank, size, self._timeout_s)
        self._watch = _PeerWatch(self._pg.transport) if size > 1 else None
        self._exec = _Executor(f"collectives-torch-rank{rank}")
        self._closed = False
        self._group_name = self._group_desc = ""

    # --- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # torch's C++ ProcessGroup keeps its name in its backends, and a Python group has none:
    # keep name and description here (abort and destroy of a subgroup look them up).
    def _set_group_name(self, name: str):
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str):
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def collectives_group(self) -> _ClProcessGroup:
        """The underlying collectives.ProcessGroup (for channel wrappers, tracing, tests)."""
        return self._pg

    def __repr__(self):
        return f"<CollectivesProcessGroup rank={self.rank()} size={self.size()}>"

    # --- plumbing ---------------------------------------------------------------------------
    def _run(self, name: str, fn) -> _Work:
        if self._closed:
            raise CollectiveError(f"{name}: the collectives process group was shut down",
                                  op=name, rank=self.rank())
        return _Work(self._exec.submit(name, fn))

    @staticmethod
    def _one(tensors, name):
        if len(tensors) != 1:
            raise ValueError(f"{name}: the collectives backend takes exactly one tensor per "
                             f"call, got {len(tensors)}")
        return tensors[0]

    # --- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg = self._pg

        def run():
            for t in tensors:
                pg.all_reduce(t, op=op)
            return tensors
        return self._run("all_reduce", run)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        pg = self._pg

        def run():
            for t in tensors:
                pg.broadcast(t, src=root)
            return tensors
        return self._run("broadcast", run)

    def reduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg = self._pg

        def run():
            for t in tensors:
                pg.reduce(t, dst=root, op=op)
            return tensors
        return self._run("reduce", run)

    def allgather(self, output_tensors, input_tensors, opts=None):
        n, pg = self.size(), self._pg
        for outs, inp in zip(output_tensors, input_tensors):
            _check_parts(outs, inp, n, "all_gather")

        def run():
            for outs, inp in zip(output_tensors, input_tensors):
                tmp = torch.empty((n, *inp.shape), dtype=inp.dtype)   # host staging
                pg.all_gather(tmp, inp.contiguous())
                for r in range(n):
                    outs[r].copy_(tmp[r])
            return output_tensors
        return self._run("all_gather", run)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def all_gather_single(self, output, input, opts=None):
        n, pg = self.size(), self._pg
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise ValueError(f"all_gather_into_tensor: output must hold world_size ({n}) x "
                             f"{input.numel()} elements of {input.dtype}, got "
                             f"{output.numel()} of {output.dtype}")

        def run():
            if output.is_contiguous():
                pg.all_gather(output.view(n, -1), input.contiguous())
            else:
                tmp = torch.empty((n, input.numel()), dtype=input.dtype)
                pg.all_gather(tmp, input.contiguous())
                output.copy_(tmp.view(output.shape))
            return [output]
        return self._run("all_gather_into_tensor", run)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        n, pg = self.size(), self._pg

        def run():
            for out, inp in zip(outputs, inputs):
                tmp = torch.empty((n, inp.numel()), dtype=inp.dtype)
                pg.all_gather(tmp, inp.contiguous())
                out.copy_(tmp.view(out.shape))
            return outputs
        return self._run("all_gather_into_tensor_coalesced", run)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        n, pg = self.size(), self._pg
        for out, ins in zip(output_tensors, input_lists):
            _check_parts(ins, out, n, "reduce_scatter")

        def run():
            for out, ins in zip(output_tensors, input_lists):
                buf = torch.cat([x.reshape(-1) for x in ins])
                _into(out, lambda o: pg.reduce_scatter(o, buf, op=op))
            return output_tensors
        return self._run("reduce_scatter", run)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        n, pg = self.size(), self._pg
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise ValueError(f"reduce_scatter_tensor: input must hold world_size ({n}) x "
                             f"{output.numel()} elements of {output.dtype}, got "
                             f"{input.numel()} of {input.dtype}")

        def run():
            _into(output, lambda o: pg.reduce_scatter(o, input.contiguous(), op=op))
            return [output]
        return self._run("reduce_scatter_tensor", run)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg = self._pg

        def run():
            for out, inp in zip(outputs, inputs):
                _into(out, lambda o, inp=inp: pg.reduce_scatter(o, inp.contiguous(), op=op))
            return outputs
        return self._run("reduce_scatter_tensor_coalesced", run)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists, input_tensors, opts=None):
        # Through all_gather (every rank receives everything): simple and correct; gather is
        # rare in training code. Non-roots pass empty output lists.
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        inp = self._one(input_tensors, "gather")
        if me == root:
            _check_parts(self._one(output_lists, "gather"), inp, n, "gather")

        def run():
            tmp = torch.empty((n, *inp.shape), dtype=inp.dtype)
            pg.all_gather(tmp, inp.contiguous())
            if me == root:
                for r in range(n):
                    output_lists[0][r].copy_(tmp[r])
            return output_lists
        return self._run("gather", run)

    def scatter(self, output_tensors, input_lists, opts=None):
        # The root broadcasts the concatenation; each rank keeps its own slice.
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        out = self._one(output_tensors, "scatter")
        if me == root:
            _check_parts(self._one(input_lists, "scatter"), out, n, "scatter")

        def run():
            if me == root:
                buf = torch.cat([x.reshape(-1) for x in input_lists[0]])
            else:
                buf = torch.empty(n * out.numel(), dtype=out.dtype)
            pg.broadcast(buf, src=root)
            k = out.numel()
            out.copy_(buf[me * k:(me + 1) * k].view(out.shape))
            return output_tensors
        return self._run("scatter", run)

    def barrier(self, opts=None):
        pg = self._pg
        return self._run("barrier", lambda: (pg.barrier(), [])[1])

    # --- point to point -----------------------------------------------------------------------
    # A send returns once the transport has the message (as Gloo's). A receive is posted when
    # issued -- its place among the messages from src_rank is fixed then -- but it takes the
    # group's (one-at-a-time) executor only when its Work is waited on or polled. So
    # `req = irecv(t, peer); send(x, peer); req.wait()` on both ranks works, as over Gloo.
    def send(self, tensors, dst_rank: int, tag: int = 0):
        t, pg = self._one(tensors, "send"), self._pg
        return self._run("send", lambda: (pg.send(t, dst_rank, tag=tag), tensors)[1])

    def recv(self, tensors, src_rank: int, tag: int = 0):
        t, pg = self._one(tensors, "recv"), self._pg
        if self._closed:
            raise CollectiveError("recv: the collectives process group was shut down",
                                  op="recv", rank=self.rank())
        posted = pg.recv(t, src_rank, tag=tag, async_op=True)   # a library DeferredWork
        return _Work(self._exec.submit("recv", lambda: (posted.wait(), tensors)[1],
                                       deferred=True))

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("the collectives backend has no recv from any source: "
                                  "pass src=")

    # --- lifecycle --------------------------------------------------------------------------
    def abort(self):
        """Stop now: an operation in flight raises, queued ones fail, sockets close."""
        if self._closed:
            return
        self._closed = True
        self._pg.transport.interrupt(CollectiveError(
            f"rank {self.rank()}: the collectives process group was aborted", op="abort",
            rank=self.rank()))
        self._exec.stop(timeout=5.0)
        self._close()

    def shutdown(self):
        """Finish queued operations (bounded by the timeout), then close sockets."""
        if self._closed:
            return
        self._closed = True
        self._exec.stop(timeout=self._timeout_s)
        self._close()

    def _close(self):
        if self._watch is not None:
            self._watch.stop()
        self._pg.destroy()

    def set_timeout(self, timeout: timedelta):
        self._timeout_s = timeout.total_seconds()
        self._pg.timeout = self._timeout_s


def _as_list(tensors):
    """torch's own groups accept pg.allreduce(tensor) as well as pg.allreduce([tensor])."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _check_parts(parts, whole, n, name):
    if len(parts) != n:
        raise ValueError(f"{name}: expected a list of world_size ({n}) tensors, got {len(parts)}")
    for r, p in enumerate(parts):
        if p.numel() != whole.numel() or p.dtype != whole.dtype:
            raise ValueError(f"{name}: tensor {r} has {p.numel()} elements of {p.dtype}; the "
                             f"collectives backend needs equal sizes ({whole.numel()} of "
                             f"{whole.dtype})")


def _into(out, fn):
    """Run fn(o) with o a contiguous tensor, then make sure the result is in `out`."""
    if out.is_contiguous():
        fn(out)
    else:
        tmp = out.contiguous()
        fn(tmp)
        out.copy_(tmp)


# --- registration ------------------------------------------------------------------------------
def _create(store, rank, size, timeout):
    return CollectivesProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Make "collectives" a torch.distributed backend (idempotent).

    devices includes "cuda": CUDA tensors are staged through host memory (buffers.py), so this
    can serve as the fallback group on a GPU machine without NCCL.
    """
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
