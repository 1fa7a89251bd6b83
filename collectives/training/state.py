"""The trainer state on the wire: a msgpack skeleton of the state dict plus one raw byte payload
holding every tensor (no pickle on the wire), for ElasticTrainer's re-synchronisation."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import torch


def encode_state(obj: Any) -> tuple[bytes, bytes]:
    tensors = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            tensors.append(o.detach().contiguous().reshape(-1))
            return {
                "__tensor__": len(tensors) - 1,
                "dtype": str(o.dtype).split(".")[-1],
                "shape": list(o.shape),
            }
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        if isinstance(o, (np.integer, np.floating)):
            return o.item()
        return o

    skeleton = walk(obj)
    parts = [t.view(torch.uint8).numpy().tobytes() if t.numel() else b"" for t in tensors]
    return msgpack.packb(skeleton), b"".join(parts)


def decode_state(header: bytes, payload: Any) -> dict:
    payload = np.asarray(payload, np.uint8)
    off = [0]

    def walk(o):
        if isinstance(o, dict) and "__tensor__" in o:
            dtype = getattr(torch, o["dtype"])
            shape = o["shape"]
            n = int(np.prod(shape)) if shape else 1
            nbytes = n * torch.empty(0, dtype=dtype).element_size()
            raw = torch.from_numpy(payload[off[0] : off[0] + nbytes].copy())
            off[0] += nbytes
            return raw.view(dtype).reshape(shape)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    return walk(msgpack.unpackb(header, strict_map_key=False))
