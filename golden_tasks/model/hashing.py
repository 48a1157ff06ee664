"""Content digests: xxh3-128 over bytes, files and canonical JSON."""
import json
from pathlib import Path

import xxhash

_CHUNK = 1 << 22


def digest_bytes(data) -> str:
    """Digest of any buffer-protocol object (bytes, memoryview, numpy array)."""
    return xxhash.xxh3_128_hexdigest(data)


def digest_file(path: Path | str) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def digest_json(obj) -> str:
    return digest_bytes(canonical_json(obj).encode())
