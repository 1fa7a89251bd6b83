"""What a sleeping receive costs on this machine: two processes ping-pong a 40-byte message
over a SOCK_SEQPACKET pair (as a fast link carries it), each side sleeping in a poll until
the other's message comes, as a small receive sleeps once its spin is over. Prints the round
trip and the calling thread's CPU per round trip, on whatever CPUs the scheduler gives:

    python bench/results/smallop/wakeup_cost.py [zmq|poll] [ROUNDS]
    taskset -c 0 python bench/results/smallop/wakeup_cost.py ...   # both on one CPU

zmq: the wait is a zmq.Poller over the link and a ROUTER (as Receiver.wait_peer polls);
poll: select.poll over the link alone; yield: no sleep, the link read again and again with
os.sched_yield between reads (as a small receive's spin reads where its host has fewer CPUs
than ranks: Receiver._spin)."""

import os
import select
import socket
import sys
import time

import zmq


def main(mode: str, rounds: int) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    me = a if pid else b
    (b if pid else a).close()
    me.setblocking(False)
    ctx = zmq.Context()  # made after the fork: each process its own
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc:///tmp/wakeup-cost-{os.getpid()}")
    if mode == "zmq":
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(me.fileno(), zmq.POLLIN)
    else:
        poller = select.poll()
        poller.register(me.fileno(), select.POLLIN)

    def recv() -> bytes:
        while True:
            try:
                return me.recv(100)
            except BlockingIOError:
                if mode == "yield":
                    os.sched_yield()
                else:
                    poller.poll(1000)

    msg = b"x" * 40
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(rounds):
        if pid:
            me.send(msg)
            recv()
        else:
            recv()
            me.send(msg)
    wall = (time.perf_counter() - w0) / rounds * 1e6
    cpu = (time.thread_time() - c0) / rounds * 1e6
    router.close(0)
    ctx.term()
    if pid:
        os.waitpid(pid, 0)
        print(f"{mode}: round trip {wall:.1f} us, cpu {cpu:.1f} us per round trip (one side)")
    else:
        os._exit(0)


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "zmq",
        int(sys.argv[2]) if len(sys.argv) > 2 else 3000,
    )
