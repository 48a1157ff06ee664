"""Tensors in the store: raw little-endian bytes, with dtype and shape in the entry.

Stored without an intermediate copy (a contiguous tensor's memory is hashed
and written directly) and loaded by memory mapping.
"""
import torch

from .specs import dtype_name, dtype_of
from .store import Store


def put_tensor(store: Store, tensor: torch.Tensor) -> dict:
    data = tensor.detach().cpu().contiguous()
    raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b""
    return {**store.put_buffer(raw), "dtype": dtype_name(data.dtype), "shape": list(data.shape)}


def load_tensor(store: Store, record: dict) -> torch.Tensor:
    dtype, shape = dtype_of(record["dtype"]), tuple(record["shape"])
    if record["nbytes"] == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.from_file(str(store.object_path(record["digest"])), shared=False,
                           size=record["nbytes"], dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)
