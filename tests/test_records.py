"""The run record's types: one writer and one reader, which names what is wrong and where."""
import json

import pytest
from records import record, row, timing

from golden_tasks.model.records import BadRecord, CaseRow, RunRecord, Timing
from golden_tasks.model.verdicts import StageState, Verdict


def test_a_record_reads_back_as_written():
    written = record(row("a", keys={"abi": "0" * 32, "bench": None}), row("b", "FAIL", reason="bench: slow",
                                                                          errors={"bench": "slow\nvery"}))
    read = RunRecord.from_json(json.loads(json.dumps(written)))
    assert read.cases[0].status is Verdict.PASS and read.cases[0].stages["abi"] is StageState.RAN
    assert read.cases[0].kernel_timing == Timing(**timing(20.0, 0.01)) and read.cases[0].keys["bench"] is None
    assert RunRecord.from_json(json.loads(json.dumps(read.to_json()))) == read
    assert read.to_json()["passed"] is False and read.to_json()["counts"] == {"FAIL": 1, "PASS": 1}


def test_a_row_from_an_older_version_takes_the_defaults():
    """A record written before a field existed (no fingerprints, log, golden_protected) still reads."""
    old = RunRecord.from_json({"cases": [{"case": "a", "status": "SKIPPED", "skipped": "no GPU"}]})
    assert old.cases == [CaseRow(case="a", status=Verdict.SKIPPED, skipped="no GPU")]
    assert old.passed and old.started is None and old.cases[0].keys == {}


@pytest.mark.parametrize(("data", "message"), [
    ({"cases": {}}, "not a golden-tasks run record (runs/report.json): it has no list of cases"),
    ({"cases": [{"case": "a", "status": "PASS", "stage": {}}]},
     "cases[0].stage: not a field of CaseRow (it has case, status, stages,"),
    ({"cases": [{"case": "a"}]}, "cases[0]: missing status"),
    ({"cases": [{"case": "a", "status": "PASS", "stages": {"bench": "done"}}]},
     'cases[0].stages.bench: expected one of ran, cached, FAILED, -, skipped, got "done"'),
    ({"cases": [{"case": "a", "status": "PASS", "kernel_timing": {"median": 2.0, "rounds": 2.5}}]},
     "cases[0].kernel_timing.rounds: expected a count (an integer >= 0), got 2.5"),
    ({"cases": [{"case": "a", "status": "PASS", "kernel_timing": {"median": 2.0, "ranks": [{"median": -1}]}}]},
     "cases[0].kernel_timing.ranks[0].median: expected a finite number >= 0, got -1"),
    ({"cases": [{"case": "a", "status": "PASS", "warnings": "one"}]}, 'cases[0].warnings: expected a list, got "one"'),
    ({"cases": [{"case": 7, "status": "PASS"}]}, "cases[0].case: expected text, got 7"),
])
def test_a_wrong_field_is_named_where_it_is(data, message):
    with pytest.raises(BadRecord) as caught:
        RunRecord.from_json(data)
    assert str(caught.value).startswith(message)


def test_a_file_that_is_no_record_names_the_file(tmp_path):
    path = tmp_path / "report.json"
    path.write_text('{"cases": [{"case": "a", "status": "GREEN"}]}')
    with pytest.raises(BadRecord, match=f'^{path}: cases\\[0\\].status: expected one of FAIL, INCOMPLETE, SKIPPED, PASS'):
        RunRecord.read(path)
    with pytest.raises(BadRecord, match=f"^{tmp_path / 'none.json'}: cannot read it: No such file"):
        RunRecord.read(tmp_path / "none.json")


def test_the_noise_of_a_median():
    assert Timing(median=20.0, rounds=1, iqr=0.0).median_rse is None  # one round: unknown
    assert Timing(**timing(20.0, 0.01)).median_rse == pytest.approx(0.01)
    assert Timing(**timing(20.0, 0.01)).describe() == "20.00 ±1.0%"
