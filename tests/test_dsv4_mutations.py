"""The DeepSeek-V4 flagship cases have teeth: realistic bugs in the kernels make `doit verify` FAIL.

Each mutant is a one-line edit of a kernel-side source line in a temporary copy
of the project (the edit must match exactly once, so a refactor cannot turn a
mutant into a silent no-op). The mutant must still run (dispatch succeeds)
and be caught by validation. Mutants run on the eager backend: what is under
test is the verification (goldens, comparators, tolerances), not the
compiler, and the cache shares the inputs and goldens across all of them.
"""
import re

import pytest
from project import ROOT, Project

MODULES = ("decode_attention", "sparse_attention", "compressor", "indexer")
SWA, HCA, CSA = "decode_swa", "decode_hca", "decode_csa"

# id: (module, line as written, the bug, cases it must fail)
MUTANTS = {
    "window_off_by_one": ("decode_attention", "< swa_lens[:, None])", "< swa_lens[:, None] - 1)", (SWA,)),
    "sink_dropped": ("sparse_attention", "o = o / (l + torch.exp(sink[None, :] - m))[..., None]",
                     "o = o / l[..., None]", (SWA, HCA, CSA)),
    "sink_not_shifted_by_max": ("sparse_attention", "torch.exp(sink[None, :] - m)", "torch.exp(sink[None, :])",
                                (SWA, HCA, CSA)),
    "scale_of_nope_dims": ("sparse_attention", "scale = q.shape[-1] ** -0.5", "scale = (q.shape[-1] - DIMS.rope) ** -0.5",
                           (SWA, HCA, CSA)),
    "rope_pairs_not_interleaved": ("sparse_attention", "even, odd = x[..., 0::2].float(), x[..., 1::2].float()",
                                   "even, odd = x[..., :half].float(), x[..., half:].float()", (SWA, HCA, CSA)),
    "inverse_rope_rotates_forward": ("sparse_attention", "tail = rotate_pairs(o[..., -rope:], cos, sin, inverse=True)",
                                     "tail = rotate_pairs(o[..., -rope:], cos, sin, inverse=False)", (SWA, HCA, CSA)),
    "head_groups_packed_transposed": ("sparse_attention", "o.reshape(tokens, groups, -1).transpose(0, 1)",
                                      "o.transpose(0, 1).reshape(groups, tokens, -1)", (SWA, HCA, CSA)),
    "scores_skip_rope_dims": ("sparse_attention", 's = torch.einsum("thd,tkd->thk", qf, k) * scale',
                              's = torch.einsum("thd,tkd->thk", qf[..., :-DIMS.rope], k[..., :-DIMS.rope]) * scale',
                              (SWA, HCA, CSA)),
    "rows_written_one_token_late": ("sparse_attention", "o_packed[:, :tokens].copy_(",
                                    "o_packed[:, 1:tokens + 1].copy_(", (SWA, HCA, CSA)),
    "tile_merge_without_rescale": ("sparse_attention", "l = old * l + new * p.sum(-1)", "l = l + new * p.sum(-1)",
                                   (HCA, CSA)),
    "kv_row_written_to_next_slot": ("decode_attention", "index_put_((slot_mapping.long(),), kv)",
                                    "index_put_((slot_mapping.long() + 1,), kv)", (HCA, CSA)),
    "compressed_rows_of_wrong_request_page": ("decode_attention", "req = torch.arange(slots.shape[0]) // chunk",
                                              "req = torch.arange(slots.shape[0]) % cmp_table.shape[0]", (HCA, CSA)),
    "compressed_tail_tile_unmasked": ("decode_attention", "slots < visible[:, None]", "slots >= 0", (HCA,)),
    "compressed_rows_ignore_position": ("decode_attention",
                                        "torch.minimum((position_ids.long() + 1) // ratio, kv_seq_lens[req].long() // ratio)",
                                        "kv_seq_lens[req].long() // ratio", (HCA,)),
    "stale_state_rows_at_boundary": ("compressor", "torch.where((q >= start)[..., None],",
                                     "torch.where((q > pos[:, None])[..., None],", (HCA, CSA)),
    "compressor_softmax_over_channels": ("compressor", "torch.where(present, score, float(\"-inf\")), dim=1)",
                                         "torch.where(present, score, float(\"-inf\")), dim=-1)", (HCA, CSA)),
    "rms_norm_sums_instead_of_mean": ("compressor", "pooled.pow(2).mean(-1, keepdim=True)",
                                      "pooled.pow(2).sum(-1, keepdim=True)", (HCA, CSA)),
    "ape_row_off_by_one": ("compressor", "ape[pos % ratio]", "ape[(pos + 1) % ratio]", (HCA, CSA)),
    "overlap_pools_swapped_halves": ("compressor", "kv = torch.cat([kv[:, :ratio, :head], kv[:, ratio:, head:]], dim=1)",
                                     "kv = torch.cat([kv[:, :ratio, head:], kv[:, ratio:, :head]], dim=1)", (CSA,)),
    "topk_missing_one_element": ("decode_attention", "freqs_sin, ratio, DIMS.chunk, DIMS.topk,",
                                 "freqs_sin, ratio, DIMS.chunk, DIMS.topk - 1,",
                                 (CSA,)),
    "indexer_scale_not_inverted": ("indexer", "q_scale = scale.reciprocal().float()", "q_scale = scale.float()", (CSA,)),
    "indexer_relu_dropped": ("indexer", "weights[..., None] * torch.relu(q_scale * dots)",
                             "weights[..., None] * (q_scale * dots)", (CSA,)),
    "indexer_cache_read_unpaged": ("indexer", "rows = torch.where(page >= 0, page * block + j % block, 0)",
                                   "rows = torch.where(page >= 0, j, 0)", (CSA,)),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("mutants"), MODULES)
    code, results, _, err = proj.doit("verify:decode_swa", "verify:decode_hca", "verify:decode_csa", "backend=eager")
    failed = {task: result for task, result in results.items() if result not in ("success", "up-to-date")}
    assert code == 0, (failed, [(proj.path / "runs" / f"{task.partition(':')[2]}.log").read_text()
                                for task in failed if (proj.path / "runs" / f"{task.partition(':')[2]}.log").exists()],
                       err)
    return proj


