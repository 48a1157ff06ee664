"""The package's layers hold: every import of a golden_tasks module, parsed from the source (lazy imports inside
functions included), goes to its own layer or one below it in golden_tasks.LAYERS, the package's top holds
only its entry points, no module is over 450 lines, and a stage's name is spelled only in the stage table."""
import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import golden_tasks
from golden_tasks.model.outputs import Upstream
from golden_tasks.model.plan import FIELDS
from golden_tasks.pipeline.stage_table import STAGES, InReplay

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


NOT_A_STAGE = "# not a stage"  # marks a line whose word is something else (the golden function, a plan field)


def stage_literals(path: Path) -> list:
    """`path:line: 'name'` for every string constant in the file that spells a stage's name, outside lines marked
    NOT_A_STAGE (f-string parts included: they are constants too)."""
    names = {s.name.value for s in STAGES}
    lines = path.read_text().splitlines()
    return [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and node.value in names and NOT_A_STAGE not in lines[node.lineno - 1]]


def test_a_stage_name_is_spelled_only_in_the_stage_table():
    table = PACKAGE / "pipeline" / "stage_table.py"
    spelled = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != table for hit in stage_literals(path)]
    assert spelled == [], "name stages by StageName (golden_tasks.pipeline.stage_table):\n" + "\n".join(spelled)
    assert stage_literals(table), "the control: the table itself spells them"


def test_the_check_finds_a_stage_spelled_elsewhere():
    """The control: a report that reads entries["bench"] is found, and a marked line is not."""
    probe = PACKAGE / "reports" / "_stage_probe.py"
    probe.write_text('a = entries["bench"]\nb = {"golden": 1}  # not a stage: the golden function\n')
    try:
        assert [hit.rsplit(":", 1)[1] for hit in stage_literals(probe)] == [" 'bench'"]
    finally:
        probe.unlink()


def test_a_stage_is_declared_once_and_completely():
    """Every stage's module exists and has run(case, plan, workdir, upstream); what it reads precedes it; its
    plan fields are the plan's; each stage read by another has its Upstream field. Only an isolated stage loads
    the case (user code is never loaded beside the artifact), and no stage a replay runs does (its source may be
    gone)."""
    seen = set()
    for stage in STAGES:
        assert set(stage.reads) | set(stage.after) <= seen, stage.name
        seen.add(stage.name)
        assert set(stage.fields) <= set(FIELDS), stage.name
        assert not stage.loads_case or stage.isolated and stage.replay is not InReplay.RUN, stage.name
        params = list(inspect.signature(importlib.import_module(stage.module).run).parameters)
        assert params == ["case", "plan", "workdir", "upstream"], stage.module
    assert {n for s in STAGES for n in s.reads} == {f.name for f in dataclasses.fields(Upstream)}
