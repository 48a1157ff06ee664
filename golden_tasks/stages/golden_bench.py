"""Golden bench: time the golden on the inputs, as the benchmark times the kernel (plan.BenchSettings), for
the report's speedup. InOut arguments are restored before every round, so each round does the same work.
"""
from ..model.outputs import Meta, Stats, Upstream
from . import BenchSettings, Outputs, cache_flush, measure
from .golden import NO_GOLDEN, arguments


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi, inputs = upstream.abi, upstream.inputs
    if case.golden_from is not None:
        return Outputs(meta=Meta(skipped="its golden comes from a data directory"))
    if case.golden is None:
        return Outputs(meta=Meta(skipped=NO_GOLDEN))
    rule = BenchSettings(**plan.bench)
    args = arguments(case, plan.seed, abi, inputs)
    initial = {name: inputs.tensors[name] for name in args if name in inputs.tensors}
    flush = cache_flush("cpu") if rule.flush else None

    def before(_):
        for name, tensor in initial.items():
            args[name].copy_(tensor)
        if flush:
            flush()

    return Outputs(stats=Stats(golden_us=measure(lambda: case.golden(args), rule, before)))
