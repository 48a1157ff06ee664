"""A fingerprint's parts, named (a function's body, each helper and constant it reaches), so that `explain`,
a replay and a stale plan can say what changed rather than only that something did."""
from ..model.hashing import digest_json
from .fingerprint import Fingerprinter


def parts(obj, fp: Fingerprinter = None) -> dict:
    """Named digests of what makes up a function's fingerprint: its body, and each
    global it reaches (helpers, constants), or the parts a `__fingerprint__` dict names.
    Lets `explain` name what changed. `fp`: the Fingerprinter that fingerprinted `obj`,
    whose memo then makes this cheap."""
    fp = fp or Fingerprinter()
    if hasattr(type(obj), "__fingerprint__"):
        _, _, token = fp.token(obj)  # ["custom", class, token of what __fingerprint__ returned]
        named = dict(token[1]) if token[0] == "dict" else {"value": token}
        return {str(k): digest_json(t) for k, t in named.items()}
    fn = getattr(obj, "fn", obj)  # a kernel form wraps its function
    token = fp.token(fn)
    if not (isinstance(token, list) and token and token[0] == "function"):
        return {"value": digest_json(token)}
    _, qualname, code, refs, *body = token
    out = {f"{qualname} (body)": digest_json([code, *body])}
    out.update({name: digest_json(t) for name, t in refs.items()})
    if fn is not obj:
        out["kernel settings"] = digest_json(fp.token({k: v for k, v in vars(obj).items() if k != "fn"}))
    return out


def changed_parts(old: dict, new: dict) -> list:
    """Names whose digest differs between two `parts` results (added and removed included)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
