"""A worker of tests/system/test_launch_spares.py, started by `python -m collectives.launch`:
an ElasticTrainer on a tiny model (a member, or a joiner: a warm spare with --spares, a
replacement with --elastic). One JSON line on stdout per event, each with its time "t" and
this process's "pid":

  waiting  a joiner, everything imported, about to ask to be admitted ("spare": whether it is
           one)
  joined   in a group: rank, ws, gen, joiner
  step     after each step: step (the trainer's committed steps), rank, ws, gen, and "params"
           (sha256 of the model's parameters: equal on two processes means equal models)
  final    after fit(): step, ws, gen, params

The members hold at step GO_STEP until the file OUTDIR/go exists (the test makes it once the
spares wait), and, with HOLD_STEP, at that step until OUTDIR/more exists (the test makes it
once the spare the launcher starts after a death waits too), and take each step at most
every STEP_S seconds, so that a test's SIGKILL lands in the middle of the run. OP_TIMEOUT:
the group's op timeout. MAX_STEPS ends the run; AWAIT_WS=K: at the end the members wait
until K are back (a replacement the launcher starts after a death needs seconds to import).
"""

import hashlib
import json
import os
import sys
import time

import torch

import collectives as cl

OUTDIR = os.environ["SPARE_OUT"]
GO_STEP = int(os.environ.get("GO_STEP", "5"))
HOLD_STEP = int(os.environ.get("HOLD_STEP", "-1"))  # -1: no second hold
MAX_STEPS = int(os.environ.get("MAX_STEPS", "60"))
STEP_S = float(os.environ.get("STEP_S", "0.05"))
AWAIT_WS = int(os.environ.get("AWAIT_WS", "0"))
OP_TIMEOUT = float(os.environ.get("OP_TIMEOUT", "20"))
GO_TIMEOUT = float(os.environ.get("GO_TIMEOUT", "120"))
SPARE_TIMEOUT = 3600.0  # a spare waits to be admitted as long as the job runs
JOIN_TIMEOUT = 120.0


def emit(**event):
    event.update(t=time.time(), pid=os.getpid())
    sys.stdout.write(json.dumps(event) + "\n")  # one write: lines of two processes never mix
    sys.stdout.flush()


def params_sha256(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = torch.randint(0, 4, (256,))
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    joiner = "RANK" not in os.environ  # the launcher's spares and replacements
    spare = os.environ.get("COLLECTIVES_SPARE") == "1"
    if joiner:
        emit(event="waiting", spare=spare)
        pg = cl.init_process_group(join=True, timeout=SPARE_TIMEOUT if spare else JOIN_TIMEOUT)
        pg.timeout = OP_TIMEOUT  # the long deadline was for the admission wait only
    else:
        pg = cl.init_process_group(timeout=OP_TIMEOUT)
    emit(event="joined", rank=pg.rank, ws=pg.world_size, gen=pg.generation, joiner=joiner)
    last = [time.monotonic()]

    def on_step(tr):
        emit(
            event="step",
            step=tr.step,
            rank=tr.pg.rank,
            ws=tr.pg.world_size,
            gen=tr.pg.generation,
            params=params_sha256(model),
        )
        # the members of the first generation hold at GO_STEP; every member at HOLD_STEP
        for step, name, holds in ((GO_STEP, "go", not joiner), (HOLD_STEP, "more", True)):
            if tr.step != step or not holds:
                continue
            deadline = time.monotonic() + GO_TIMEOUT
            while not os.path.exists(os.path.join(OUTDIR, name)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {OUTDIR}/{name} within {GO_TIMEOUT} s")
                time.sleep(0.02)
        # pace: a step at most every STEP_S s (the test's kill must find the run going)
        pause = last[0] + STEP_S - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # not a wait: the pace of the steps
        last[0] = time.monotonic()

    trainer = cl.ElasticTrainer(
        model,
        optimizer,
        pg,
        (x, y),
        global_batch=32,
        epochs=10**6,
        progress=False,
        admit_every=5,
        on_step=on_step,
        joiner=joiner,
        max_steps=MAX_STEPS,
    )
    summary = trainer.fit()
    if AWAIT_WS and trainer.pg.world_size < AWAIT_WS and not joiner:
        # a replacement started after a death imports torch first: let it in to finish
        trainer.grow(AWAIT_WS, timeout=JOIN_TIMEOUT)
    pg = trainer.pg
    emit(
        event="final",
        step=summary["step"],
        ws=pg.world_size,
        gen=pg.generation,
        params=params_sha256(model),
    )
    try:
        pg.barrier()  # nobody leaves before every member is done
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
