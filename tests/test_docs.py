"""Docs that run: every fenced block of README.md and docs/**/*.md runs, in document order, in a
scratch project (tests/markdown_runner.py says how each language runs and which directives it reads).

Each document gets a fresh virtual environment first on PATH and a copy of this checkout installed
in it as the README's first command installs it (or an empty folder: `docs-test: project empty`).
The environment's `pip` installs into it with no index (the wheel this checkout builds is the only
package on offer), and its `doit` and `pytest` run under its python, so a document that installs
golden-tasks runs what it installed. The checkout copies share one cache:
the README, first, verifies the whole library cold, the other documents reuse it, and cache.md,
which collects unused entries, runs last.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_runner import DocFailure, problems, project_is_empty, run_doc
from project import ROOT, copy_checkout, fresh_venv

VENV = "python3 -m venv .venv && . .venv/bin/activate && "  # how the README's two commands start
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "cache.md"),
        ROOT / "docs" / "cache.md"]


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory) -> Path:
    """This checkout's wheel, built once: the package index of the documents' `pip install`."""
    dist = tmp_path_factory.mktemp("dist")
    source = copy_checkout(tmp_path_factory.mktemp("build") / "source")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(dist)], cwd=source,
                   check=True, capture_output=True)
    return dist


@pytest.fixture(scope="module")
def docs_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("docs-cache")


def scratch(tmp_path: Path, dist: Path, cache: Path, empty: bool) -> tuple:
    """(project, env) for one document. Its environment is the project's .venv, as the README's
    commands make and activate it (making it again over this one keeps what it holds)."""
    project = tmp_path / "project"
    if empty:
        project.mkdir()
    else:  # a checkout as the README's first command leaves it (installed, below)
        copy_checkout(project)
    venv = project / ".venv"
    python = fresh_venv(venv)
    shims = {"pip": f'exec "{sys.executable}" -m pip --python "{python}" "$@"',
             "doit": f'exec "{python}" -m doit "$@"',
             "pytest": f'exec "{python}" -m pytest "$@"',
             "golden-tasks": f'exec "{python}" -m golden_tasks.cli "$@"',
             "torchrun": f'exec "{python}" -m torch.distributed.run "$@"'}
    for name, line in shims.items():
        shim = venv / "bin" / name
        shim.write_text(f"#!/bin/sh\n{line}\n")
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOLDEN_TASKS_", "PIP_", "PYTHONPATH"))}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(venv), GOLDEN_TASKS_HTML="0",
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(dist), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_BUILD_ISOLATION="0")  # pip's inverted switch: "0" turns build isolation off (no index)
    if not empty:  # installed (editable) in the environment
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-build-isolation", "-e", str(project)], check=True, capture_output=True, env=env)
        env["GOLDEN_TASKS_CACHE"] = str(cache)  # the checkout copies share one cache, as a team would
    return project, env


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_doc_is_well_formed(doc):
    found = problems(doc, ROOT)
    assert not found, "\n".join(found)


@pytest.mark.e2e
@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_doc_runs(doc, tmp_path, built_dist, docs_cache):
    project, env = scratch(tmp_path, built_dist, docs_cache, project_is_empty(doc))
    try:
        run = run_doc(doc, project, env)
    except DocFailure as failure:
        raise pytest.fail.Exception(str(failure), pytrace=False) from None
    for line, reason in run.skipped:
        print(f"{doc.name}:{line}: skipped: {reason}")


# A broken document fails, naming its line.

def _broken(tmp_path, text: str, setup: dict = None) -> str:
    doc = tmp_path / "broken.md"
    doc.write_text(text)
    project = tmp_path / "project"
    project.mkdir()
    for name, content in (setup or {}).items():
        (project / name).write_text(content)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with pytest.raises(DocFailure) as failure:
        run_doc(doc, project, env)
    return str(failure.value)


def test_a_failing_command_fails_at_its_line(tmp_path):
    message = _broken(tmp_path, "# T\n\n```sh\ntrue\n```\n\n```console\n$ echo hi\nhi\n$ false\n```\n")
    assert message.startswith("broken.md:10:") and "`false` exited 1" in message


def test_a_python_block_that_raises_names_the_documents_line(tmp_path):
    message = _broken(tmp_path, "```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2\n```\n")
    assert message.startswith("broken.md:8:") and 'broken.md", line 8' not in message
    assert "line 8" in message and "AssertionError" in message


def test_a_drifted_excerpt_fails(tmp_path):
    text = "<!-- docs-test: excerpt lib.py -->\n```python\ndef f():\n    ...\n    return 2\n```\n"
    message = _broken(tmp_path, text, {"lib.py": "def f():\n    y = 1\n    return 1\n"})
    assert message.startswith("broken.md:5:") and "'return 2' is not a line of lib.py" in message


def test_a_pytest_selection_of_nothing_fails(tmp_path):
    text = "<!-- docs-test: collect -->\n```sh\npytest test_x.py -k nothing_has_this_name\n```\n"
    message = _broken(tmp_path, text, {"test_x.py": "def test_one():\n    pass\n"})
    assert message.startswith("broken.md:3:") and "selects no test" in message


def test_an_allowed_exit_status_does_not_hide_a_traceback(tmp_path):
    text = "<!-- docs-test: exit 1 -->\n```sh\npython -c 'raise SystemExit(1)'\n```\n\n" \
           "<!-- docs-test: exit 1 -->\n```sh\npython -c 'import nosuchmodule'\n```\n"
    message = _broken(tmp_path, text)
    assert message.startswith("broken.md:8:") and "printed a traceback" in message


def test_a_directive_on_the_wrong_language_fails(tmp_path):
    message = _broken(tmp_path, "<!-- docs-test: collect -->\n```python\nx = 1\n```\n")
    assert message.startswith("broken.md:1:") and "does not apply to a python block" in message


def test_a_directive_must_sit_right_before_its_block(tmp_path):
    message = _broken(tmp_path, '<!-- docs-test: exit 1 -->\n<!-- skip: next "why" -->\n```sh\nfalse\n```\n')
    assert message.startswith("broken.md:1:") and "right before the fenced block" in message


def test_a_misspelt_directive_an_unfenced_block_and_a_dead_link_are_problems(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("<!-- docs-tset: collect -->\n```sh\ntrue\n```\n\n    indented\n\n```\nbare\n```\n\n"
                   "[gone](missing.md) and [ok](d.md) and [web](https://example.org)\n"
                   "text <!-- docs-test: collect -->\n")
    found = problems(doc, tmp_path)
    assert [f.split(":")[1] for f in found] == ["6", "8", "12", "1", "13"], found
    assert "indented code block" in found[0] and "fenced as ''" in found[1] and "missing.md" in found[2]
    assert "not a directive" in found[3] and "inside a line is never read" in found[4]


def test_ci_runs_the_readmes_test_command():
    """The README's second command (the tests) is what CI runs; this suite does not run it itself."""
    readme = (ROOT / "README.md").read_text()
    command = readme.split("this is the test suite that runs this document", 1)[1].split("```sh\n", 1)[1].split("\n")[0]
    assert command.startswith(VENV) and "sh tests/setup.sh" in command
    assert command in (ROOT / ".ci" / "run").read_text()


def test_the_readmes_commands_make_and_use_a_virtual_environment():
    """Both commands set up a fresh machine inside a venv: a set-up that only works in a global
    site-packages cannot pass CI (which runs the second)."""
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("## Set up and run", 1)[1].split("## Everyday use", 1)[0].split("```sh\n")[1:]
    assert [block.split("\n")[0].startswith(VENV) for block in blocks] == [True, True], blocks
