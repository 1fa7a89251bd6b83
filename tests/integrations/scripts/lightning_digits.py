"""PyTorch Lightning on the digits: DDPStrategy(process_group_backend=...), metrics logged
with sync_dist=True (Lightning asks the backend for ReduceOp.AVG on them, an int64 batch-size
counter among them, unless the backend is named "gloo"), a validation loop (the sanity check
runs it first). Runs unchanged under Lightning's own launcher (devices=N from a plain
`python lightning_digits.py`), under torchrun and under `python -m collectives.launch`.

    python lightning_digits.py --backend collectives --devices 2 --out p.npy
"""

from __future__ import annotations

import os
import warnings

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Subset

import digits


class Digits(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = digits.model()
        self.loss = torch.nn.CrossEntropyLoss()

    def training_step(self, batch, i):
        x, y = batch
        loss = self.loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        acc = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    a = digits.args(lambda p: p.add_argument("--devices", type=int, default=2))
    digits.register_backend(a.backend)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    data = digits.dataset()
    train = DataLoader(Subset(data, range(1500)), batch_size=a.batch)
    val = DataLoader(Subset(data, range(1500, 1797)), batch_size=64)
    # Under torchrun or our launcher the world comes from the environment; under Lightning's
    # own launcher, from devices.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", a.devices))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        max_steps=a.steps,
        strategy=DDPStrategy(process_group_backend=a.backend),
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
        num_sanity_val_steps=2,
        use_distributed_sampler=True,
        deterministic=True,
    )
    model = Digits()
    trainer.fit(model, train, val)
    pg = torch.distributed.distributed_c10d._get_default_group()
    assert torch.distributed.get_backend(pg) == a.backend, torch.distributed.get_backend(pg)
    print(
        f"rank {trainer.global_rank}: {trainer.global_step} steps over {a.backend}, "
        f"train_loss {float(trainer.callback_metrics['train_loss']):.3f}",
        flush=True,
    )
    if trainer.global_rank == 0:
        digits.save(model.net, a.out)


if __name__ == "__main__":
    main()
