"""Validate: every output against its golden, with the case's policy as the policy stage saved it (its
comparators user code by value: this stage runs isolated, and never imports the kernel module)."""
import dataclasses

from ..model.compare import Allclose, Policy, allclose
from ..model.outputs import Upstream, ValidateMeta, Worst
from ..model.rows import STACKED
from ..model.specs import unwritten
from . import Outputs, StageFailed
from .policy import saved_policy


def _wrong_ranks(policy: Policy, name: str, actual: dict, expected: dict) -> list:
    """The ranks whose slice of the stacked output `name` fails on its own. Judged only by a pointwise
    comparator (Allclose, the default), whose verdict on a slice means what it means on the whole."""
    if not isinstance(policy.compare.get(name, allclose), Allclose) or expected[name].dim() == 0:
        return []
    return [r for r in range(expected[name].shape[0]) if not policy.check_output(
        name, {**actual, name: actual[name][r]}, {**expected, name: expected[name][r]}).passed]


def not_written(actual: dict, expected: dict, blank, returned: str = None) -> list:
    """A message for each output of `blank` (those whose buffer started as the canary) in which the
    kernel left elements holding it, where the golden does not; `returned`: what the kernel returned
    that is none of its arguments (DispatchMeta), the likely cause then."""
    why = (f"the kernel returned {returned}: an Out is written in place, never returned (a launcher ported from "
           "Triton's tutorials allocates and returns its output: write into the Out parameter instead, passing it "
           "to the kernel)" if returned else
           "an Out has no initial content unless its spec declares one; the kernel must write every element, or, "
           "if it accumulates into its output, the spec must say init_value=torch.zeros")
    found = []
    for name in blank:
        left = unwritten(actual[name]) & ~unwritten(expected[name])
        if left.any():
            where = tuple(left.nonzero()[0].tolist())
            found.append(f"output {name!r}: {int(left.sum())} of {left.numel()} elements not written "
                         f"(first at {where}): {why}")
    return found


def worst(results: list, actual: dict, expected: dict, blank) -> Worst:
    """The Worst of a validation: the elements of each output that the kernel left unwritten (`blank`: the
    outputs that started as the canary, itself a NaN in a float), else made NaN or infinite where the
    golden's are finite, counted; the comparisons' largest finite absolute error (`results`)."""
    counts = {"unwritten": 0, "nan": 0, "inf": 0}
    for name, want in expected.items():
        got = actual.get(name)
        if got is None or got.shape != want.shape:  # the comparison says what is wrong with it
            continue
        left = unwritten(got) & ~unwritten(want) if name in blank else None
        counts["unwritten"] += int(left.sum()) if left is not None else 0
        if got.is_floating_point() or got.is_complex():
            written = ~left if left is not None else True
            counts["nan"] += int((got.isnan() & ~want.isnan() & written).sum())
            counts["inf"] += int((got.isinf() & want.isfinite() & written).sum())
    compared = [r.max_abs for r in results if r.total]
    return Worst(max_abs=max(compared) if compared else None, **counts)


def judge(policy: Policy, actual: dict, expected: dict, case: str, nonfinite: dict, placement=None,
          blank=(), returned: str = None) -> ValidateMeta:
    """The validation report; raises StageFailed naming every output the kernel left unwritten in part
    (`blank`: the outputs that started as the canary; `returned`: as not_written's), every mismatching
    output (for an output stacked by `placement`, name -> TensorSpec.resident as AbiMeta.placement holds
    it, the ranks whose slice is wrong), and every input that holds NaN/Inf (`nonfinite`: name ->
    description), a likely cause; where no input does and the kernel made NaN where the golden has
    none, a read past an input's end, which meets NaN there (the inputs lie between NaN guards)."""
    results = policy.check(actual, expected)
    failed = not_written(actual, expected, blank, returned)
    for r in results:
        if r.passed:
            continue
        stacked = (placement or {}).get(r.name) == STACKED
        ranks = _wrong_ranks(policy, r.name, actual, expected) if stacked else []
        where = (f"\n  wrong on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} "
                 f"(of {expected[r.name].shape[0]}: the leading dim is the rank)" if ranks else "")
        failed.append(r.message + where)
    if failed:
        found = worst(results, actual, expected, blank)
        causes = [f"note: input {name!r} holds {what}; it may propagate to the outputs"
                  for name, what in nonfinite.items()]
        if found.nan and not nonfinite:
            causes.append(f"note: the kernel's outputs hold {found.nan} NaN where the golden's are finite, and no "
                          "input holds one; every input lies between guard regions of NaN (-1 in an integer "
                          "tensor), so a read past an input's end (a load whose mask lets an index through) "
                          "is a likely cause, as is an overflow")
        raise StageFailed(f"validation FAILED for {case}:\n" + "\n".join(failed + causes), worst=found)
    return ValidateMeta(outputs=[r.to_json() for r in results], max_abs=max((r.max_abs for r in results), default=0.0))


def vacuous(policy: Policy, actual: dict, expected: dict) -> list:
    """A warning for each output whose comparison could not catch a kernel that writes zeros, or that
    writes one constant everywhere (the golden's first element): the policy itself judges such an
    output against the golden."""
    import torch  # noqa: PLC0415

    found = []
    for name, want in expected.items():
        fakes = {"zeros": torch.zeros_like(want)}
        if want.numel() > 1:
            first = want.reshape(-1)[0].item()
            fakes[f"the constant {first:g}" if not isinstance(first, bool) else f"the constant {first}"] = \
                torch.full_like(want, first)
        for what, fake in fakes.items():
            try:
                passed = policy.check_output(name, {**actual, name: fake}, expected).passed
            except Exception:  # noqa: BLE001 -- a comparator that cannot judge the fake output judges no kernel like it
                passed = False
            if passed:
                found.append(f"output {name!r}: a kernel writing {what} would pass its comparison "
                             "(vacuous: the golden is (almost) all within tolerance of it)")
                break
    return found


def blank(golden, inputs) -> list:
    """The outputs whose kernel buffer started as the canary: Outs with no initial content."""
    return [name for name in golden.tensors if name not in inputs.tensors]


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    dispatch, golden, inputs = upstream.dispatch, upstream.golden, upstream.inputs
    for read in (golden, dispatch):  # no golden, or no device to dispatch on
        if read.skipped:
            return Outputs(meta=ValidateMeta(skipped=read.skipped))
    policy = saved_policy(upstream.policy)
    unknown = sorted(set(policy.compare) - set(golden.tensors))
    if unknown:
        raise StageFailed(f"{plan.case}: compare names {', '.join(unknown)}, which are not outputs "
                          f"(outputs: {', '.join(golden.tensors)})")
    meta = judge(policy, dispatch.tensors, golden.tensors, plan.case, inputs.meta.nonfinite,
                 upstream.abi.meta.placement, blank(golden, inputs), dispatch.meta.returned)
    return Outputs(meta=dataclasses.replace(meta, warnings=vacuous(policy, dispatch.tensors, golden.tensors)))
