"""golden_tasks.model.origin: whose code a file is, both ways wrong being costly (user code taken for a library is
keyed by its version only; a library taken for user code is walked into). Folders made here stand for
the interpreter's: a site directory (site.getsitepackages), site trees and plain trees on sys.path, .pth
files, editable installs. tests/test_environments.py runs the same rules in real interpreters."""
import json
import os
import site
import sys
from pathlib import Path

import pytest

from golden_tasks.model import origin


def _file(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def fresh(monkeypatch):
    """origin with no project registered and its caches emptied before and after."""
    caches = (origin._library_tiers, origin._editable_sources, origin._user_folders, origin._classify)
    for cache in caches:
        cache.cache_clear()
    monkeypatch.setattr(origin, "_project", ())
    monkeypatch.delenv(origin.PROJECT_ENV, raising=False)
    yield monkeypatch
    for cache in caches:
        cache.cache_clear()


def test_a_site_tree_on_sys_path_is_library_a_plain_tree_is_user(fresh, tmp_path):
    tree = tmp_path / "tree"  # PYTHONPATH=tree: installed packages with their metadata
    _file(tree / "numlib-1.0.dist-info" / "METADATA", "Name: numlib\nVersion: 1.0\n")
    plain = tmp_path / "plain"  # PYTHONPATH=plain: somebody's sources
    for folder in (tree, plain):
        fresh.syspath_prepend(str(folder))
    assert not origin.is_user_file(_file(tree / "numlib" / "__init__.py"))
    assert origin.is_user_file(_file(plain / "helpers.py"))
    assert origin.is_user_file(_file(tmp_path / "treehouse" / "x.py"))  # a prefix of a name is not a folder


def test_a_link_is_classified_by_where_it_lies_and_where_it_points(fresh, tmp_path):
    tree = tmp_path / "tree"
    _file(tree / "numlib-1.0.dist-info" / "METADATA")
    real = _file(tree / "numlib" / "core.py")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "core.py").symlink_to(real)
    fresh.syspath_prepend(str(tree))
    assert not origin.is_user_file(tmp_path / "linked" / "core.py")


def test_the_project_is_user_code_but_a_virtual_environment_inside_it_is_not(fresh, tmp_path):
    project = tmp_path / "project"
    venv_site = project / ".venv" / "lib" / "python3" / "site-packages"
    _file(venv_site / "numlib-1.0.dist-info" / "METADATA")
    fresh.syspath_prepend(str(venv_site))
    fresh.syspath_prepend(str(project))
    origin.add_project(project, project / "kernels")
    assert os.environ[origin.PROJECT_ENV].split(os.pathsep) == [str(project), str(project / "kernels")]
    assert origin.is_user_file(_file(project / "kernels" / "attn.py"))
    assert origin.is_user_file(_file(project / "mylib" / "ops.py"))
    assert not origin.is_user_file(_file(venv_site / "numlib" / "core.py"))


def test_pth_linked_folders_are_library_but_editable_sources_and_the_project_are_user(fresh, tmp_path):
    site_dir = tmp_path / "site-packages"  # the interpreter's site directory, as site reports it
    linked, editable, project = tmp_path / "linked", tmp_path / "mylib" / "src", tmp_path / "project"
    for folder in (linked, editable, project):
        folder.mkdir(parents=True)
    _file(site_dir / "linked.pth", f"# a linked package tree\nimport os\n{linked}\n")
    _file(site_dir / "__editable__.mylib-0.1.pth", f"{editable}\n")
    _file(site_dir / "project.pth", f"{project}\n")  # a project put on sys.path by hand
    info = site_dir / "mylib-0.1.dist-info"
    _file(info / "METADATA", "Name: mylib\nVersion: 0.1\n")
    _file(info / "direct_url.json", json.dumps({"url": (tmp_path / "mylib").as_uri(), "dir_info": {"editable": True}}))
    for name, direct in (("archive", {"url": "file:///tmp/a.whl", "archive_info": {}}), ("odd", ["not", "a", "dict"])):
        _file(site_dir / f"{name}-1.0.dist-info" / "METADATA", f"Name: {name}\nVersion: 1.0\n")
        _file(site_dir / f"{name}-1.0.dist-info" / "direct_url.json", json.dumps(direct))  # not editable: ignored
    fresh.setattr(site, "getsitepackages", lambda: [str(site_dir)])
    for folder in (site_dir, linked, editable, project):
        fresh.syspath_prepend(str(folder))
    origin.add_project(project)
    assert not origin.is_user_file(_file(site_dir / "numlib" / "core.py"))
    assert not origin.is_user_file(_file(linked / "vendored" / "core.py"))
    assert origin.is_user_file(_file(editable / "mylib" / "ops.py"))
    assert origin.is_user_file(_file(project / "kernels" / "attn.py"))
    assert set(origin.library_dirs()) >= {str(site_dir), str(linked)}
    assert not {str(editable), str(project)} & set(origin.library_dirs())


def test_modules_by_name(fresh, tmp_path):
    fresh.syspath_prepend(str(tmp_path))
    _file(tmp_path / "usermod_origin.py", "X = 1\n")
    __import__("usermod_origin")
    try:
        assert origin.is_user_module("usermod_origin")
        assert not origin.is_user_module("golden_tasks.project.fingerprint")  # the pipeline's version keys it
        assert not origin.is_user_module("sys") and not origin.is_user_module("json")
        assert not origin.is_user_module("numpy") and not origin.is_user_module(None)
    finally:
        del sys.modules["usermod_origin"]
