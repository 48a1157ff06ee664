"""Verdicts and stage states are types that read and write as the words of the run record."""
import json

import pytest

from golden_tasks.model.records import RunRecord
from golden_tasks.model.verdicts import StageState, Verdict


def test_a_verdict_is_its_word_in_json_text_and_dict_keys():
    assert json.dumps({Verdict.PASS: [StageState.RAN, StageState.NOT_RUN]}) == '{"PASS": ["ran", "-"]}'
    assert f"{Verdict.SKIPPED:<8}|" == "SKIPPED |" and str(StageState.FAILED) == "FAILED"
    assert {StageState.CACHED: 1}["cached"] == 1 and {"FAIL": 2}[Verdict.FAIL] == 2
    assert Verdict(json.loads('"INCOMPLETE"')) is Verdict.INCOMPLETE


def test_a_misspelt_word_is_an_error_not_a_verdict():
    with pytest.raises(ValueError):
        Verdict("PASSED")
    with pytest.raises(ValueError):
        StageState("Cached")
    with pytest.raises(AttributeError):
        Verdict.PASSED  # noqa: B018


def test_severity_order_and_what_fails_a_run():
    assert list(Verdict) == [Verdict.FAIL, Verdict.INCOMPLETE, Verdict.SKIPPED, Verdict.PASS]
    assert [v.failed for v in Verdict] == [True, True, False, False]
    record = RunRecord.from_json({"cases": [{"case": f"c{i}", "status": s} for i, s in
                                            enumerate(("PASS", "INCOMPLETE", "SKIPPED", "PASS"))]})
    assert not record.passed
    assert list(record.counts.items()) == [("INCOMPLETE", 1), ("SKIPPED", 1), ("PASS", 2)]
    record.cases[1].status = Verdict.SKIPPED
    assert record.passed
    assert [s.reached for s in StageState] == [True, True, False, False, False]