def test_every_flagship_case_has_eight_mutants():
    for case in (SWA, HCA, CSA):
        assert sum(case in cases for *_, cases in MUTANTS.values()) >= 8, case


def test_case_docs_name_the_mutants_that_exist():
    """docs/cases: each page's mutant table lists exactly its case's mutants; every `-k NAME` selects one."""
    for case in (SWA, HCA, CSA):
        text = (ROOT / "docs" / "cases" / f"{case}.md").read_text()
        table = text.split("## What the mutation test kills")[1].split("\n## ")[0]
        assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == {m for m, v in MUTANTS.items() if case in v[3]}
    for page in (ROOT / "docs" / "cases").glob("*.md"):
        for name in re.findall(r"test_dsv4_mutations\.py -k (\w+)", page.read_text()):
            assert name in MUTANTS, f"{page.name}: pytest -k {name} selects no mutant"


@pytest.mark.e2e
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_fails_verification(project, mutant):
    module, line, bug, cases = MUTANTS[mutant]
    project.edit(module, line, bug)
    try:
        code, results, report, err = project.doit("--continue", *[f"verify:{c}" for c in cases], "backend=eager")
    finally:
        project.restore(module)
    assert code != 0
    for case in cases:
        # the mutant ran: a crash would be caught, but says nothing about the verification
        assert results[f"dispatch:{case}"] in ("success", "up-to-date"), err
        assert results[f"validate:{case}"] == "fail", f"{mutant} survived {case}"
        error = next(t["error"] for t in report["tasks"] if t["name"] == f"validate:{case}")
        assert f"validation FAILED for {case}" in error
