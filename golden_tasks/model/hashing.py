"""Content digests: xxh3-128 over bytes, files and canonical JSON."""
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import xxhash

if TYPE_CHECKING:
    import numpy
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

_CHUNK = 1 << 22


def digest_bytes(data: "Buffer | numpy.ndarray[Any, Any]") -> str:
    """Digest of any buffer-protocol object (bytes, memoryview, numpy array)."""
    # an ndarray is a buffer: numpy's type stubs say so (__buffer__) only from Python 3.12
    return xxhash.xxh3_128_hexdigest(cast("Buffer", data))


def digest_file(path: Path | str) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: object) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def digest_json(obj: object) -> str:
    return digest_bytes(canonical_json(obj).encode())
