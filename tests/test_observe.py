"""golden_tasks.project.observe: what planning read, told apart from what the import system read for it."""
import importlib
import os
import sys

from golden_tasks.project.observe import Observer


def test_reads_of_the_import_system_and_of_the_code_it_runs_are_told_apart(tmp_path, monkeypatch):
    """Importing a module lists its folder and opens its source: the import system's reads (a failed
    plan depends on the folders it searched). The module's own reads at import are the code's."""
    (tmp_path / "data.txt").write_text("2")
    (tmp_path / "tables").mkdir()
    (tmp_path / "observed_mod.py").write_text(
        "import os\nfrom pathlib import Path\n\nHERE = Path(__file__).parent\n"
        "SCALE = float((HERE / 'data.txt').read_text())\nTABLES = os.listdir(HERE / 'tables')\n"
        "SIZE = os.environ.get('GT_OBSERVED_SIZE')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "observed_mod", raising=False)
    with Observer() as observer:
        importlib.import_module("observed_mod")
    monkeypatch.delitem(sys.modules, "observed_mod")
    assert observer.files == {str(tmp_path / "data.txt")}
    assert observer.dirs == {str(tmp_path / "tables")}
    assert str(tmp_path) in observer.import_dirs and str(tmp_path / "tables") not in observer.import_dirs
    assert "GT_OBSERVED_SIZE" in observer.env and "PATH" not in observer.env
    assert os.environ.get("GT_OBSERVED_SIZE") is None  # read, and absent
