"""A worker for tests/system/test_elastic_cleanup.py: an ElasticTrainer on a tiny model and random
data that rejoins (init_process_group(join=True)) when it is evicted. One JSON line on stdout
per event; every step event counts the library's threads in this process, so a test can see
whether an evicted group's heartbeat and op threads outlived it.

ADMIT_EVERY (env): the trainer's admit_every; 0 means this rank never admits a joiner, so an
evicted peer that rejoins waits for admission until its JOIN_TIMEOUT.
MAX_STEPS (env, optional): the trainer's max_steps, so that fit() returns. HOLD=1: after fit()
the process stays (reporting "holding") until a signal ends it, instead of destroying its
group. SOLO_SLEEP: seconds per step while the group has one rank (default 0.05, as always),
so that a lone member does not run out of steps before an evicted peer is back.
Every event names the SIGTERM handler in place ("sigterm"), to see whether one was added.
"""

import json
import os
import signal
import threading
import time

import torch

import collectives as cl

JOIN_TIMEOUT = float(os.environ.get("JOIN_TIMEOUT", "60"))


def emit(**event):
    event["t"] = time.time()
    event["pid"] = os.getpid()
    print(json.dumps(event), flush=True)


def library_threads() -> dict:
    names = [t.name for t in threading.enumerate() if t.is_alive()]
    handler = signal.getsignal(signal.SIGTERM)
    return {
        "heartbeat": names.count("collectives-heartbeat"),
        "runner": sum(n.startswith("collectives-rank") for n in names),
        "sigterm": f"{getattr(handler, '__qualname__', handler)}@{id(handler):x}",
    }


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = torch.randint(0, 3, (64,))
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pg = cl.init_process_group(timeout=5.0)
    emit(event="started", **library_threads())

    def rejoin():
        emit(event="rejoining", **library_threads())
        new = cl.init_process_group(join=True, timeout=JOIN_TIMEOUT)
        new.timeout = 5.0  # the long deadline was for the admission wait only
        return new

    def on_step(tr):
        emit(
            event="step",
            step=tr.step,
            rank=tr.pg.rank,
            ws=tr.pg.world_size,
            gen=tr.pg.generation,
            **library_threads(),
        )
        # not a wait: a slow loop, two cores are shared with the test and others
        time.sleep(0.05 if tr.pg.world_size > 1 else float(os.environ.get("SOLO_SLEEP", 0.05)))

    trainer = cl.ElasticTrainer(
        model,
        optimizer,
        pg,
        (x, y),
        global_batch=8,
        epochs=10**6,
        progress=False,
        admit_every=int(os.environ["ADMIT_EVERY"]),
        on_step=on_step,
        rejoin=rejoin,
        max_steps=int(os.environ["MAX_STEPS"]) if "MAX_STEPS" in os.environ else None,
    )
    summary = trainer.fit()
    emit(event="final", left=summary["left"], step=summary["step"])
    if os.environ.get("HOLD") == "1":
        emit(event="holding", rank=trainer.pg.rank, gen=trainer.pg.generation, **library_threads())
        while True:
            time.sleep(0.1)
    try:
        trainer.pg.destroy()
    except cl.CollectiveError as exc:
        emit(event="destroy_error", error=str(exc))


if __name__ == "__main__":
    main()
