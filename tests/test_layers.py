"""The package's layers hold: every import of a golden_tasks module, parsed from the source (lazy imports inside
functions included), goes to its own layer or one below it in golden_tasks.LAYERS, the package's top holds
only its entry points, and no module is over 450 lines."""
import ast
from pathlib import Path

import golden_tasks

PACKAGE = Path(golden_tasks.__file__).parent
TOP = len(golden_tasks.LAYERS)  # the entry points at the package's top sit above every layer


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set:
    """The golden_tasks modules (or packages) the file imports, as dotted names."""
    name, found = module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("golden_tasks")}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if source.startswith("golden_tasks"):
                found |= {f"{source}.{a.name}" if (PACKAGE.parent / f"{source}.{a.name}".replace(".", "/")).with_suffix(
                    ".py").exists() else source for a in node.names}
    return found


def layer(dotted: str) -> int:
    parts = dotted.split(".")
    return golden_tasks.LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in golden_tasks.LAYERS else TOP


def test_every_import_points_down_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        for target in imported(path):
            if target != "golden_tasks" and layer(target) > layer(here):
                upward.append(f"{here} imports {target}")
    assert upward == []


def test_the_layers_are_the_packages_and_the_top_holds_only_entry_points():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(golden_tasks.LAYERS)
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "cli.py", "compare.py", "doit_tasks.py", "html_report.py", "triton.py"] and len(top) <= 8
    for layer_package in golden_tasks.LAYERS:  # each says what it owns and may import
        assert "Import" in (ast.get_docstring(ast.parse((PACKAGE / layer_package / "__init__.py").read_text())) or "")


def test_the_check_finds_an_upward_import(tmp_path, monkeypatch):
    """The control: a model module importing a front end is found."""
    bad = PACKAGE / "model" / "_upward_probe.py"
    bad.write_text("from ..frontends import cli\n")
    try:
        assert "golden_tasks.frontends.cli" in imported(bad) and layer("golden_tasks.frontends.cli") > layer(
            module_name(bad))
    finally:
        bad.unlink()


def test_no_module_is_over_450_lines():
    longest = max(PACKAGE.rglob("*.py"), key=lambda p: len(p.read_text().splitlines()))
    assert len(longest.read_text().splitlines()) <= 450, longest
