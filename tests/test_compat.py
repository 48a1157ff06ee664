"""A runtime dir written by an earlier golden-tasks whose module paths are gone (tests/data/runtime_dir_before_layers,
written by golden_tasks.run at commit ba79ae9, before the modules moved into layered packages: its manifest names
golden_tasks.jit) is refused by replay with a message saying to verify again: no alias keeps old paths importable.
Its pickles are read as opcodes, never loaded, to find what they name. The control, a runtime dir written now
replaying, is tests/test_replay.py's (doit's and golden_tasks.run's dirs)."""
import json
import shutil
from pathlib import Path

from golden_tasks.model.records import MANIFEST_FORMAT
from golden_tasks.pipeline import replay
from golden_tasks.project.toolchain import toolchain

SAVED = Path(__file__).parent / "data" / "runtime_dir_before_layers"


def saved_copy(tmp_path, module: str = None) -> Path:
    """The saved dir, with this machine's toolchain and this version's manifest format (written on another, by an
    earlier version: only the modules' paths are under test), its artifact's module renamed to `module` when
    given."""
    case_dir = tmp_path / "saved_scale"
    shutil.copytree(SAVED, case_dir)
    manifest = json.loads((case_dir / "manifest.json").read_text())
    assert manifest["artifact"]["module"] == "golden_tasks.jit" and manifest["format"] == 2
    manifest["toolchain"], manifest["format"] = toolchain(), MANIFEST_FORMAT
    manifest["artifact"]["module"] = module or manifest["artifact"]["module"]
    (case_dir / "manifest.json").write_text(json.dumps(manifest))
    return case_dir


def test_a_runtime_dir_naming_a_module_path_that_is_gone_is_refused(tmp_path):
    result = replay.replay(saved_copy(tmp_path), tmp_path)
    assert not result.passed
    assert "names golden_tasks.jit, which this golden-tasks no longer has" in result.error, result.error
    assert "verify the case again" in result.error


def test_a_pickle_naming_a_module_path_that_is_gone_is_refused(tmp_path):
    """The manifest's own module renamed to the current path: the artifact's pickle still names golden_tasks.specs."""
    result = replay.replay(saved_copy(tmp_path, "golden_tasks.forms.jit"), tmp_path)
    assert not result.passed
    assert "names golden_tasks.specs, which this golden-tasks no longer has" in result.error, result.error
