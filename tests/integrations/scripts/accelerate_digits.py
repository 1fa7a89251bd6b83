"""Hugging Face Accelerate on the digits, on CPU processes.

Accelerate's CPU path (PartialState._prepare_backend) names only "gloo" or "mpi": asked for
another backend (InitProcessGroupKwargs(backend="collectives")) it raises "Your assigned
backend collectives is not available, please use gloo". It does take a process group that is
already there, so the one setup line is the order: init_process_group("collectives") first,
then Accelerator(cpu=True). (Its PartialState.backend then still says "gloo"; the group every
operation goes through is the collectives one, which the script checks.)

    python -m collectives.launch --nproc 2 accelerate_digits.py --backend collectives --out p.npy
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader

import digits


def main() -> None:
    a = digits.args()
    digits.register_backend(a.backend)
    dist.init_process_group(a.backend)  # first: see the module's docstring
    accelerator = Accelerator(cpu=True)
    assert dist.get_backend() == a.backend, dist.get_backend()
    assert accelerator.num_processes == dist.get_world_size()
    torch.manual_seed(digits.SEED)
    loader = DataLoader(digits.dataset(), batch_size=a.batch, shuffle=True)
    model = digits.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = 0
    for x, y in loader:
        if steps == a.steps:
            break
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        opt.step()
        steps += 1
    losses = accelerator.gather(loss.detach().reshape(1))
    assert losses.shape == (accelerator.num_processes,), losses.shape
    accelerator.wait_for_everyone()
    print(
        f"rank {accelerator.process_index}: {steps} steps over {dist.get_backend()}, "
        f"losses {[round(float(v), 4) for v in losses]}",
        flush=True,
    )
    if accelerator.is_main_process:
        digits.save(accelerator.unwrap_model(model), a.out)
    accelerator.end_training()  # (destroys the process group)


if __name__ == "__main__":
    main()
