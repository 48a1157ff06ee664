"""Tensors in the store: raw little-endian bytes, with dtype and shape in the entry.

Stored without an intermediate copy (a contiguous tensor's memory is hashed
and written directly) and loaded by memory mapping (copy-on-write, so a stage
may write to what it loaded without touching the store).
"""
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from ..model.hashing import digest_bytes
from ..model.records import StoredTensor
from ..model.specs import dtype_name, dtype_of
from .store import Store

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


class _Placed(Protocol):
    """What on_device reads of an artifact (forms.Artifact): the device its tensor arguments must live on."""
    @property
    def device(self) -> str: ...


def _bytes(tensor: torch.Tensor) -> "Buffer":
    """The tensor's memory as a flat uint8 array, without copying a contiguous tensor."""
    # an ndarray exports the buffer protocol (numpy's stubs say so only from Python 3.12)
    return cast("Buffer", tensor.reshape(-1).view(torch.uint8).numpy()) if tensor.numel() else b""


def put_tensor(store: Store, tensor: torch.Tensor) -> StoredTensor:
    data = tensor.detach().cpu().contiguous()
    stored = store.put_buffer(_bytes(data))
    return StoredTensor(digest=stored.digest, nbytes=stored.nbytes, dtype=dtype_name(data.dtype),
                        shape=list(data.shape))


def map_raw(path: Path | str, record: StoredTensor, verify: bool = False) -> torch.Tensor:
    """A raw tensor file, memory-mapped copy-on-write.

    Raises ValueError when the file cannot be mapped or, with `verify`, when its
    bytes no longer match the recorded digest.
    """
    dtype, shape = dtype_of(record.dtype), tuple(record.shape)
    if record.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    try:
        flat = torch.from_file(str(path), shared=False, size=record.nbytes, dtype=torch.uint8)
    except RuntimeError as exc:  # missing or shorter than recorded
        raise ValueError(f"cannot be mapped ({exc})") from exc
    if verify and digest_bytes(flat.numpy()) != record.digest:
        raise ValueError("content does not match its digest (corrupted)")
    return flat.view(dtype).reshape(shape)


def load_tensor(store: Store, record: StoredTensor) -> torch.Tensor:
    """The stored tensor, memory-mapped and re-hashed."""
    return map_raw(store.object_path(record.digest), record, verify=True)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two tensors of one dtype and shape (a NaN equals itself)."""
    return a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


def on_device(artifact: _Placed, args: list[Any]) -> list[Any]:
    """The arguments with every tensor on the artifact's device (the same tensor when already there)."""
    return [a.to(artifact.device) if hasattr(a, "to") else a for a in args]


def back_to_host(args: list[Any], moved: list[Any]) -> None:
    """Copy what the kernel left in its device arguments back into `args` (In tensors too, so that
    a write to one is seen)."""
    for arg, result in zip(args, moved):
        if result is not arg:
            arg.copy_(result)
