"""hello_world: out = x + y, elementwise."""
import functools

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit

SHAPE = (48, 80)


@jit
def hello_world(x: In, y: In, out: Out):
    """out = x + y, written as x - (-1)·y so the kernel is not the golden's expression."""
    out.copy_(torch.sub(x, y, alpha=-1))


def add_torch(x: In, y: In, out: Out):
    """Baseline: torch's own add, into the output."""
    torch.add(x, y, out=out)


# what the kernel is compared with: torch's add, eager and compiled by AOTInductor (torch.compile's compiler)
BASELINES = {"torch": add_torch, "inductor": jit(add_torch)}


def golden_hello_world(t):
    """Reference: x + y in float32 (a single add is correctly rounded)."""
    t["out"].copy_(t["x"] + t["y"])


def specs(dtype):
    return [
        TensorSpec("x", SHAPE, dtype, init_value=torch.randn),
        TensorSpec("y", SHAPE, dtype, init_value=torch.randn),
        TensorSpec("out", SHAPE, dtype),
    ]


CASES = [
    # One correctly rounded fp32 add on both sides (negating y is exact): bit-exact.
    Case("hello_world", specs=functools.partial(specs, torch.float32), rtol=0.0, atol=0.0,
         baselines=BASELINES),
]
