"""Ray Train on the digits: TorchTrainer with 2 CPU workers and TorchConfig(backend=...), the
Gloo run and the collectives run one after the other in one Ray session.

Ray's workers are processes Ray starts; the backend must be registered in each before Ray's
TorchConfig calls init_process_group there. The one setup line is Ray's own hook for that:
runtime_env={"worker_process_setup_hook": "collectives.torch.register"} (without it Ray
says "Unknown backend type collectives"). Ray sets the root logger to INFO in its workers;
the library's per-op lines stay off all the same (its logger follows COLLECTIVES_DEBUG alone).

    python ray_digits.py --out-gloo g.npy --out p.npy
"""

from __future__ import annotations

import argparse
import os
import tempfile

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

HERE = os.path.dirname(os.path.abspath(__file__))


def train(config: dict) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import digits
    import ray.train.torch

    assert dist.get_backend() == config["backend"], dist.get_backend()
    torch.manual_seed(digits.SEED)
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(digits.dataset(), batch_size=32, shuffle=True), move_to_device=False
    )
    model = ray.train.torch.prepare_model(digits.model(), move_to_device=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(loader):
        if step == config["steps"]:
            break
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    if dist.get_rank() == 0:
        digits.save(model.module, config["out"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--out-gloo", required=True)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={
            "worker_process_setup_hook": "collectives.torch.register",
            "env_vars": {
                "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "OMP_NUM_THREADS": "1",
            },
        },
    )
    storage = tempfile.mkdtemp(prefix="ray_digits_")
    for backend, out in (("gloo", a.out_gloo), ("collectives", a.out)):
        trainer = TorchTrainer(
            train,
            train_loop_config={"backend": backend, "out": out, "steps": a.steps},
            scaling_config=ScalingConfig(
                num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}
            ),
            torch_config=TorchConfig(backend=backend, timeout_s=120),
            run_config=RunConfig(name=f"digits_{backend}", storage_path=storage),
        )
        trainer.fit()
        print(f"RAY_DONE {backend}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
