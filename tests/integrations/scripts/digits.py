"""What every integration script shares: scikit-learn's digits, a small MLP, the seed, and the
final parameters written where the test reads them (tests/integrations/)."""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from torch import nn

SEED = 1234


def args(extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="collectives", choices=("collectives", "gloo"))
    p.add_argument("--out", required=True, help="where rank 0 writes the final parameters")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    if extra:
        extra(p)
    return p.parse_args()


def dataset() -> torch.utils.data.TensorDataset:
    """The 1797 digits, 8x8 pixels scaled to [0, 1], as float32 features and int64 labels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.utils.data.TensorDataset(
        torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)
    )


def model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def save(module: nn.Module, path: str) -> None:
    """The parameters as one flat float64 array (np.save), written atomically."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])
    tmp = f"{path}.{os.getpid()}.tmp.npy"
    np.save(tmp, flat.numpy())
    os.replace(tmp, path)


def register_backend(backend: str) -> None:
    if backend == "collectives":
        import collectives.torch  # noqa: F401  (registers the backend)
