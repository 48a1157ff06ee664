"""What users and saved files name keeps working across golden-tasks' own reorganisations: a runtime dir
written before the modules moved into layered packages (tests/data/runtime_dir_before_layers, by golden_tasks.run
at commit ba79ae9: its manifest names golden_tasks.jit, its artifact's pickle golden_tasks.model.specs and its policy's
golden_tasks.model.compare) replays, and the documented import paths import."""
import json
import shutil
from pathlib import Path

from golden_tasks.pipeline import replay
from golden_tasks.project.toolchain import toolchain

SAVED = Path(__file__).parent / "data" / "runtime_dir_before_layers"


def saved_copy(tmp_path) -> Path:
    """The saved dir, with this machine's toolchain (written on another: only the modules' paths are under test)."""
    case_dir = tmp_path / "saved_scale"
    shutil.copytree(SAVED, case_dir)
    manifest = json.loads((case_dir / "manifest.json").read_text())
    assert manifest["artifact"]["module"] == "golden_tasks.jit" and manifest["format"] == 2
    manifest["toolchain"] = toolchain()
    (case_dir / "manifest.json").write_text(json.dumps(manifest))
    return case_dir


def test_a_runtime_dir_from_before_the_move_replays(tmp_path):
    result = replay.replay(saved_copy(tmp_path), tmp_path)
    assert result.passed, result.error
    assert result.report.max_abs == 0.0 and result.bench["rounds"] == 5
    assert result.stale == ["cannot check the source for staleness: the case was not defined in a kernel module "
                            "(golden_tasks.run): it has no source to compare"]


def test_its_data_is_still_checked(tmp_path):
    """The control: a saved golden edited by hand fails the replay."""
    case_dir = saved_copy(tmp_path)
    golden = case_dir / "data" / "golden" / "out.bin"
    golden.write_bytes(bytes(len(golden.read_bytes())))
    result = replay.replay(case_dir, tmp_path)
    assert not result.passed and "data/golden/out.bin: content does not match its recorded digest" in result.error
